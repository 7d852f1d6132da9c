-- The 24-hour window: the provider ts (unix s) of each person's latest message, from which
-- WhatsApp's customer-service window runs. It is one field of a small hash in the tenant's
-- book of windows (lib/book.lua, shared/keys.py `lastin_book`): field = the person, value =
-- the ts, about 25 B; a key each (`c:<person>:lastin`, EXAT ts + window), as the release before
-- kept it, took 157 B of used_memory (docs/benchmarks/memory.md). A Redis 7.0 hash field has
-- no TTL of its own, so the book's generations do the expiring: a generation takes windows
-- for a day and its shards live a window (and LASTIN_SKEW_S) longer, so a window is found at
-- least as long as it can be open; a reader compares the ts with the window (`lastin_open`), as the key's
-- expiry did. A generation's fill (64 of the 128 entries a listpack hash holds) keeps shards
-- compact. Writes go to the newest generation, reads ask the newest first: the first found is
-- the latest.
--
-- Upgrading: the keys of the release before are read beside the book (the later ts wins)
-- until none can be left: they expire with their window, so a window and a day (a rolling
-- deploy's overlap, when old workers still write them) after the book began. Nothing writes
-- them any more; forgetting a person deletes both (forget.lua).
--
-- uses: lib/keys.lua (conv_key, lastin_book, LASTIN)
-- uses: lib/book.lua (book_find, book_open, book_key, book_added, book_hash, book_gens)
-- uses: lib/book.lua (book_newest)

local LASTIN_FILL = 64  -- windows a shard of the book is sized for (a listpack holds 128)
local LASTIN_GEN_S = 86400  -- a generation of the book takes windows for a day
local LASTIN_SKEW_S = 3600  -- a provider ts ahead of Redis's clock: kept that much longer
local LASTIN_AHEAD_S = 300  -- how far ahead of Redis's clock a provider ts is taken to be
local LASTIN_UPGRADE_S = 86400  -- how long after an upgrade a release before may still write

-- The number a person's shard comes from: the person itself when it is a number (a phone
-- number: its last digits spread people evenly, and no SHA-1 is computed on the intake's
-- path), else from its SHA-1 as the other books do.
local function lastin_hash(person)
  local n = tonumber(person)
  if n and n >= 0 and n < 2^53 and n == math.floor(n) then return n end
  return book_hash(redis.sha1hex(person))
end

-- Whether a key of the release before may still be left: until the book is a window and an
-- upgrade's overlap old (the keys expire with their window).
local function lastin_legacy_possible(book, now_s, window_s)
  local since = book_gens(book).since
  return not since or since > now_s - window_s - LASTIN_UPGRADE_S
end

-- The ts of `person`'s latest message (a number), or nil when none is known; the shard hash
-- of its field; whether the ts is a key of the release before (which exists only while its
-- window is open: its expiry decides, as it did); and, for a ts of the book, its text as
-- stored (written from a whole number: its text is tostring's). `window_s` only bounds how
-- long such a key may be left; `no_legacy`: the caller knows there is none (it asked).
local function lastin_find(prefix, person, now_s, window_s, no_legacy)
  local book = lastin_book(prefix)
  local h = lastin_hash(person)
  local text = book_find(book, h, 'HGET', person)
  local ts = tonumber(text)
  if not no_legacy and lastin_legacy_possible(book, now_s, window_s) then
    local old = tonumber(redis.call('GET', conv_key(prefix, person, LASTIN)) or '')
    if old and (not ts or old > ts) then return old, h, true end
  end
  return ts, h, false, text
end

-- Whether a window that began at `ts` is still open at `now_s`.
local function lastin_open(ts, now_s, window_s)
  return ts ~= nil and ts + window_s > now_s
end

-- The ts of the person's latest message while the window is open, else '0' (what the key
-- of the release before answered once it had expired).
local function lastin_get(prefix, person, now_s, window_s, no_legacy)
  local ts, _, legacy, text = lastin_find(prefix, person, now_s, window_s, no_legacy)
  if legacy or lastin_open(ts, now_s, window_s) then
    -- The stored text when it is the number's own (no sprintf per claimed batch).
    if text and string.find(text, '^[1-9]%d*$') then return text end
    return tostring(ts)
  end
  return '0'
end

-- A message of `person` with provider ts `ts` arrived: the window runs from it unless a later
-- one is known. One whose window has closed already is not kept (the key of the release
-- before expired at once). On the intake's path, so it asks as little as it can: the newest
-- generation, and the older ones only when they may hold a later ts (a message older than the
-- newest generation's start, give or take LASTIN_AHEAD_S: anything they hold was written
-- before that start). Not a key of the release before: a reader takes the later of it and
-- the book while one may be left, so a ts written here that is older than the key's is
-- never read.
local function lastin_saw(prefix, person, ts, now_s, window_s)
  if not lastin_open(ts, now_s, window_s) then return end
  local book = lastin_book(prefix)
  local h = lastin_hash(person)
  local newest = book_newest(book)
  local known, key = nil, nil
  if newest then
    key = book_key(newest, h)
    known = tonumber(redis.call('HGET', key, person))
    if not known and ts <= newest.start + LASTIN_AHEAD_S then
      known = tonumber((book_find(book, h, 'HGET', person, newest)))
    end
  end
  if known and ts <= known then return end
  local gen = book_open(book, now_s, window_s + LASTIN_SKEW_S, LASTIN_GEN_S, LASTIN_FILL, 'HLEN')
  if gen ~= newest then key = book_key(gen, h) end
  if redis.call('HSET', key, person, ts) == 1 then
    book_added(book, gen, key, redis.call('HLEN', key), LASTIN_FILL)
  end
end

-- Delete every window of `person` in the book (each generation may hold one); how many. The
-- key of the release before is a conversation key: whoever forgets deletes it with those.
local function lastin_forget(prefix, person)
  local book = lastin_book(prefix)
  local h = lastin_hash(person)
  local n = 0
  for _, gen in ipairs(book_gens(book)) do
    n = n + redis.call('HDEL', book_key(gen, h), person)
  end
  return n
end

-- A number change: the window of `old` becomes `new`'s, unless `new` has one of its own (as
-- RENAMENX moved the key of the release before).
local function lastin_move(prefix, old, new, now_s, window_s)
  local ts, _, legacy = lastin_find(prefix, old, now_s, window_s)
  if not ts or lastin_find(prefix, new, now_s, window_s) then return end
  if legacy then
    -- A key of the release before moves as it did, with its expiry.
    redis.call('RENAMENX', conv_key(prefix, old, LASTIN), conv_key(prefix, new, LASTIN))
  else
    lastin_saw(prefix, new, ts, now_s, window_s)
  end
  lastin_forget(prefix, old)
end
