-- record_part: remember that the provider accepted part i of the batch's reply.
--
-- KEYS[1] stats (HASH)
-- ARGV[1] conversation key prefix of the tenant ("wa:{t}:c:")
-- ARGV[2] outbound record prefix of the tenant ("wa:{t}:out:")
-- ARGV[3] person   ARGV[4] lock token   ARGV[5] part index   ARGV[6] provider message id
--         ("" when the part was deliberately not sent, e.g. replaced by a template)
-- ARGV[7] TTL of the outbound record in seconds
--
-- Returns 1, or 0 when the token does not hold the lock. The outbound record
-- (`out:<id>`: batch, person, part, status) is what delivery statuses update later.
local prefix, person, token = ARGV[1], ARGV[3], ARGV[4]
if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return 0 end
local bkey = conv_key(prefix, person, BATCH)
redis.call('HSET', bkey, 'part:' .. ARGV[5], ARGV[6])
if ARGV[6] ~= '' then
  local t = redis.call('TIME')
  local okey = ARGV[2] .. ARGV[6]
  redis.call('HSET', okey, 'batch', redis.call('HGET', bkey, 'id'), 'person', person,
    'part', ARGV[5], 'status', 'accepted', 'sent_ms', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call('EXPIRE', okey, ARGV[7])
  redis.call('HINCRBY', KEYS[1], 'parts_out', 1)
end
return 1
