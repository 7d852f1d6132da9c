-- silence: the bot handed a Chatwoot conversation over to a person (a review's hand-over, or
-- the AI's hand-over tool), so it is silent there until the conversation is `pending` again
-- or resolved (lib/silence.lua). Messages waiting for a turn join the memory instead.
--
-- KEYS[1] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[2] burst        HASH: the release before's bursts (lib/burst.lua: their shards now)
-- KEYS[3] stats        HASH: counters
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] why          what silenced it (hand_over)
-- ARGV[4] memory_ttl_s  how long the memory lives after its last line
-- ARGV[5] silence_ttl_s  how long the silence lasts after its last event
--
-- Returns 1. Idempotent: a resumed hand-over may run it again (the silence keeps its record).
--
-- uses: lib/clock.lua (now_ms)
-- uses: lib/silence.lua (silence)
local prefix, person, why = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
silence(prefix, person, {why = why, by = '', since_ms = now, since_s = math.floor(now / 1000)},
  KEYS[1], KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
redis.call('HINCRBY', KEYS[3], 'silence:' .. why, 1)
return 1
