-- The burst of a person's waiting messages: "first_ms,last_ms", Redis's clock when the first
-- and the latest of them were taken in (claim.lua), from which they are due: a window after
-- the last, never later than max wait after the first (invariant 5). One field of a small hash
-- among the tenant's 1 000 shards (shared/conversation/burst_shards.py, `wa:{t}:burst:<nnn>`):
-- field = the person, value as it was. One hash of every person (`wa:{t}:burst`, the release
-- before) is a hash table past 128 fields, 93 B of used_memory a waiting person; a shard holds
-- about 10 people at 10 000 waiting (a listpack: the person as an integer and the value,
-- ~39 B), and a person costs 54 B with their share of the shard's key
-- (docs/benchmarks/memory.md). Past 128 people a shard (about 128 000 waiting) becomes a hash
-- table, as the one hash was.
--
-- Upgrading: the one hash of the release before (the `burst` key the scripts are given) is
-- still read, and a person's field there is moved to the shard at its next write, or deleted
-- with the burst; a call asks once whether it exists (it is gone once every burst of the
-- release before was claimed).
--
-- uses: none

local burst_legacy_of = {}  -- the one hash of the release before -> whether it exists

-- A call begins: ask again whether the old hash exists (a function library keeps this table
-- between calls).
local function burst_new_call()
  burst_legacy_of = {}
end

-- The shard of `person` among the bursts of `key` (the tenant's `burst` key): a person whose
-- last three characters are digits (a phone number: they spread people evenly) by those
-- three, with no number or SHA-1 made on the intake's path (tonumber and string.format cost
-- the claim 2 % of its instructions); any other person by its SHA-1, modulo 1 000.
local function burst_shard(key, person)
  local a, b, c = string.byte(person, -3, -1)
  if c and a >= 48 and a <= 57 and b >= 48 and b <= 57 and c >= 48 and c <= 57 then
    return key .. ':' .. string.sub(person, -3)
  end
  local n = tonumber(string.sub(redis.sha1hex(person), 1, 8), 16)
  return key .. ':' .. string.format('%03d', n % 1000)
end

local function burst_legacy(key)
  local exists = burst_legacy_of[key]
  if exists == nil then
    exists = redis.call('EXISTS', key) == 1
    burst_legacy_of[key] = exists
  end
  return exists
end

-- `person`'s burst ("first_ms,last_ms"), or nil when nothing of theirs waits; and the key
-- of their shard.
local function burst_get(key, person)
  local shard = burst_shard(key, person)
  local b = redis.call('HGET', shard, person)
  if not b and burst_legacy(key) then b = redis.call('HGET', key, person) end
  return b, shard
end

-- Write `person`'s burst (`shard`: their shard's key when the caller has it).
local function burst_set(key, person, first, last, shard)
  redis.call('HSET', shard or burst_shard(key, person), person, first .. ',' .. last)
  if burst_legacy(key) then redis.call('HDEL', key, person) end
end

-- Nothing of `person`'s waits any more; returns how many entries were deleted (0 or 1).
local function burst_del(key, person)
  local n = redis.call('HDEL', burst_shard(key, person), person)
  if burst_legacy(key) then n = n + redis.call('HDEL', key, person) end
  return n
end
