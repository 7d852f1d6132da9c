-- review_notify_take: take the tenant's review notifications that are due, each under a lease
-- of the taking worker (worker/fleet/review_notifier.py). A worker killed while it sends one never
-- settles it: the notification is due again when the lease ends, and another worker sends it
-- (at least once; the event id lets a receiver drop a repeat).
--
-- KEYS[1] review_notify  ZSET: item id -> when its webhook may next be tried (ms)
-- KEYS[2] review_notify_events  HASH: item id -> its notification (JSON)
-- ARGV[1] most         how many to take at most
-- ARGV[2] lease_ms     how long the taker has to send and settle each
-- ARGV[3] token        unique per call: settling needs it (a later taker's token wins)
--
-- Each taken notification gets attempts + 1 and the token, and is due again at now + lease.
-- Returns {now_ms, next_ms, id1, event1, id2, event2, ...}: Redis's clock, the earliest time
-- any notification left (or just taken) may be tried (-1 when the queue is empty), then each
-- taken item id with its notification (JSON: item, created_ms, attempts, token, error).
--
-- uses: lib/clock.lua (now_ms)
local now = now_ms()
local lease = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {now, -1}
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    local event = cjson.decode(raw)
    event.attempts = (tonumber(event.attempts) or 0) + 1
    event.token = ARGV[3]
    raw = cjson.encode(event)
    redis.call('HSET', KEYS[2], id, raw)
    redis.call('ZADD', KEYS[1], now + lease, id)
    out[#out + 1] = id
    out[#out + 1] = raw
  else
    redis.call('ZREM', KEYS[1], id)  -- its notification is gone (forgotten): nothing to send
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
return out
