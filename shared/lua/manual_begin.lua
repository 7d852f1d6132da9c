-- manual_begin: a person of the business replies by hand: take the person's turn lock with a
-- token of the reply's own, so the reply and a worker's turn never overlap (invariant 3,
-- docs/invariants.md). Refused while a turn holds the lock or a batch is in flight (running,
-- or waiting for a retry), and for a person the tenant has no conversation with.
--
-- KEYS[1] running      ZSET: person -> when the running turn's lease ends (ms)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] token        the reply's own lock token ("manual:..."), unlike any worker's
-- ARGV[4] lease_ms     how long the lock holds unless renewed (renew.lua) or released
-- ARGV[5] service_window_s  the customer-service window (86400): how long a person's window
--         stays open after their latest message (lib/lastin.lua)
--
-- Returns {"busy", holder} when the lock is held (holder: the token, so the caller can tell
-- another reply by hand from a turn) or a batch is in flight (holder ""); {"none"} when the
-- person has no pending messages, memory, window or context; else {"ok", now_ms, lastin,
-- memory, p1, p2, ...}: Redis's clock, the provider ts of the person's last message ("0"
-- once the window has closed), the memory (a JSON array) and the pending messages the reply
-- answers, in order. Messages that arrive later stay pending (manual_end.lua).
--
-- uses: lib/keys.lua (conv_key, PENDING, BATCH, LOCK, MEMORY, CONTEXT)
-- uses: lib/lastin.lua (lastin_get)
-- uses: lib/clock.lua (now_ms)
local prefix, person, token = ARGV[1], ARGV[2], ARGV[3]
local lock = conv_key(prefix, person, LOCK)
local holder = redis.call('GET', lock)
if holder then return {'busy', holder} end
if redis.call('EXISTS', conv_key(prefix, person, BATCH)) == 1
    or redis.call('ZSCORE', KEYS[1], person) then
  return {'busy', ''}
end
local pkey, mkey = conv_key(prefix, person, PENDING), conv_key(prefix, person, MEMORY)
local now = now_ms()
local now_s = math.floor(now / 1000)
local lastin = lastin_get(prefix, person, now_s, tonumber(ARGV[5]))
if lastin == '0' and redis.call('EXISTS', pkey, mkey, conv_key(prefix, person, CONTEXT)) == 0 then
  return {'none'}
end
redis.call('SET', lock, token, 'PX', ARGV[4])
local out = {'ok', now, lastin,
  '[' .. table.concat(redis.call('LRANGE', mkey, 0, -1), ',') .. ']'}
for _, item in ipairs(redis.call('LRANGE', pkey, 0, -1)) do table.insert(out, item) end
return out
