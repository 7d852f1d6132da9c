-- save_reply: store the AI's reply on the batch before anything is sent, as the lock holder.
--
-- KEYS[1] stats        HASH: counters
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2..] turns[person, token, reply]  each turn's person, lock token and reply text
--
-- Returns one element per turn: 1 when its reply is now the batch's, the reply stored earlier
-- when there was one (a resumed turn never asks the AI again, and never replaces what it may
-- already have partly sent), false when the token does not hold the lock. (The worker saves
-- the replies of one tenant that meet in a round with one call, shared/storage/group_commit.py
-- `submit_grouped`: the call's cost and the `replies` count paid once for them all.)
--
-- uses: lib/keys.lua (conv_key, BATCH, LOCK)
local prefix = ARGV[1]
local saved, stored = {}, 0
for i = 2, #ARGV, 3 do
  local person, token = ARGV[i], ARGV[i + 1]
  if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then
    saved[#saved + 1] = false
  else
    local bkey = conv_key(prefix, person, BATCH)
    if redis.call('HSETNX', bkey, 'reply', ARGV[i + 2]) == 1 then
      stored = stored + 1
      saved[#saved + 1] = 1
    else
      saved[#saved + 1] = redis.call('HGET', bkey, 'reply')
    end
  end
end
if stored > 0 then redis.call('HINCRBY', KEYS[1], 'replies', stored) end
return saved
