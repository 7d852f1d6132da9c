-- resume_human: lift a person's pause (pause_human.lua, an echo, a review): the bot may answer
-- them again. What waits for them is made due now, in the same step, so no claim can see the
-- pause gone and the old due time (up to the pause's end) still set.
--
-- KEYS[1] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[2] running      ZSET: person -> when the running turn's lease ends (ms)
-- KEYS[3] stats        HASH: counters (human_resumes)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
--
-- Returns {paused, due}: paused 1 when there was a pause (0: nothing changed), due 1 when
-- messages or a batch wait and were made due now (the caller relays the tenant to a worker).
--
-- uses: lib/keys.lua (conv_key, HUMAN)
-- uses: lib/clock.lua (now_ms)
-- uses: lib/human.lua (make_due_after_resume)
local prefix, person = ARGV[1], ARGV[2]
if redis.call('DEL', conv_key(prefix, person, HUMAN)) == 0 then return {0, 0} end
redis.call('HINCRBY', KEYS[3], 'human_resumes', 1)
return {1, make_due_after_resume(prefix, person, KEYS[1], KEYS[2], now_ms())}
