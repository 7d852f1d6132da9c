-- signin_attempt: take one sign-in attempt to the ops page for a client address and a name,
-- or refuse it while either waits out its back-off. The attempt is counted before the token
-- is checked, so a burst of concurrent guesses cannot all pass before the first failure is
-- recorded; a sign-in that succeeds deletes the counters (receiver/ops/backoff.py).
--
-- KEYS[1..] counters     HASH each: failures, until_ms (the client's, then the name's if any)
-- ARGV[1] free_attempts   attempts counted before the back-off starts
-- ARGV[2] backoff_ms      the first wait, doubling with each further attempt
-- ARGV[3] backoff_max_ms  the longest wait; counters outlive their last wait by as much
--
-- Returns {wait_ms, attempts}: wait_ms > 0 refuses the attempt and counts nothing (the longest
-- wait of the counters); 0 takes it. attempts: the most failures any counter holds.
--
-- uses: lib/clock.lua (now_ms)
local free, base, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local wait, most, counts = 0, 0, {}
for i, key in ipairs(KEYS) do
  local got = redis.call('HMGET', key, 'failures', 'until_ms')
  counts[i] = tonumber(got[1]) or 0
  most = math.max(most, counts[i])
  wait = math.max(wait, (tonumber(got[2]) or 0) - now)
end
if wait > 0 then
  return {wait, most}
end
for i, key in ipairs(KEYS) do
  local failures = counts[i] + 1
  local delay = 0
  if failures >= free then
    delay = math.floor(math.min(cap, base * 2 ^ (failures - free)))
  end
  redis.call('HSET', key, 'failures', failures, 'until_ms', now + delay)
  redis.call('PEXPIRE', key, delay + cap)
  most = math.max(most, failures)
end
return {0, most}
