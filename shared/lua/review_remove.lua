-- review_remove: delete review items with their index entries (lib/review.lua), touching
-- nothing else: the retention sweep's old items (worker/fleet/retention.py), a forgotten
-- person's items (shared/ops/forget.py), index entries whose item the previous release
-- deleted (shared/ops/review_index.py).
--
-- KEYS[1] review       HASH: batch id -> review item
-- ARGV[1..] item_ids   the items to delete
--
-- Returns how many items were deleted.
--
-- uses: lib/review.lua (remove_review_item)
local deleted = 0
for i = 1, #ARGV do
  deleted = deleted + remove_review_item(KEYS[1], ARGV[i])
end
return deleted
