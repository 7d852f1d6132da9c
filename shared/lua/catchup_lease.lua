-- catchup_lease: renew or release the Chatwoot catch-up's lock, only for its holder.
--
-- KEYS[1] lock         STRING: token of the worker running the catch-up (PX)
-- ARGV[1] token        the caller's token
-- ARGV[2] lease_ms     the new lease from now; 0 releases the lock
--
-- Returns 1 when the caller held the lock (renewed or released), 0 when it did not (it
-- expired, or another worker holds it: the caller must stop its run).
--
-- uses: none
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local lease = tonumber(ARGV[2])
if lease > 0 then
  redis.call('PEXPIRE', KEYS[1], lease)
else
  redis.call('DEL', KEYS[1])
end
return 1
