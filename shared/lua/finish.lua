-- finish: end a turn as its lock holder: done, retry later, or park for review.
--
-- KEYS[1] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[2] running      ZSET: person -> when the running turn's lease ends (ms)
-- KEYS[3] burst        HASH: the release before's bursts (lib/burst.lua: their shards now)
-- KEYS[4] review       HASH: batch id -> review item
-- KEYS[5] stats        HASH: counters
-- KEYS[6] conversations  ZSET: person -> ms of the last activity (done: the reply is some)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] token        the lock token of the turn
-- ARGV[4] outcome      "done" | "retry" | "review"
-- ARGV[5] delay_ms_or_reason  retry: the delay in ms; review: the reason (counted in stats)
-- ARGV[6] error_or_item  retry: the error text; review: the review item (JSON); an item with
--         `human_pause_ms` also pauses the bot for the person that long (lib/human.lua; a
--         longer pause is kept), by "review:<reason>"
-- ARGV[7] window_ms    the debounce window
-- ARGV[8] max_wait_ms  how long a burst waits at most
-- ARGV[9] remember     done: the exchange to remember (JSON, "" for none)
-- ARGV[10] memory_turns  how many exchanges memory keeps
-- ARGV[11] memory_ttl_ms  how long memory lives after the last turn
-- ARGV[12] last_part   done: index of the reply's last part, sent but not yet recorded
--         ("" for none)
-- ARGV[13] last_part_id  its provider message id
-- ARGV[14] outbound_prefix  the tenant's outbound record prefix ("wa:{t}:out:")
-- ARGV[15] outbound_ttl_s  how long the outbound record lives
-- ARGV[16] unknown     review: what of the batch has an unknown outcome, comma-separated
--         ("part", "template", "note", "hand_over"; "" for nothing), each counted as
--         unknown:<what>
-- ARGV[17] count_attempt  retry: "1" counts the attempt (attempt + 1, stats retries), "0"
--         does not: the batch waits for the AI, which failed as a whole (stats ai_waits)
-- ARGV[18] review_notify  the tenant's review notification queue ("" when no review webhook
--         is configured: nothing queued; lib/review.lua)
-- ARGV[19..] figures[field, increment]  the turn's figures, added to stats whatever the
--         outcome (shared/fleet/turn_figures.py): the AI calls', sends' and tokens' fields
-- (Recording the last part and the figures here, instead of in record_part.lua and a round of
-- HINCRBYs after the finish, saves two round trips per turn, and a turn whose finish released
-- the lock has nothing left to write: the lease renewal can never stop it half-way.)
--
-- Returns 1, or 0 when the token does not hold the lock (lease lost: change nothing).
--
-- uses: lib/keys.lua (conv_key, PENDING, BATCH, LOCK, MEMORY, LATE)
-- uses: lib/clock.lua (now_ms_text)
-- uses: lib/outbound.lua (recorded_batch, record_outbound, start_late_job, RB_ID)
-- uses: lib/review.lua (add_review_item)
-- uses: lib/human.lua (set_human_pause)
-- uses: lib/memory.lua (remember)
-- uses: lib/burst.lua (burst_get)
local prefix, person, token, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lock = conv_key(prefix, person, LOCK)
if redis.call('GET', lock) ~= token then return 0 end
-- Written twice on a done turn (`conversations`, the record's sent time): its text made once,
-- of TIME's digits, as a number's text costs a printf each time it is made (lib/text.lua).
local now, now_text = now_ms_text()
local bkey = conv_key(prefix, person, BATCH)
for i = 19, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[5], ARGV[i], ARGV[i + 1])
end

redis.call('ZREM', KEYS[2], person)
if outcome == 'retry' then
  redis.call('DEL', lock)
  if ARGV[17] == '0' then
    redis.call('HINCRBY', KEYS[5], 'ai_waits', '1')
  else
    redis.call('HINCRBY', bkey, 'attempt', '1')
    redis.call('HINCRBY', KEYS[5], 'retries', '1')
  end
  redis.call('HSET', bkey, 'last_error', ARGV[6], 'token', '')
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), person)
  return 1
end
if outcome == 'review' then
  add_review_item(KEYS[4], KEYS[5], ARGV[18], redis.call('HGET', bkey, 'id'), ARGV[6], person,
    ARGV[5], now)
  -- Decoded only when it may ask for a pause (most reviews do not).
  local ok, item = false, nil
  if string.find(ARGV[6], '"human_pause_ms":', 1, true) then
    ok, item = pcall(cjson.decode, ARGV[6])
  end
  if ok and type(item) == 'table' and tonumber(item.human_pause_ms) then
    local why = type(item.error) == 'string' and string.sub(item.error, 1, 300) or ''
    set_human_pause(prefix, person, 'review:' .. ARGV[5], why, now, tonumber(item.human_pause_ms),
      true)
  end
  for what in string.gmatch(ARGV[16] or '', '[^,]+') do
    redis.call('HINCRBY', KEYS[5], 'unknown:' .. what, '1')
  end
else
  redis.call('HINCRBY', KEYS[5], 'turns', '1')
  redis.call('ZADD', KEYS[6], now_text, person)
  if ARGV[12] and ARGV[12] ~= '' and ARGV[13] ~= '' then
    local b = recorded_batch(bkey)
    record_outbound(prefix, KEYS[5], ARGV[14], ARGV[13], b[RB_ID], person, ARGV[12], ARGV[15],
      now, b, now_text)
  end
  if ARGV[9] and ARGV[9] ~= '' then
    local turns = tonumber(ARGV[10])
    if turns > 0 then remember(conv_key(prefix, person, MEMORY), ARGV[9], turns, ARGV[11]) end
  end
end
-- The lock and the batch go in one command (nothing this script calls above reads either).
redis.call('DEL', lock, bkey)
-- A late delivery failure queued meanwhile runs next, as a batch (lib/outbound.lua); the
-- messages waiting are scheduled when it ends. Mostly there is neither: one command says so.
local pkey = conv_key(prefix, person, PENDING)
if redis.call('EXISTS', conv_key(prefix, person, LATE), pkey) == 0 then return 1 end
if start_late_job(prefix, person, KEYS[1], now, true) then return 1 end
-- Messages that arrived during the turn form the next batch, due as their burst says
-- (possibly already due).
if redis.call('EXISTS', pkey) == 1 then
  local b = burst_get(KEYS[3], person)
  local first, last = now, now
  if b then
    local f, l = string.match(b, '^(%d+),(%d+)$')
    first, last = tonumber(f), tonumber(l)
  end
  redis.call('ZADD', KEYS[1], math.min(last + tonumber(ARGV[7]), first + tonumber(ARGV[8])), person)
end
return 1
