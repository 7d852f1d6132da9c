-- renew: extend the leases of turns that are still running, only for their holder.
--
-- KEYS[1] running (ZSET)
-- ARGV[1] conversation key prefix of the tenant ("wa:{t}:c:")
-- ARGV[2] lease in ms
-- ARGV[3..] pairs: person, token
--
-- Returns one integer per pair: 1 renewed, 0 lost (the lock is gone or held by another
-- token; the caller must stop that turn's side effects).
local prefix, lease = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
