-- Books: small entries that must be found for at least `keep_s` seconds each (the dedupe
-- markers, the outbound records), packed into small sets or hashes instead of a key each. A
-- key of its own costs about 130 B of Redis memory besides its value (its name, its entry in
-- the key space and in the expires table); in a small set of integers (an intset) an entry
-- costs 8 B, in a small hash (a listpack) its bytes and two (docs/benchmarks/memory.md).
--
-- A book with prefix P (shared/keys.py `seen_book`, `outbound_book`):
--   P .. 'gens'                HASH  generation start (unix s) -> "<start>:<shard count>:<end>",
--                                    ":full" appended once a shard of it filled up; `newest`
--                                    -> the newest's value again; `since` -> when the first
--                                    began
--   P .. <start> .. ':' .. <i>  SET or HASH  shard i of that generation: its entries, expiring
--                                    at the generation's end (EXPIREAT)
-- A generation takes new entries for `gen_s` at most, and its shards live keep_s longer: its
-- end is start + gen_s + keep_s, so every entry is found for at least keep_s (keep_s + gen_s / 2
-- on average). A new one starts when the newest is gen_s old or one of its shards holds 1.5 ×
-- `fill` entries; its shard count (a power of two) is what gen_s at the last one's rate (over
-- 10 minutes at least) needs at `fill` a shard. Shards so stay within Redis's compact encodings
-- (the defaults: an intset up to 512 integers, a listpack hash up to 128 entries of at most 64
-- bytes); one that outgrows them still works, at the cost of a plain set or hash. An entry's
-- shard is `h` (a number from its id's SHA-1: digits 17-24, `book_hash`) modulo the shard
-- count; what the entry is stored as comes from the first digits. Finding an entry asks each
-- generation, newest first: one command for each of the (keep_s + gen_s) / gen_s or so that
-- can hold entries. Writing needs the newest alone (`HGET … newest`). Scripts calling these run
-- often: they allocate little (Lua's tables and strings cost Redis more than its commands do
-- here).
--
-- uses: lib/text.lua (int_text)

local BOOK_GENS, BOOK_NEWEST, BOOK_SINCE = '{{BOOK_GENS}}', 'newest', 'since'
local BOOK_MAX_SHARDS = 65536
local BOOK_RATE_S = 600  -- a rate is measured over 10 minutes at least (a burst is no rate)
local BOOK_PARSED_KEPT = 1000  -- values book_gen keeps parsed, at most
local book_loaded = {}  -- prefix -> its generations, newest first (read once per script call)
local book_newest_of = {}  -- prefix -> its newest generation, or false (read once per call)

-- A call begins: forget what the last one read (a function library, shared/storage/scripts.py,
-- keeps these tables between calls; an EVAL'd chunk makes them anew at each).
local function book_new_call()
  book_loaded, book_newest_of = {}, {}
end

-- The number an entry's shard comes from, of its SHA-1 (hex).
local function book_hash(digest)
  return tonumber(string.sub(digest, 17, 24), 16)
end

-- A generation's value -> {id, start, shards, ends, full}, parsed once and kept between calls
-- (a function library keeps it; a value means the same whatever reads it): a write to a book
-- reads its newest generation at every call, and three tonumber cost more than its HGET.
local book_parsed, book_parsed_n = {}, 0

-- A generation of book `prefix` from its value: {id, start, shards, ends, full, head}, where
-- a shard's key is head .. its index (a new table at each call: callers may change `full`).
local function book_gen(prefix, value)
  local p = book_parsed[value]
  if not p then
    local id, shards, ends, rest = string.match(value, '^(%d+):(%d+):(%d+)(.*)$')
    if not id then return nil end
    p = {id, tonumber(id), math.max(1, tonumber(shards)), tonumber(ends), rest == ':full'}
    if book_parsed_n >= BOOK_PARSED_KEPT then book_parsed, book_parsed_n = {}, 0 end
    book_parsed[value], book_parsed_n = p, book_parsed_n + 1
  end
  return {id = p[1], start = p[2], shards = p[3], ends = p[4], full = p[5],
    head = prefix .. p[1] .. ':'}
end

local function book_value(gen)
  return gen.id .. ':' .. gen.shards .. ':' .. gen.ends .. (gen.full and ':full' or '')
end

-- The generations of book `prefix`, newest first; `since` (a field of the list) when the
-- book began.
local function book_gens(prefix)
  local gens = book_loaded[prefix]
  if gens then return gens end
  gens = {}
  local flat = redis.call('HGETALL', prefix .. BOOK_GENS)
  for i = 1, #flat, 2 do
    if flat[i] == BOOK_SINCE then
      gens.since = tonumber(flat[i + 1])
    elseif flat[i] ~= BOOK_NEWEST then
      gens[#gens + 1] = book_gen(prefix, flat[i + 1])
    end
  end
  -- A small hash lists its fields in the order they came, oldest generation first: reversed.
  local n, ordered = #gens, true
  for i = 2, n do ordered = ordered and gens[i - 1].start < gens[i].start end
  if not ordered then table.sort(gens, function(a, b) return a.start < b.start end) end
  for i = 1, math.floor(n / 2) do gens[i], gens[n + 1 - i] = gens[n + 1 - i], gens[i] end
  book_loaded[prefix] = gens
  book_newest_of[prefix] = gens[1] or false
  return gens
end

-- The newest generation of book `prefix`, or nil: one field, unless the list is read already.
local function book_newest(prefix)
  local gen = book_newest_of[prefix]
  if gen == nil then
    local value = redis.call('HGET', prefix .. BOOK_GENS, BOOK_NEWEST)
    gen = value and book_gen(prefix, value) or false
    book_newest_of[prefix] = gen
  end
  return gen or nil
end

-- The key of the shard of generation `gen` an entry of hash `h` belongs to.
local function book_key(gen, h)
  return gen.head .. int_text(h % gen.shards)
end

-- The first answer of `redis.call(command, <the entry's shard>, arg)` that is neither nil nor
-- 0 over the generations, newest first (but `skip`), and that shard's key; nil when none has
-- it. The newest is asked before the others are read.
local function book_find(prefix, h, command, arg, skip)
  local newest = book_newest(prefix)
  if not newest then return nil, nil end
  local asked = skip and skip.id
  if newest.id ~= asked then
    local key = newest.head .. int_text(h % newest.shards)
    local found = redis.call(command, key, arg)
    if found and found ~= 0 then return found, key end
  end
  for _, gen in ipairs(book_gens(prefix)) do
    if gen.id ~= asked and gen.id ~= newest.id then
      local key = gen.head .. int_text(h % gen.shards)
      local found = redis.call(command, key, arg)
      if found and found ~= 0 then return found, key end
    end
  end
  return nil, nil
end

-- The generation new entries go to: the newest, or a new one when that is full or gen_s old
-- (generations whose shards have all expired are forgotten then). `size` is the command that
-- counts a shard's entries (SCARD, HLEN).
local function book_open(prefix, now_s, keep_s, gen_s, fill, size)
  local last = book_newest(prefix)
  if last and not last.full and now_s - last.start < gen_s then return last end
  local gens = book_gens(prefix)
  local shards, start = 1, now_s
  if last then
    -- Its entries: a full one has about 1.5 × fill a shard; else count a few shards.
    local per_shard = fill * 1.5
    if not last.full then
      local counted, looked = 0, math.min(4, last.shards)
      for i = 0, looked - 1 do counted = counted + redis.call(size, last.head .. int_text(i)) end
      per_shard = counted / looked
    end
    local per_gen = per_shard * last.shards * gen_s / math.max(now_s - last.start, BOOK_RATE_S)
    while shards < BOOK_MAX_SHARDS and shards * fill < per_gen do shards = shards * 2 end
    if start <= last.start then start = last.start + 1 end
  end
  local meta = prefix .. BOOK_GENS
  for i = #gens, 1, -1 do
    if gens[i].ends < now_s then
      redis.call('HDEL', meta, gens[i].id)
      table.remove(gens, i)
    end
  end
  local ends = start + gen_s + tonumber(keep_s)  -- (the caller may give keep_s as text)
  local gen = book_gen(prefix, start .. ':' .. shards .. ':' .. ends)
  local value = book_value(gen)
  redis.call('HSET', meta, gen.id, value, BOOK_NEWEST, value)
  if not gens.since then
    gens.since = start
    redis.call('HSET', meta, BOOK_SINCE, start)
  end
  redis.call('EXPIREAT', meta, gen.ends + 60)  -- it outlives every generation it lists
  table.insert(gens, 1, gen)
  book_newest_of[prefix] = gen
  return gen
end

-- A new entry went to shard `key` of generation `gen`, which holds `count` entries now: the
-- shard's first lives until the generation's end; once one holds 1.5 × fill, the generation is
-- full (the next entry opens a new one).
local function book_added(prefix, gen, key, count, fill)
  if count == 1 then redis.call('EXPIREAT', key, gen.ends) end
  if count >= fill * 1.5 and not gen.full then
    gen.full = true
    local value = book_value(gen)
    redis.call('HSET', prefix .. BOOK_GENS, gen.id, value, BOOK_NEWEST, value)
  end
end
