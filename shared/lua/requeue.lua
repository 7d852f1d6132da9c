-- requeue: turn a review item back into a fresh batch (attempt 0), due now. A person asked
-- the AI to answer: the person's pause (a human takeover, lib/human.lua) is lifted with it.
--
-- KEYS[1] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[2] review       HASH: batch id -> review item
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] item_id      the review item's id
-- ARGV[3] person
-- ARGV[4] messages     the item's messages (JSON array, as in the item)
-- ARGV[5] context      the item's context (the reactions, edits, ... its batch had taken: a
--         JSON array; "" for none), given back to the fresh batch
--
-- Returns 1; 0 when the item is gone; -1 when the person has a batch in flight (the
-- requeued messages are older than it, so they must wait to keep the person's order).
--
-- uses: lib/keys.lua (conv_key, BATCH, HUMAN)
-- uses: lib/clock.lua (now_ms)
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then return 0 end
local bkey = conv_key(ARGV[1], ARGV[3], BATCH)
if redis.call('EXISTS', bkey) == 1 then return -1 end
local now = now_ms()
redis.call('HSET', bkey, 'id', ARGV[2] .. '-r' .. now, 'person', ARGV[3], 'attempt', 0,
  'created_ms', now, 'messages', ARGV[4], 'requeued', 1)
if ARGV[5] ~= '' then redis.call('HSET', bkey, 'context', ARGV[5]) end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('DEL', conv_key(ARGV[1], ARGV[3], HUMAN))
redis.call('ZADD', KEYS[1], now, ARGV[3])
return 1
