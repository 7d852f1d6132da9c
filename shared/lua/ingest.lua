-- ingest: dedupe and store provider items of one tenant, atomically per item: the marker and
-- the push happen together or not at all (invariant 2, docs/invariants.md).
--
-- KEYS[1] inbox        LIST: the tenant's inbox
-- KEYS[2..] seen       STRING: each item's dedupe marker as the release before kept it, a key
--         each (same tenant hash tag): only read; its name is what the item's marker in the
--         book is made from (lib/dedupe.lua)
-- ARGV[1] seen_book    the prefix of the tenant's book of dedupe markers (lib/book.lua)
-- ARGV[2] dedupe_ttl_s  how long a marker lives
-- ARGV[3..] events     the encoded event of each item, in the same order as its marker
--
-- Returns one integer per item: 1 stored, 0 duplicate (seen before, nothing written).
-- The marker and the push happen in the same script: a crash can never leave a message
-- "seen" but not stored, which would make the provider's retry a duplicate and lose it.
-- A delivery status gets no marker: applying one again changes nothing (lib/outbound.lua),
-- so a repeated status is stored again and comes to nothing.
--
-- uses: lib/clock.lua (now_ms)
-- uses: lib/book.lua (book_open, book_key, book_added)
-- uses: lib/dedupe.lua (is_marked)
local book, ttl = ARGV[1], tonumber(ARGV[2])
local STATUS = '{"v":1,"kind":"status",'
local gen = nil
local out = {}
for i = 2, #KEYS do
  local ev = ARGV[i + 1]
  local stored = 1
  if string.sub(ev, 1, #STATUS) ~= STATUS then
    local seen, digest, member = is_marked(book, KEYS[i])
    if seen then
      stored = 0
    else
      gen = gen or book_open(book, math.floor(now_ms() / 1000), ttl, 256)
      local key = book_key(book, gen, digest)
      redis.call('SADD', key, member)
      book_added(book, gen, key, ttl)
    end
  end
  if stored == 1 then redis.call('LPUSH', KEYS[1], ev) end
  out[i - 1] = stored
end
return out
