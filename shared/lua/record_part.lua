-- record_part: remember that the provider accepted part i of the batch's reply.
--
-- KEYS[1] stats (HASH)   KEYS[2] review (HASH)
-- ARGV[1] conversation key prefix of the tenant ("wa:{t}:c:")
-- ARGV[2] outbound record prefix of the tenant ("wa:{t}:out:")
-- ARGV[3] person   ARGV[4] lock token   ARGV[5] part index   ARGV[6] provider message id
--         ("" when the part was deliberately not sent, e.g. replaced by a template)
-- ARGV[7] TTL of the outbound record in seconds
--
-- Returns 1, or 0 when the token does not hold the lock. The outbound record
-- (`out:<id>`: batch, person, part, status) is what delivery statuses update later. A status
-- that arrived before this call was parked on the record by claim.lua (`early`): it is
-- applied here, as claim.lua would have (a failed 131047 puts the person in review).
local prefix, person, token, part, id = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return 0 end
local bkey = conv_key(prefix, person, BATCH)
redis.call('HSET', bkey, 'part:' .. part, id)
if id == '' then return 1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local okey = ARGV[2] .. id
local batch = redis.call('HGET', bkey, 'id')
local early = redis.call('HGET', okey, 'early')
local code = redis.call('HGET', okey, 'early_error') or ''
redis.call('HSET', okey, 'batch', batch, 'person', person, 'part', part,
  'status', early or 'accepted', 'sent_ms', now)
redis.call('HDEL', okey, 'early', 'early_error')
redis.call('EXPIRE', okey, ARGV[7])
redis.call('HINCRBY', KEYS[1], 'parts_out', 1)
if not early then return 1 end
redis.call('HINCRBY', KEYS[1], 'parts_' .. early, 1)
if early ~= 'failed' then return 1 end
redis.call('HSET', okey, 'error', code)
if code == '131047' then
  local item_id = batch .. ':undelivered:' .. id
  local item = cjson.encode({
    id = item_id, person = person, reason = 'window_closed', attempts = 0, reviewed_ms = now,
    error = 'status failed 131047 (window closed) for part ' .. part .. ' ' .. id,
  })
  -- cjson writes an empty table as {}; review items always carry a messages array.
  redis.call('HSET', KEYS[2], item_id, string.sub(item, 1, -2) .. ',"messages":[]}')
  redis.call('HINCRBY', KEYS[1], 'review:window_closed', 1)
end
return 1
