-- ingest: dedupe and store provider items of one tenant, atomically per item: the marker and
-- the push happen together or not at all (invariant 2, docs/invariants.md).
--
-- KEYS[1] inbox        LIST: the tenant's inbox
-- KEYS[2..] seen       STRING: the dedupe marker of each item (same tenant hash tag)
-- ARGV[1] dedupe_ttl_s  how long a marker lives
-- ARGV[2..] events     the encoded event of each item, in the same order as its marker
--
-- Returns one integer per item: 1 stored, 0 duplicate (seen before, nothing written).
-- The marker and the push happen in the same script: a crash can never leave a message
-- "seen" but not stored, which would make the provider's retry a duplicate and lose it.
--
-- uses: none
local ttl = ARGV[1]
local out = {}
for i = 2, #KEYS do
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ttl) then
    redis.call('LPUSH', KEYS[1], ARGV[i])
    out[i - 1] = 1
  else
    out[i - 1] = 0
  end
end
return out
