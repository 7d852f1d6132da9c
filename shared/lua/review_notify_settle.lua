-- review_notify_settle: what came of sending one review notification, as its taker
-- (review_notify_take.lua): sent, to be retried after a delay, or given up (the review item
-- itself stays on the review list either way).
--
-- KEYS[1] review_notify  ZSET: item id -> when its webhook may next be tried (ms)
-- KEYS[2] review_notify_events  HASH: item id -> its notification (JSON)
-- KEYS[3] stats        HASH: counters (review_webhook_sent, _retries, _gave_up)
-- ARGV[1] item_id      the notification's review item id
-- ARGV[2] token        the token it was taken with
-- ARGV[3] outcome      "sent" | "retry" | "gave_up"
-- ARGV[4] delay_ms     retry: due again after this long
-- ARGV[5] error        retry, gave_up: what went wrong (kept on the notification for a retry)
--
-- Returns 1, or 0 when the token no longer holds it (its lease ended and another worker took
-- it, or it is gone): nothing is changed then.
--
-- uses: lib/clock.lua (now_ms)
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
local event = cjson.decode(raw)
if event.token ~= ARGV[2] then return 0 end
local outcome = ARGV[3]
if outcome == 'retry' then
  event.token = ''
  event.error = ARGV[5]
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(event))
  redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[4]), ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'review_webhook_retries', 1)
  return 1
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
if outcome == 'sent' then
  redis.call('HINCRBY', KEYS[3], 'review_webhook_sent', 1)
else
  redis.call('HINCRBY', KEYS[3], 'review_webhook_gave_up', 1)
end
return 1
