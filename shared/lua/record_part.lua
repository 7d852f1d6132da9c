-- record_part: remember that the provider accepted part i of the batch's reply.
--
-- KEYS[1] stats (HASH)   KEYS[2] review (HASH)
-- ARGV[1] conversation key prefix of the tenant ("wa:{t}:c:")
-- ARGV[2] outbound record prefix of the tenant ("wa:{t}:out:")
-- ARGV[3] person   ARGV[4] lock token   ARGV[5] part index   ARGV[6] provider message id
--         ("" when the part was deliberately not sent, e.g. replaced by a template)
-- ARGV[7] TTL of the outbound record in seconds
--
-- Returns 1 (also when this part is already recorded with this id), or 0 when the token does
-- not hold the lock. The outbound record
-- (`out:<id>`: batch, person, part, status) is what delivery statuses update later. A status
-- that arrived before this call was parked on the record by claim.lua (`early`): it is
-- applied here, as claim.lua would have (a failed 131047 puts the person in review).
local prefix, person, token, part, id = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return 0 end
local bkey = conv_key(prefix, person, BATCH)
-- Already recorded (a call repeated because its answer was lost): count nothing twice.
if redis.call('HGET', bkey, 'part:' .. part) == id then return 1 end
redis.call('HSET', bkey, 'part:' .. part, id)
if id ~= '' then
  record_outbound(KEYS[1], KEYS[2], ARGV[2], id, redis.call('HGET', bkey, 'id'), person, part,
    ARGV[7], now_ms())
end
return 1
