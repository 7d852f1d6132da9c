-- Dedupe markers: one per provider item (shared/events.py `dedupe_id`), found for at least
-- DEDUPE_TTL_S. A marker is an integer, 52 bits of the SHA-1 of the item's key name of the
-- release before (`seen:<dedupe id>`, shared/keys.py: unique per tenant and item), in a small
-- set of the tenant's book of markers (lib/book.lua; a generation takes markers for
-- DEDUPE_TTL_S, so a lookup asks two of them): about 10 B of memory, where a key of its own
-- took 200 (each kept 1.5 × DEDUPE_TTL_S on average: about 15 B a marker at any time). The
-- keys of the release before are read until none can be left.
--
-- uses: lib/book.lua (book_find, book_gens, book_hash)

local DEDUPE_UPGRADE_S = 86400  -- how long after an upgrade a release before may still write
local DEDUPE_FILL = 256  -- markers a shard is sized for (an intset holds 512)

-- How long a generation of the book takes new markers, for markers kept keep_s: as long, so
-- a lookup asks the newest and the one before (a shorter one would keep markers less long
-- and make each lookup ask more generations: a command each, on the receiver's path).
local function dedupe_gen_s(keep_s)
  return math.max(3600, keep_s)
end

-- Whether a marker of the release before may still exist: unless the book began more than
-- keep_s and an upgrade's overlap ago.
local function old_markers_possible(book, now_s, keep_s)
  local since = book_gens(book).since
  return not since or since > now_s - keep_s - DEDUPE_UPGRADE_S
end

-- The marker (a decimal integer) and shard hash of the item whose old key name is `seen_key`.
local function marker_of(seen_key)
  local digest = redis.sha1hex(seen_key)
  return string.format('%.0f', tonumber(string.sub(digest, 1, 13), 16)), book_hash(digest)
end

-- Whether the item whose old key name is `seen_key` was seen: its marker in a generation of
-- the book but `skip`, or (when `old` says one may be left) its key of the release before.
local function is_marked(book, seen_key, member, h, old, skip)
  if old and redis.call('EXISTS', seen_key) == 1 then return true end
  return book_find(book, h, 'SISMEMBER', member, skip) ~= nil
end
