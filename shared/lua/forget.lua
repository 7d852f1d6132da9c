-- forget: delete one person's conversation in one step, unless a turn holds it (privacy
-- requests, shared/ops/forget.py). A message taken in at the same moment is either deleted with
-- the rest or, taken in after this script, kept whole as new data: never half of it. A batch
-- no turn holds (no lock: a retry, a late delivery failure or an AI wait parked, maybe behind
-- a human's pause) goes with the rest: a worker that lost its lease writes only under its
-- lock token, so nothing re-creates it.
--
-- KEYS[1] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[2] running      ZSET: person -> when the running turn's lease ends (ms)
-- KEYS[3] burst        HASH: the release before's bursts (lib/burst.lua: their shards now)
-- KEYS[4] users        HASH: WhatsApp user id -> the phone number of its conversation
-- KEYS[5] conversations  ZSET: person -> ms of the last activity (the ops page's inbox)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] kinds        every suffix of a conversation's keys, comma-separated
-- ARGV[4..] user_ids   users fields seen pointing at the person: deleted if they still do
--
-- Returns {state, keys deleted, due/running/burst/conversations entries and windows (the
-- book of windows' fields, lib/lastin.lua) removed, users fields removed}; state 1 done, -1 a turn holds the lock (nothing deleted then).
--
-- uses: lib/keys.lua (conv_key, LOCK)
-- uses: lib/lastin.lua (lastin_forget)
-- uses: lib/burst.lua (burst_del)
local prefix, person = ARGV[1], ARGV[2]
if redis.call('EXISTS', conv_key(prefix, person, LOCK)) == 1 then return {-1, 0, 0, 0} end
local deleted = 0
for kind in string.gmatch(ARGV[3], '[^,]+') do
  deleted = deleted + redis.call('DEL', conv_key(prefix, person, kind))
end
local entries = redis.call('ZREM', KEYS[1], person) + redis.call('ZREM', KEYS[2], person)
  + burst_del(KEYS[3], person) + redis.call('ZREM', KEYS[5], person)
  + lastin_forget(prefix, person)
-- The person's own field when the person is a user id; then every user id seen mapped to it.
local users = redis.call('HDEL', KEYS[4], person)
for i = 4, #ARGV do
  if redis.call('HGET', KEYS[4], ARGV[i]) == person then
    users = users + redis.call('HDEL', KEYS[4], ARGV[i])
  end
end
return {1, deleted, entries, users}
