-- renew: extend the leases of turns that are still running, only for their holder.
--
-- KEYS[1] running      ZSET: person -> when the running turn's lease ends (ms)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] lease_ms     the new lease, from now
-- ARGV[3..] turns[person, token]  each turn to renew: its person and lock token
--
-- Returns one integer per turn: 1 renewed, 0 lost (the lock is gone or held by another
-- token; the caller must stop that turn's side effects).
--
-- uses: lib/keys.lua (conv_key, LOCK)
-- uses: lib/clock.lua (now_ms)
local prefix, lease = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local out = {}
for i = 3, #ARGV, 2 do
  local person, token = ARGV[i], ARGV[i + 1]
  local lock = conv_key(prefix, person, LOCK)
  if redis.call('GET', lock) == token then
    redis.call('PEXPIRE', lock, lease)
    redis.call('ZADD', KEYS[1], 'XX', now + lease, person)
    table.insert(out, 1)
  else
    table.insert(out, 0)
  end
end
return out
