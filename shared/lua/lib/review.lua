-- Storing and removing review items: the one way a script puts something on the tenant's
-- review list or takes it off, so the list's index (what the ops page reads one page of) and
-- its counts per reason never get out of step with it.
--
-- With a review webhook configured (REVIEW_WEBHOOK_URL) the item's notification is queued in
-- the same call, so no item exists without its notification (worker/fleet/review_notifier.py sends
-- it; docs/operating.md#being-told). Every script that creates review items calls this, with
-- the tenant's notification queue key as an ARGV entry (shared/storage/script_calls.py: `"" when no
-- webhook is configured`: nothing is queued then).
--
-- The index (shared/keys.py, `review_ix`...): each item is the member "<ms, 16 digits>:<id>"
-- (score 0) of the tenant's time index, of its reason's and of its person's, so BYLEX ranges
-- read a page in time order, then id order; `of` maps the id back to its entries (JSON
-- {at, reason, person}), `n` counts per reason.
--
-- uses: none

-- The notifications' hash is the queue's key plus this suffix (spelled in shared/keys.py).
local NOTIFY_EVENTS = '{{NOTIFY_EVENTS}}'
local REVIEW_IX, REVIEW_IX_REASON = '{{REVIEW_IX}}', '{{REVIEW_IX_REASON}}'
local REVIEW_IX_PERSON = '{{REVIEW_IX_PERSON}}'
local REVIEW_IX_OF, REVIEW_COUNTS = '{{REVIEW_IX_OF}}', '{{REVIEW_COUNTS}}'

-- The index keys of the review hash `review_key`: time index, its `of` hash, counts.
local function review_ix_keys(review_key)
  local ix = review_key .. ':' .. REVIEW_IX
  return ix, ix .. ':' .. REVIEW_IX_OF, ix .. ':' .. REVIEW_COUNTS
end

local function review_ix_reason(review_key, reason)
  return review_key .. ':' .. REVIEW_IX .. ':' .. REVIEW_IX_REASON .. ':' .. reason
end

local function review_ix_person(review_key, person)
  return review_key .. ':' .. REVIEW_IX .. ':' .. REVIEW_IX_PERSON .. ':' .. person
end

-- Take item `item_id` out of the index and the counts; 1 if it was indexed.
local function unindex_review_item(review_key, item_id)
  local ix, of, counts = review_ix_keys(review_key)
  local raw = redis.call('HGET', of, item_id)
  if not raw then return 0 end
  local entry = cjson.decode(raw)
  local member = entry.at .. ':' .. item_id
  redis.call('ZREM', ix, member)
  redis.call('ZREM', review_ix_reason(review_key, entry.reason), member)
  redis.call('ZREM', review_ix_person(review_key, entry.person), member)
  redis.call('HDEL', of, item_id)
  if redis.call('HINCRBY', counts, entry.reason, -1) <= 0 then
    redis.call('HDEL', counts, entry.reason)
  end
  return 1
end

-- Index item `item_id` of `person` (parked at `ms`, for `reason`), replacing an entry it had.
local function index_review_item(review_key, item_id, person, reason, ms)
  unindex_review_item(review_key, item_id)
  local ix, of, counts = review_ix_keys(review_key)
  local at = string.format('%016d', math.max(0, math.floor(tonumber(ms) or 0)))
  local member = at .. ':' .. item_id
  redis.call('ZADD', ix, 0, member)
  redis.call('ZADD', review_ix_reason(review_key, reason), 0, member)
  redis.call('ZADD', review_ix_person(review_key, person), 0, member)
  redis.call('HSET', of, item_id, cjson.encode({at = at, reason = reason, person = person}))
  redis.call('HINCRBY', counts, reason, 1)
end

-- Store `item` (its JSON) as review item `item_id` of `person`, index it, count it as
-- review:<reason>, and queue its notification, due at once, on `notify_key` ("" or nil: no
-- webhook, nothing queued). An id already queued and not yet sent is queued once: one item
-- id, one event.
local function add_review_item(review_key, stats_key, notify_key, item_id, item, person, reason,
    now)
  redis.call('HSET', review_key, item_id, item)
  index_review_item(review_key, item_id, person, reason, now)
  redis.call('HINCRBY', stats_key, 'review:' .. reason, 1)
  if notify_key == nil or notify_key == '' then return end
  local event = cjson.encode({item = item, created_ms = now, attempts = 0})
  if redis.call('HSETNX', notify_key .. ':' .. NOTIFY_EVENTS, item_id, event) == 1 then
    redis.call('ZADD', notify_key, now, item_id)
  end
end

-- Remove review item `item_id` and its index entries; 1 if it was there.
local function remove_review_item(review_key, item_id)
  unindex_review_item(review_key, item_id)
  return redis.call('HDEL', review_key, item_id)
end
