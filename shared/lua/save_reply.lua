-- save_reply: store the AI's reply on the batch before anything is sent, as the lock holder.
--
-- KEYS[1] stats        HASH: counters
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] token        the lock token of the turn
-- ARGV[4] reply        the reply text
--
-- Returns the reply the batch holds: ARGV[4], or the one stored earlier (a resumed turn never
-- asks the AI again, and never replaces what it may already have partly sent); false when the
-- token does not hold the lock.
--
-- uses: lib/keys.lua (conv_key, BATCH, LOCK)
local prefix, person, token = ARGV[1], ARGV[2], ARGV[3]
if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return false end
local bkey = conv_key(prefix, person, BATCH)
if redis.call('HSETNX', bkey, 'reply', ARGV[4]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'replies', '1')
  return ARGV[4]
end
return redis.call('HGET', bkey, 'reply')
