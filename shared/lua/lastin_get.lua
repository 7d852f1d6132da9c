-- lastin_get: the 24-hour windows of some people, as the ops page shows them
-- (shared/ops/window.py). Reads only.
--
-- KEYS[1] lastin_gens  HASH: the generations of the tenant's book of windows (lib/book.lua)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] service_window_s  the customer-service window (86400)
-- ARGV[3..] people
--
-- Returns one {ts, closes_in_s} per person: the provider ts of their latest message and the
-- seconds until their window closes while it is open, {0, 0} once it has closed or when none
-- is known (lib/lastin.lua). A key of the release before closes when it expires.
--
-- uses: lib/keys.lua (conv_key, LASTIN)
-- uses: lib/clock.lua (now_ms)
-- uses: lib/lastin.lua (lastin_find, lastin_open)
local prefix, window = ARGV[1], tonumber(ARGV[2])
local now_s = math.floor(now_ms() / 1000)
local out = {}
for i = 3, #ARGV do
  local ts, _, legacy = lastin_find(prefix, ARGV[i], now_s, window)
  if legacy then
    out[i - 2] = {ts, math.max(0, redis.call('TTL', conv_key(prefix, ARGV[i], LASTIN)))}
  elseif lastin_open(ts, now_s, window) then
    out[i - 2] = {ts, ts + window - now_s}
  else
    out[i - 2] = {0, 0}
  end
end
return out
