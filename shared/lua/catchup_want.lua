-- catchup_want: ask for a Chatwoot catch-up of some tenants, from the earliest time asked.
--
-- KEYS[1] wanted       HASH: Chatwoot tenant -> ms from which a catch-up is owed
-- ARGV[1..] asks[tenant, since_ms]  each tenant and the time its catch-up must read back to
--
-- Returns the number of tenants whose request was added or moved earlier. A tenant already
-- asked for keeps the earlier of the two times: the catch-up must read back to the first
-- webhook that was not stored, whoever asked first.
--
-- uses: none
local changed = 0
for i = 1, #ARGV, 2 do
  local tenant, since = ARGV[i], tonumber(ARGV[i + 1])
  local current = tonumber(redis.call('HGET', KEYS[1], tenant))
  if current == nil or since < current then
    redis.call('HSET', KEYS[1], tenant, since)
    changed = changed + 1
  end
end
return changed
