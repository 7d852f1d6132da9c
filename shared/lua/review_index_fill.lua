-- review_index_fill: index review items the previous release parked (it kept no index), a
-- bounded step at a time (shared/ops/review_index.py): HSCAN the review hash from the cursor
-- kept in `fill`, index each item not indexed yet (lib/review.lua), keep the next cursor.
-- Idempotent: an item already indexed is left as it is, so a step repeated or two processes
-- filling at once change nothing twice; items added meanwhile are indexed by the script that
-- adds them.
--
-- KEYS[1] review       HASH: batch id -> review item
-- KEYS[2] review_ix_fill  STRING: the HSCAN cursor of the fill under way ("0" or none: start)
-- ARGV[1] count        the HSCAN COUNT of this step
--
-- Returns {cursor, indexed}: cursor "0" when the pass is complete.
--
-- uses: lib/review.lua (review_ix_keys, index_review_item)
local cursor = redis.call('GET', KEYS[2]) or '0'
local found = redis.call('HSCAN', KEYS[1], cursor, 'COUNT', tonumber(ARGV[1]))
local _, of = review_ix_keys(KEYS[1])
local indexed = 0
local pairs_found = found[2]
for i = 1, #pairs_found, 2 do
  local item_id, raw = pairs_found[i], pairs_found[i + 1]
  if redis.call('HEXISTS', of, item_id) == 0 then
    local ok, item = pcall(cjson.decode, raw)
    local reason, person, at = 'unknown', '', 0
    if ok and type(item) == 'table' then
      if type(item.reason) == 'string' and item.reason ~= '' then reason = item.reason end
      if type(item.person) == 'string' then person = item.person end
      at = tonumber(item.reviewed_ms) or 0
    end
    index_review_item(KEYS[1], item_id, person, reason, at)
    indexed = indexed + 1
  end
end
if found[1] == '0' then
  redis.call('DEL', KEYS[2])
else
  redis.call('SET', KEYS[2], found[1], 'EX', 3600)
end
return {found[1], indexed}
