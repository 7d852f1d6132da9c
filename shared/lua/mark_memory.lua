-- mark_memory: replace exchanges of the person's memory, as the lock holder: a late delivery
-- failure marks a reply the customer never got (worker/turn/late_failures.py).
--
-- KEYS[1] stats        HASH: unused, it routes the call to the tenant's slot
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] token        the lock token of the turn
-- ARGV[4..] entries[provider_id, entry]  each exchange that holds `provider_id` (one of its
--         reply parts) is replaced by `entry` (JSON)
--
-- Returns how many exchanges were replaced (0 when the memory no longer holds them: trimmed or
-- expired), or -1 when the token does not hold the lock. The memory's TTL is kept.
--
-- uses: lib/keys.lua (conv_key, LOCK, MEMORY)
local prefix, person, token = ARGV[1], ARGV[2], ARGV[3]
if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return -1 end
local mkey = conv_key(prefix, person, MEMORY)
local entries = redis.call('LRANGE', mkey, 0, -1)
-- Whether exchange `entry` (JSON) names `id` among its reply parts (`out`): decoded and
-- compared, never searched for in the text, where the customer's words could hold it too.
local function holds(entry, id)
  local ok, obj = pcall(cjson.decode, entry)
  if not ok or type(obj) ~= 'table' or type(obj.out) ~= 'table' then return false end
  for _, out in ipairs(obj.out) do
    if out == id then return true end
  end
  return false
end

local replaced = 0
for i = 4, #ARGV - 1, 2 do
  for at, entry in ipairs(entries) do
    if holds(entry, ARGV[i]) then
      redis.call('LSET', mkey, at - 1, ARGV[i + 1])
      entries[at] = ARGV[i + 1]
      replaced = replaced + 1
      break
    end
  end
end
return replaced
