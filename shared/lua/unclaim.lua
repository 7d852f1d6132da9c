-- unclaim: hand back the batches that claim calls locked for a worker that never got their
-- answer (Redis froze or was too slow, so the call timed out at the worker yet ran in Redis).
-- No turn ever held those tokens: the worker learns a token only from the claim's answer. So
-- the batch is due again at once rather than after its whole lease, and no two turns of one
-- person can overlap (invariant 3, docs/invariants.md).
--
-- KEYS[1] running      ZSET: person -> when the running turn's lease ends (ms)
-- KEYS[2] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[3] stats        HASH: counters
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] answer_by_ms  the latest `answer_by_ms` of those claim calls (claim.lua): before it,
--         one of them may still run and lock a batch after this call; 0 when none was set
-- ARGV[3..] token_prefixes  the `token_prefix` of each claim call whose answer never came
--
-- Returns how many batches were handed back (stats `unclaimed`), or -1 when Redis's clock has
-- not passed answer_by_ms yet (nothing done: call again later).
--
-- uses: lib/keys.lua (conv_key, LOCK)
-- uses: lib/clock.lua (now_ms)
local prefix, answer_by = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
if answer_by > 0 and now <= answer_by then return -1 end
local handed = 0
for _, person in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local lock = conv_key(prefix, person, LOCK)
  local token = redis.call('GET', lock)
  if token then
    for i = 3, #ARGV do
      -- A claim's tokens are token_prefix .. ':' .. n (claim.lua).
      local mine = ARGV[i] .. ':'
      if string.sub(token, 1, #mine) == mine then
        redis.call('DEL', lock)
        redis.call('ZREM', KEYS[1], person)
        redis.call('ZADD', KEYS[2], now, person)
        handed = handed + 1
        break
      end
    end
  end
end
if handed > 0 then redis.call('HINCRBY', KEYS[3], 'unclaimed', handed) end
return handed
