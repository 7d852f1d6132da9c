-- finish: end a turn as its lock holder: done, retry later, or park for review.
--
-- KEYS[1] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[2] running      ZSET: person -> when the running turn's lease ends (ms)
-- KEYS[3] burst        HASH: the release before's bursts (lib/burst.lua: their shards now)
-- KEYS[4] review       HASH: batch id -> review item
-- KEYS[5] stats        HASH: counters
-- KEYS[6] conversations  ZSET: person -> ms of the last activity (done: the reply is some)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] window_ms    the debounce window
-- ARGV[3] max_wait_ms  how long a burst waits at most
-- ARGV[4] memory_turns  how many exchanges memory keeps
-- ARGV[5] memory_ttl_ms  how long memory lives after the last turn
-- ARGV[6] outbound_prefix  the tenant's outbound record prefix ("wa:{t}:out:")
-- ARGV[7] outbound_ttl_s  how long the outbound record lives
-- ARGV[8] review_notify  the tenant's review notification queue ("" when no review webhook
--         is configured: nothing queued; lib/review.lua)
-- (The tenant's values come first: a turn's caller sends them packed once,
-- shared/storage/scripts.py BoundCall.)
-- ARGV[9..] turns[person, token, outcome, delay_ms_or_reason, error_or_item, remember, last_part, last_part_id, unknown, count_attempt, figures]
--   the turns to end, each:
--   person
--   token       the lock token of the turn
--   outcome     "done" | "retry" | "review"
--   delay_ms_or_reason  retry: the delay in ms; review: the reason (counted in stats)
--   error_or_item  retry: the error text; review: the review item (JSON); an item with
--               `human_pause_ms` also pauses the bot for the person that long
--               (lib/human.lua; a longer pause is kept), by "review:<reason>"
--   remember    done: the exchange to remember (JSON, "" for none)
--   last_part   done: index of the reply's last part, sent but not yet recorded ("" for none)
--   last_part_id  its provider message id
--   unknown     review: what of the batch has an unknown outcome, comma-separated ("part",
--               "template", "note", "hand_over"; "" for nothing), each counted as
--               unknown:<what>
--   count_attempt  retry: "1" counts the attempt (attempt + 1, stats retries), "0" does not:
--               the batch waits for the AI, which failed as a whole (stats ai_waits)
--   figures     "<field> <increment> ..." the turn's figures, added to stats whatever the
--               outcome, once the turn ended (shared/fleet/turn_figures.py): the AI calls',
--               sends' and tokens'
-- (Recording the last part and the figures here, instead of in record_part.lua and a round of
-- HINCRBYs after the finish, saves two round trips per turn, and a turn whose finish released
-- the lock has nothing left to write: the lease renewal can never stop it half-way. The
-- worker ends the turns of one tenant that meet in a round with one call
-- (shared/storage/group_commit.py `submit_grouped`): the call's own cost, the tenant's values
-- and one HINCRBY per stats field are paid once for them all, not per turn.)
--
-- Returns one element per turn: 1, or 0 when its token does not hold the lock (lease lost:
-- nothing of that turn changed, its figures not added), or an error reply for a turn that
-- failed on its values (what it wrote before is kept, as a failed script's always was).
--
-- uses: lib/keys.lua (conv_key, PENDING, BATCH, LOCK, MEMORY, LATE)
-- uses: lib/clock.lua (now_ms_text)
-- uses: lib/outbound.lua (recorded_batch, record_outbound, start_late_job, RB_ID)
-- uses: lib/review.lua (add_review_item)
-- uses: lib/human.lua (set_human_pause)
-- uses: lib/memory.lua (remember)
-- uses: lib/burst.lua (burst_get)
local prefix = ARGV[1]
-- Written twice on a done turn (`conversations`, the record's sent time): its text made once,
-- of TIME's digits, as a number's text costs a printf each time it is made (lib/text.lua).
local now, now_text = now_ms_text()
-- What the turns add to stats, by field: one HINCRBY per field once they are all through.
local added = {}
local function add(field, n)
  added[field] = (added[field] or 0) + n
end
-- The people whose turn ended (they leave `running`) and those done (`conversations` at now):
-- one ZREM and one ZADD for the call once every turn is through, not one each a turn (nothing
-- a turn does reads either key).
local ended_people, done_people = {}, {}

local function finish_turn(person, token, outcome, delay_or_reason, error_or_item, remember_entry,
    last_part, last_part_id, unknown, count_attempt)
  local lock = conv_key(prefix, person, LOCK)
  if redis.call('GET', lock) ~= token then return 0 end
  local bkey = conv_key(prefix, person, BATCH)

  ended_people[#ended_people + 1] = person
  if outcome == 'retry' then
    redis.call('DEL', lock)
    if count_attempt == '0' then
      add('ai_waits', 1)
    else
      redis.call('HINCRBY', bkey, 'attempt', '1')
      add('retries', 1)
    end
    redis.call('HSET', bkey, 'last_error', error_or_item, 'token', '')
    redis.call('ZADD', KEYS[1], now + tonumber(delay_or_reason), person)
    return 1
  end
  if outcome == 'review' then
    add_review_item(KEYS[4], KEYS[5], ARGV[8], redis.call('HGET', bkey, 'id'), error_or_item,
      person, delay_or_reason, now)
    -- Decoded only when it may ask for a pause (most reviews do not).
    local ok, item = false, nil
    if string.find(error_or_item, '"human_pause_ms":', 1, true) then
      ok, item = pcall(cjson.decode, error_or_item)
    end
    if ok and type(item) == 'table' and tonumber(item.human_pause_ms) then
      local why = type(item.error) == 'string' and string.sub(item.error, 1, 300) or ''
      set_human_pause(prefix, person, 'review:' .. delay_or_reason, why, now,
        tonumber(item.human_pause_ms), true)
    end
    for what in string.gmatch(unknown, '[^,]+') do
      add('unknown:' .. what, 1)
    end
  else
    add('turns', 1)
    done_people[#done_people + 1] = now_text
    done_people[#done_people + 1] = person
    if last_part ~= '' and last_part_id ~= '' then
      local b = recorded_batch(bkey)
      record_outbound(prefix, add, ARGV[6], last_part_id, b[RB_ID], person, last_part,
        ARGV[7], now, b, now_text)
    end
    if remember_entry ~= '' then
      local turns = tonumber(ARGV[4])
      if turns > 0 then remember(conv_key(prefix, person, MEMORY), remember_entry, turns, ARGV[5]) end
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
    redis.call('ZADD', KEYS[1], math.min(last + tonumber(ARGV[2]), first + tonumber(ARGV[3])),
      person)
  end
  return 1
end

-- One turn's error (a bad value) is that turn's answer, an error reply in its place: the
-- turns ended with it in the same call are not failed with it.
local ended = {}
for i = 9, #ARGV, 11 do
  local ok, held = pcall(finish_turn, unpack(ARGV, i, i + 9))
  if not ok then
    held = redis.error_reply(type(held) == 'table' and tostring(held.err) or tostring(held))
  elseif held == 1 then
    for field, n in string.gmatch(ARGV[i + 10], '(%S+) (%S+)') do
      add(field, tonumber(n))
    end
  end
  ended[#ended + 1] = held
end
-- (A call ends MAX_GROUP turns at most, shared/storage/group_commit.py: far below what
-- unpack's stack takes.)
if #ended_people > 0 then redis.call('ZREM', KEYS[2], unpack(ended_people)) end
if #done_people > 0 then redis.call('ZADD', KEYS[6], unpack(done_people)) end
for field, n in pairs(added) do
  redis.call('HINCRBY', KEYS[5], field, n)
end
return ended
