-- pause_human: a human takes a person's conversation over: the bot sends nothing to them until
-- the pause lapses (PX) or is lifted (resume_human.lua). Messages keep arriving in `pending`;
-- claim.lua moves the person's due time to the pause's end. A turn already running is not
-- stopped: it ends as it would have (docs/operating.md "Human takeover").
--
-- KEYS[1] stats        HASH: counters (human_pauses)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] by           who paused (an operator's name, "cli", ...)
-- ARGV[4] why          why, for the people reading it
-- ARGV[5] pause_ms     how long the pause lasts (replaces one that is there)
--
-- Returns the pause's JSON {by, why, since_ms, until_ms} (Redis clock).
--
-- uses: lib/clock.lua (now_ms)
-- uses: lib/human.lua (set_human_pause)
redis.call('HINCRBY', KEYS[1], 'human_pauses', 1)
return set_human_pause(ARGV[1], ARGV[2], ARGV[3], ARGV[4], now_ms(), tonumber(ARGV[5]), false)
