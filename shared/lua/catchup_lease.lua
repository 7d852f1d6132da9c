-- catchup_lease: renew, hand back or release the Chatwoot catch-up's lock, only for its holder.
--
-- KEYS[1] lock         STRING: token of the worker running the catch-up (PX)
-- ARGV[1] token        the caller's token
-- ARGV[2] lease_ms     the new lease from now; 0 releases the lock
-- ARGV[3] hold_as      "" keeps the token (a renewal); else the lock's new value for the lease:
--         nobody's token, so no worker (the caller neither) runs before it lapses (a backoff)
--
-- Returns 1 when the caller held the lock (renewed, held or released), 0 when it did not (it
-- expired, or another worker holds it: the caller must stop its run).
--
-- uses: none
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local lease = tonumber(ARGV[2])
if lease <= 0 then
  redis.call('DEL', KEYS[1])
elseif ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', lease)
else
  redis.call('PEXPIRE', KEYS[1], lease)
end
return 1
