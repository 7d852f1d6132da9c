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
-- so a repeated status is stored again and comes to nothing. An item's marker goes to the
-- newest generation with SADD, which also says whether it was there; the older generations
-- are asked first. The items stored are pushed together, in order, at the end.
--
-- uses: lib/clock.lua (now_ms)
-- uses: lib/book.lua (book_open, book_key, book_added)
-- uses: lib/dedupe.lua (marker_of, is_marked, old_markers_possible, dedupe_gen_s, DEDUPE_FILL)
local book, ttl = ARGV[1], tonumber(ARGV[2])
local STATUS = '{"v":1,"kind":"status",'  -- 23 bytes
local now_s, old, gen = nil, nil, nil
local out, stored = {}, {}
for i = 2, #KEYS do
  local ev = ARGV[i + 1]
  local new = true
  if string.sub(ev, 1, 23) ~= STATUS then
    if not now_s then
      now_s = math.floor(now_ms() / 1000)
      old = old_markers_possible(book, now_s, ttl)
    end
    if not gen or gen.full then
      gen = book_open(book, now_s, ttl, dedupe_gen_s(ttl), DEDUPE_FILL, 'SCARD')
    end
    local member, h = marker_of(KEYS[i])
    if is_marked(book, KEYS[i], member, h, old, gen) then
      new = false
    else
      local key = book_key(gen, h)
      new = redis.call('SADD', key, member) == 1
      if new then book_added(book, gen, key, redis.call('SCARD', key), DEDUPE_FILL) end
    end
  end
  if new then stored[#stored + 1] = ev end
  out[i - 1] = new and 1 or 0
end
if #stored > 0 then redis.call('LPUSH', KEYS[1], unpack(stored)) end
return out
