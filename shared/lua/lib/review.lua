-- Storing a review item: the one way a script puts something on the tenant's review list.
-- With a review webhook configured (REVIEW_WEBHOOK_URL) the item's notification is queued in
-- the same call, so no item exists without its notification (worker/fleet/review_notifier.py sends
-- it; docs/operating.md#being-told). Every script that creates review items calls this, with
-- the tenant's notification queue key as an ARGV entry (shared/storage/script_calls.py: `"" when no
-- webhook is configured`: nothing is queued then).
--
-- uses: none

-- The notifications' hash is the queue's key plus this suffix (spelled in shared/keys.py).
local NOTIFY_EVENTS = '{{NOTIFY_EVENTS}}'

-- Store `item` (its JSON) as review item `item_id`, count it as review:<reason>, and queue its
-- notification, due at once, on `notify_key` ("" or nil: no webhook, nothing queued). An id
-- already queued and not yet sent is queued once: one item id, one event.
local function add_review_item(review_key, stats_key, notify_key, item_id, item, reason, now)
  redis.call('HSET', review_key, item_id, item)
  redis.call('HINCRBY', stats_key, 'review:' .. reason, 1)
  if notify_key == nil or notify_key == '' then return end
  local event = cjson.encode({item = item, created_ms = now, attempts = 0})
  if redis.call('HSETNX', notify_key .. ':' .. NOTIFY_EVENTS, item_id, event) == 1 then
    redis.call('ZADD', notify_key, now, item_id)
  end
end
