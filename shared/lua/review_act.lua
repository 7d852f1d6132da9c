-- review_act: requeue or drop review items, each in one step with its index entries
-- (lib/review.lua). Requeue turns an item back into a fresh batch (attempt 0), due now: a
-- person asked the AI to answer. Drop says a person dealt with it. Either lifts the pause the
-- review itself set (lib/human.lua, lift_review_pause), never a pause a person set (a reply
-- by hand, the ops page's pause, an echo): the bot must not talk over a person. One call takes
-- a chunk of items (a bulk action of the ops page: bounded by the caller), each on its own.
--
-- KEYS[1] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[2] running      ZSET: person -> when the running turn's lease ends (ms)
-- KEYS[3] review       HASH: batch id -> review item
-- KEYS[4] stats        HASH: counters (human_resumes)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] action       "requeue" | "drop"
-- ARGV[3..] items[item_id, person, messages, context]  requeue: the item's messages (JSON
--         array, as in the item) and context (the reactions, edits, ... its batch had taken:
--         a JSON array, "" for none), given to the fresh batch; drop: "" for both
--
-- Returns one code per item, in order: 1 done, 2 done and messages of the person are due now
-- (drop lifted a review's pause; the caller relays the tenant to a worker, as after every
-- requeue), 0 the item is gone, -1 (requeue) the person has a batch in flight (the requeued
-- messages are older than it, so they must wait to keep the person's order).
--
-- uses: lib/keys.lua (conv_key, BATCH)
-- uses: lib/clock.lua (now_ms)
-- uses: lib/review.lua (remove_review_item)
-- uses: lib/human.lua (lift_review_pause, make_due_after_resume)
local prefix, action = ARGV[1], ARGV[2]
local now = now_ms()
local codes = {}
for i = 3, #ARGV, 4 do
  local item_id, person, messages, context = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local code = 1
  if redis.call('HEXISTS', KEYS[3], item_id) == 0 then
    code = 0
  elseif action == 'requeue' then
    local bkey = conv_key(prefix, person, BATCH)
    if redis.call('EXISTS', bkey) == 1 then
      code = -1
    else
      redis.call('HSET', bkey, 'id', item_id .. '-r' .. now, 'person', person, 'attempt', 0,
        'created_ms', now, 'messages', messages, 'requeued', 1)
      if context ~= '' then redis.call('HSET', bkey, 'context', context) end
      remove_review_item(KEYS[3], item_id)
      lift_review_pause(prefix, person, now)
      -- Due now; a person's pause kept moves it to the pause's end at the next claim.
      redis.call('ZADD', KEYS[1], now, person)
    end
  elseif action == 'drop' then
    remove_review_item(KEYS[3], item_id)
    if person ~= '' and lift_review_pause(prefix, person, now) == 1 then
      redis.call('HINCRBY', KEYS[4], 'human_resumes', 1)
      code = 1 + make_due_after_resume(prefix, person, KEYS[1], KEYS[2], now)
    end
  else
    return redis.error_reply('review_act: unknown action ' .. tostring(action))
  end
  codes[#codes + 1] = code
end
return codes
