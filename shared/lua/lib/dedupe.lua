-- Dedupe markers: one per provider item (shared/events.py `dedupe_id`), found for at least
-- DEDUPE_TTL_S. A marker is an integer, 52 bits of the SHA-1 of the item's key name of the
-- release before (`seen:<dedupe id>`, shared/keys.py: unique per tenant and item), in a small
-- set of the tenant's book of markers (lib/book.lua): about 10 B of memory, where a key of
-- its own took 200. The keys of the release before are still read, until they expire.
--
-- uses: lib/book.lua (book_find)

-- The SHA-1 (hex) and the set member of the item whose old key name is `seen_key`.
local function marker_of(seen_key)
  local digest = redis.sha1hex(seen_key)
  return digest, string.format('%.0f', tonumber(string.sub(digest, 1, 13), 16))
end

-- Whether the item whose old key name is `seen_key` was seen: its marker in the book, or its
-- key of the release before. Also returns its digest and member, for marking it.
local function is_marked(book, seen_key)
  local digest, member = marker_of(seen_key)
  if redis.call('EXISTS', seen_key) == 1 then return true, digest, member end
  local found = book_find(book, digest, function(key)
    return redis.call('SISMEMBER', key, member) == 1
  end)
  return found == true, digest, member
end
