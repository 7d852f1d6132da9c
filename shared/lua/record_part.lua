-- record_part: remember that the provider accepted part i of the batch's reply.
--
-- KEYS[1] stats        HASH: counters
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] outbound_prefix  the tenant's outbound record prefix ("wa:{t}:out:")
-- ARGV[3] person
-- ARGV[4] token        the lock token of the turn
-- ARGV[5] part         the part's index
-- ARGV[6] provider_id  the provider's message id ("" when the part was deliberately not
--         sent, e.g. replaced by a template)
-- ARGV[7] outbound_ttl_s  how long the outbound record lives
--
-- Returns 1 (also when this part is already recorded with this id), or 0 when the token does
-- not hold the lock. The outbound record
-- (`out:<id>`: batch, person, part, status) is what delivery statuses update later. A status
-- that arrived before this call was parked on the record by claim.lua (`early`): it is
-- applied here, as claim.lua would have (a failed one is queued as a late delivery failure,
-- handled once this batch ended: lib/outbound.lua).
--
-- uses: lib/keys.lua (conv_key, BATCH, LOCK)
-- uses: lib/clock.lua (now_ms)
-- uses: lib/outbound.lua (recorded_batch, record_outbound, RB_ID)
local prefix, person, token, part, id = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return 0 end
local bkey = conv_key(prefix, person, BATCH)
-- Already recorded (a call repeated because its answer was lost): count nothing twice.
if redis.call('HGET', bkey, 'part:' .. part) == id then return 1 end
redis.call('HSET', bkey, 'part:' .. part, id)
if id ~= '' then
  local b = recorded_batch(bkey)
  record_outbound(prefix, KEYS[1], ARGV[2], id, b[RB_ID], person, part, ARGV[7], now_ms(), b)
end
return 1
