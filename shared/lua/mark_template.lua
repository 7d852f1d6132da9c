-- mark_template: note on the batch, as the lock holder, that the tenant's template is going
-- out, before the request is made; or clear the note when Meta refused the template (it did
-- not go out, so a retry may send it). A retried or resumed turn reads the note back (claim.lua
-- returns the batch's fields) and never sends a second template for the batch, even when the
-- first one's answer was lost. Its wamid, once known, is recorded as a part (record_part,
-- finish), like any part's; a resumed turn that finds the noted part unrecorded knows the
-- template's outcome is unknown (shared/conversation/unknowns.py).
--
-- KEYS[1] stats        HASH: unused, it routes the call to the tenant's slot
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] token        the lock token of the turn
-- ARGV[4] mark         "1": mark, "0": clear
-- ARGV[5] part         index of the reply part the template goes out in place of
--
-- Returns 1, or 0 when the token does not hold the lock.
--
-- uses: lib/keys.lua (conv_key, BATCH, LOCK)
-- uses: lib/clock.lua (now_ms)
local prefix, person, token = ARGV[1], ARGV[2], ARGV[3]
if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return 0 end
local bkey = conv_key(prefix, person, BATCH)
if ARGV[4] == '1' then
  redis.call('HSET', bkey, 'template', '1', 'template_part', ARGV[5], 'template_ms', now_ms())
else
  redis.call('HDEL', bkey, 'template', 'template_part', 'template_ms')
end
return 1
