-- deadletter: keep signed bodies that could not be understood, whole, within bounds: the
-- newest `max_count` bodies in at most `max_bytes` of Redis memory, the oldest dropped first,
-- the list expiring `ttl_ms` after its last body (DEADLETTER_* settings). Pushing and trimming
-- are one step, so the list is never seen above its bounds.
--
-- KEYS[1] deadletter   LIST: the bodies, newest first
-- ARGV[1] max_count    bodies kept at most
-- ARGV[2] max_bytes    memory the list may use (MEMORY USAGE); the newest body stays anyway
-- ARGV[3] ttl_ms       how long the list lives after its last body
-- ARGV[4..] bodies     the bodies to add, oldest first
--
-- Returns how many of the oldest bodies were dropped to stay within the bounds.
-- MEMORY USAGE with SAMPLES 0 visits every node of the list (big bodies have one each): some
-- microseconds for a thousand. Where a provider disables the command, only the count and the
-- expiry bound the list.
--
-- uses: none
local list = KEYS[1]
local max_count, max_bytes, ttl_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i = 4, #ARGV do
  redis.call('LPUSH', list, ARGV[i])
end

local function memory_used()
  local used = redis.pcall('MEMORY', 'USAGE', list, 'SAMPLES', '0')
  if type(used) ~= 'number' then
    return 0 -- the command is disabled here: no bound by memory
  end
  return used
end

local length = redis.call('LLEN', list)
local used = memory_used()
local dropped = 0
while length > 1 and (length > max_count or used > max_bytes) do
  redis.call('RPOP', list)
  length = length - 1
  dropped = dropped + 1
  if used > max_bytes then
    used = memory_used()
  end
end
redis.call('PEXPIRE', list, ttl_ms)
return dropped
