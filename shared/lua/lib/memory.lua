-- A person's memory (`c:<person>:memory`, shared/keys.py): a LIST of remembered exchanges as
-- JSON, oldest first, capped at MEMORY_TURNS and kept MEMORY_TTL after the last exchange.
--
-- uses: none

-- Append exchange `entry` (JSON) to memory list `mkey`: keep the newest `turns`, and expire
-- the list `ttl_ms` after this exchange. Trimmed only when the push made it longer than
-- `turns` (a push mostly does not: one command less).
local function remember(mkey, entry, turns, ttl_ms)
  if redis.call('RPUSH', mkey, entry) > turns then
    redis.call('LTRIM', mkey, -turns, -1)
  end
  redis.call('PEXPIRE', mkey, ttl_ms)
end
