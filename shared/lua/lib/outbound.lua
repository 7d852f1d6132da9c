-- The outbound records (`out:<provider id>`: batch, person, part, status) that delivery
-- statuses update, and the review item for a part Meta could not deliver.
--
-- uses: lib/review.lua (add_review_item)

-- Delivery statuses only move forward: a late "delivered" never undoes "read".
local STATUS_RANK = {accepted = 0, sent = 1, delivered = 2, read = 3, played = 4, failed = 5}

-- Meta accepted a part but could not deliver it because the 24-hour window had closed:
-- a person has to look at this conversation.
-- `notify_key`: the tenant's review notification queue, "" for none (lib/review.lua).
local function park_undelivered(review_key, stats_key, notify_key, batch, person, part, id, now)
  local item_id = batch .. ':undelivered:' .. id
  local item = cjson.encode({
    id = item_id, person = person, reason = 'window_closed', attempts = 0, reviewed_ms = now,
    error = 'status failed 131047 (window closed) for part ' .. part .. ' ' .. id,
  })
  -- cjson writes an empty table as {}; review items always carry a messages array.
  add_review_item(review_key, stats_key, notify_key, item_id,
    string.sub(item, 1, -2) .. ',"messages":[]}', 'window_closed', now)
end

-- The provider accepted part `part` of `batch` as `id`: create its outbound record, and apply
-- a status that overtook the send's answer (parked as `early` by claim.lua).
local function record_outbound(stats_key, review_key, notify_key, out_prefix, id, batch, person,
                                part, ttl, now)
  local okey = out_prefix .. id
  local early = redis.call('HGET', okey, 'early')
  local code = redis.call('HGET', okey, 'early_error') or ''
  redis.call('HSET', okey, 'batch', batch, 'person', person, 'part', part,
    'status', early or 'accepted', 'sent_ms', now)
  redis.call('HDEL', okey, 'early', 'early_error')
  redis.call('EXPIRE', okey, ttl)
  redis.call('HINCRBY', stats_key, 'parts_out', 1)
  if not early then return end
  redis.call('HINCRBY', stats_key, 'parts_' .. early, 1)
  if early ~= 'failed' then return end
  redis.call('HSET', okey, 'error', code)
  if code == '131047' then
    park_undelivered(review_key, stats_key, notify_key, batch, person, part, id, now)
  end
end
