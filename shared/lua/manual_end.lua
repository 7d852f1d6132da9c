-- manual_end: end a reply by hand (manual_begin.lua): record what went out, or only release
-- the lock when nothing did.
--
-- KEYS[1] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[2] burst        HASH: the release before's bursts (lib/burst.lua: their shards now)
-- KEYS[3] stats        HASH: counters
-- KEYS[4] conversations  ZSET: person -> ms of the last activity ("sent": the reply is some)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] outbound_prefix  the tenant's outbound record prefix ("wa:{t}:out:")
-- ARGV[3] person
-- ARGV[4] token        the reply's lock token
-- ARGV[5] outcome      "sent": parts went out; "release": nothing did, only unlock
-- ARGV[6] reply_id     the reply's id, the `batch` of its outbound records
-- ARGV[7] remember     the exchange to append to the memory (JSON, "" for none)
-- ARGV[8] memory_turns  how many exchanges memory keeps
-- ARGV[9] memory_ttl_ms  how long memory lives after the last exchange
-- ARGV[10] outbound_ttl_s  how long an outbound record lives
-- ARGV[11] window_ms   the debounce window
-- ARGV[12] max_wait_ms  how long a burst waits at most
-- ARGV[13] since_ms    Redis's clock when the lock was taken: what is still pending arrived
--         after it
-- ARGV[14] answered    JSON array of the ids of the messages the reply answers
-- ARGV[15] pause_ms    how long a reply that went out pauses the bot for the person
--         (HUMAN_PAUSE_S; extends a shorter pause, never shortens one; 0: no pause)
-- ARGV[16] by          who replied (the pause's `by`)
-- ARGV[17..] provider_ids  the provider's id of each part sent, in order ("" for none)
--
-- "sent" records an outbound record per part (as record_part.lua does, so delivery statuses
-- apply), appends the exchange to the memory, counts stats manual_replies and pauses the bot
-- for the person (ARGV[15]), whatever
-- became of the lock (the parts did go out); holding the lock, it also takes the answered
-- messages out of the pending list and reschedules what is left (a burst from since_ms on)
-- or drops the due and burst entries when nothing is left, as finish.lua and claim.lua keep
-- them (a batch requeued meanwhile is due now), then releases the lock. "release" deletes the
-- lock if this token holds it, and reschedules what waits the same way (a worker's claim put
-- it off while the lock was held).
--
-- Returns {held, taken}: held 1 when the token still held the lock (0: its lease ended;
-- nothing pending was touched), taken how many pending messages were answered.
--
-- uses: lib/keys.lua (conv_key, PENDING, BATCH, LOCK, MEMORY)
-- uses: lib/clock.lua (now_ms)
-- uses: lib/outbound.lua (record_outbound)
-- uses: lib/human.lua (set_human_pause)
-- uses: lib/memory.lua (remember)
-- uses: lib/burst.lua (burst_get, burst_set, burst_del)
local prefix, person, token = ARGV[1], ARGV[3], ARGV[4]
local lock = conv_key(prefix, person, LOCK)
local held = redis.call('GET', lock) == token
local pkey = conv_key(prefix, person, PENDING)
local now = now_ms()

-- After the lock: what waits is due as its burst says (a claim during the reply put it off to
-- the lock's end); `since`: what waits arrived after it. A batch requeued during the reply
-- (review_act.lua) is due now; nothing waiting, no due or burst entry.
local function reschedule(since)
  if redis.call('EXISTS', conv_key(prefix, person, BATCH)) == 1 then
    redis.call('ZADD', KEYS[1], now, person)
    return
  end
  local b, shard = burst_get(KEYS[2], person)
  if redis.call('EXISTS', pkey) == 0 then
    burst_del(KEYS[2], person)
    redis.call('ZREM', KEYS[1], person)
    return
  end
  local first, last = since > 0 and since or now, now
  if b then
    local f, l = string.match(b, '^(%d+),(%d+)$')
    first, last = math.max(tonumber(f), since), tonumber(l)
    if last < first then last = first end
  end
  burst_set(KEYS[2], person, first, last, shard)
  redis.call('ZADD', KEYS[1], math.min(last + tonumber(ARGV[11]), first + tonumber(ARGV[12])),
    person)
end

if ARGV[5] ~= 'sent' then
  if not held then return {0, 0} end
  redis.call('DEL', lock)
  reschedule(0)
  return {1, 0}
end
for i = 17, #ARGV do
  if ARGV[i] ~= '' then
    record_outbound(prefix, KEYS[3], ARGV[2], ARGV[i], ARGV[6], person, i - 17, ARGV[10], now)
  end
end
if ARGV[7] ~= '' and tonumber(ARGV[8]) > 0 then
  remember(conv_key(prefix, person, MEMORY), ARGV[7], tonumber(ARGV[8]), ARGV[9])
end
redis.call('HINCRBY', KEYS[3], 'manual_replies', 1)
redis.call('ZADD', KEYS[4], now, person)
-- A person of the business is talking with the customer: the bot waits (human takeover).
if tonumber(ARGV[15]) > 0 then
  set_human_pause(prefix, person, ARGV[16], 'a person of the business replied by hand', now,
    tonumber(ARGV[15]), true)
end
if not held then return {0, 0} end
redis.call('DEL', lock)

-- The answered messages leave the pending list; an edit put in place of one during the reply
-- goes with it (matched on the id it edits). What is left arrived during the reply.
local answered = {}
for _, id in ipairs(cjson.decode(ARGV[14])) do answered[id] = true end
local kept, taken = {}, 0
for _, item in ipairs(redis.call('LRANGE', pkey, 0, -1)) do
  local ok, obj = pcall(cjson.decode, item)
  if ok and type(obj) == 'table' and (answered[obj.id] or answered[obj.target or '']) then
    taken = taken + 1
  else
    table.insert(kept, item)
  end
end
if taken > 0 then
  redis.call('DEL', pkey)
  for _, item in ipairs(kept) do redis.call('RPUSH', pkey, item) end
end
reschedule(tonumber(ARGV[13]))
return {1, taken}
