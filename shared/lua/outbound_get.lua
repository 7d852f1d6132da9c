-- outbound_get: the outbound records of some provider ids, as the ops page and the tools show
-- them (shared/ops/outbound.py). Reads only.
--
-- KEYS[1] outbound_gens  HASH: the generations of the tenant's book of records (lib/book.lua)
-- ARGV[1] outbound_prefix  the tenant's outbound prefix ("wa:{t}:out:")
-- ARGV[2..] ids        provider ids
--
-- Returns one array per id: {status, sent_ms, part, error, person, batch}, or an empty array
-- when the id has no record (never sent, or expired).
--
-- uses: lib/outbound.lua (find_record)
local out = {}
for i = 2, #ARGV do
  local r = find_record(ARGV[1], ARGV[i])
  if r then
    out[i - 1] = {r.status, tostring(r.sent_ms or ''), tostring(r.part or ''), r.error or '',
      r.person or '', r.batch or ''}
  else
    out[i - 1] = {}
  end
end
return out
