-- Books: small entries that must be found for at least `keep_s` seconds each (the dedupe
-- markers, the outbound records), packed into small sets or hashes instead of a key each. A
-- key of its own costs about 130 B of Redis memory besides its value (its name, its entry in
-- the key space and in the expires table); in a small set of integers (an intset) an entry
-- costs 8 B, in a small hash (a listpack) its bytes and two (docs/benchmarks/memory.md).
--
-- A book with prefix P (shared/keys.py `seen_book`, `outbound_book`):
--   P .. 'gens'                HASH  generation start (unix s) -> its shard count, and
--                                    '<start>:n' -> how many entries it was given
--   P .. <start> .. ':' .. <i>  SET or HASH  shard i of that generation: its entries, expiring
--                                    keep_s after the last one added
-- New entries go to the newest generation. A new one starts when that is a day old or holds
-- on average 1.5 × `fill` entries a shard; its shard count (a power of two) is what a day of
-- the last one's rate needs at `fill` a shard. Shards so stay within Redis's compact
-- encodings (the defaults: an intset up to 512 integers, a listpack hash up to 128 entries of
-- at most 64 bytes); one that outgrows them still works, at the cost of a plain set or hash.
-- An entry's shard is a hash of its id (a SHA-1, hex, `digest`) modulo the shard count, from
-- digits 17-24: what the entry is stored as comes from the first digits. Finding an entry
-- asks each live generation, newest first: about one command a day of `keep_s`.
--
-- uses: none

local BOOK_GENS = '{{BOOK_GENS}}'
local BOOK_GEN_S = 86400  -- a generation takes new entries for a day at most
local BOOK_MAX_SHARDS = 65536
local book_loaded = {}  -- prefix -> its generations, newest first (read once per script call)

-- The generations of book `prefix`, newest first: {id, start, shards, n}.
local function book_gens(prefix)
  local gens = book_loaded[prefix]
  if gens then return gens end
  gens = {}
  local counts = {}
  local flat = redis.call('HGETALL', prefix .. BOOK_GENS)
  for i = 1, #flat, 2 do
    local counted = string.match(flat[i], '^(%d+):n$')
    if counted then
      counts[counted] = tonumber(flat[i + 1]) or 0
    elseif string.match(flat[i], '^%d+$') then
      table.insert(gens, {id = flat[i], start = tonumber(flat[i]),
        shards = math.max(1, tonumber(flat[i + 1]) or 1)})
    end
  end
  for _, gen in ipairs(gens) do gen.n = counts[gen.id] or 0 end
  table.sort(gens, function(a, b) return a.start > b.start end)
  book_loaded[prefix] = gens
  return gens
end

-- The key of the shard of generation `gen` an entry of SHA-1 `digest` belongs to.
local function book_key(prefix, gen, digest)
  return prefix .. gen.id .. ':' .. (tonumber(string.sub(digest, 17, 24), 16) % gen.shards)
end

-- The first truthy answer of `probe(key)` over the entry's shard in each generation, newest
-- first, and that key; nil when no generation has it.
local function book_find(prefix, digest, probe)
  for _, gen in ipairs(book_gens(prefix)) do
    local key = book_key(prefix, gen, digest)
    local found = probe(key)
    if found then return found, key end
  end
  return nil, nil
end

-- The generation new entries go to: the newest, or a new one when that is full or a day old
-- (generations that can hold nothing any more are forgotten then).
local function book_open(prefix, now_s, keep_s, fill)
  local gens = book_gens(prefix)
  local last = gens[1]
  if last and now_s - last.start < BOOK_GEN_S and last.n < last.shards * fill * 1.5 then
    return last
  end
  local shards, start = 1, now_s
  if last then
    local per_day = last.n * BOOK_GEN_S / math.max(now_s - last.start, 60)
    while shards < BOOK_MAX_SHARDS and shards * fill < per_day do shards = shards * 2 end
    if start <= last.start then start = last.start + 1 end
  end
  local meta = prefix .. BOOK_GENS
  -- A generation's last entry came before the next one started: keep_s after that start,
  -- every shard of it has expired.
  for i = #gens, 2, -1 do
    if gens[i - 1].start + keep_s < now_s then
      redis.call('HDEL', meta, gens[i].id, gens[i].id .. ':n')
      table.remove(gens, i)
    end
  end
  local gen = {id = tostring(start), start = start, shards = shards, n = 0}
  redis.call('HSET', meta, gen.id, shards)
  -- It outlives the shards of this generation, which takes entries for a day at most.
  redis.call('EXPIRE', meta, keep_s + BOOK_GEN_S + 60)
  table.insert(gens, 1, gen)
  return gen
end

-- Note a new entry in shard `key` of generation `gen`: the shard lives keep_s from now.
local function book_added(prefix, gen, key, keep_s)
  redis.call('EXPIRE', key, keep_s)
  redis.call('HINCRBY', prefix .. BOOK_GENS, gen.id .. ':n', 1)
  gen.n = gen.n + 1
end
