-- dedupe_marked: whether items have a dedupe marker (shared/ops/markers.py: tools and tests).
-- Reads only.
--
-- KEYS[1..] seen       STRING: each item's dedupe marker as the release before kept it (its
--         name is what the marker in the book is made from: lib/dedupe.lua)
-- ARGV[1] seen_book    the prefix of the tenant's book of dedupe markers (lib/book.lua)
--
-- Returns one integer per item: 1 marked (a new delivery of it would be a duplicate), 0 not.
--
-- uses: lib/dedupe.lua (marker_of, is_marked)
local out = {}
for i = 1, #KEYS do
  local member, h = marker_of(KEYS[i])
  out[i] = is_marked(ARGV[1], KEYS[i], member, h, true, nil) and 1 or 0
end
return out
