-- claim: intake the tenant's inbox, recover expired leases, claim due conversations: due a
-- window after the last message, capped at max wait after the first (invariant 5), and never
-- while the person's previous batch holds the lock (invariants 3 and 4, docs/invariants.md).
--
-- KEYS[1] inbox        LIST: events from the receiver
-- KEYS[2] due          ZSET: person -> when the conversation is due (ms)
-- KEYS[3] running      ZSET: person -> when the running turn's lease ends (ms)
-- KEYS[4] burst        HASH: the release before's person -> "first_ms,last_ms" of waiting
--         messages; its shards ("<burst>:<n>") hold them now (lib/burst.lua)
-- KEYS[5] stats        HASH: counters (and the `layout` field, written at the first batch made)
-- KEYS[6] unroutable   LIST: inbox entries that are not ours to interpret
-- KEYS[7] users        HASH: WhatsApp user id -> the phone number it was seen with
-- KEYS[8] conversations  ZSET: person -> ms of the conversation's last activity (the ops
--         page's inbox, shared/conversation/index.py)
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:"); a
--         conversation's keys are built from it with conv_key() (same hash tag, so the same
--         slot as KEYS)
-- ARGV[2] max_claim    how many batches to claim at most (0: intake and report only)
-- ARGV[3] lease_ms     the lease of a claimed turn
-- ARGV[4] token_prefix unique per call; each claimed batch's lock gets token_prefix .. ':' .. i
-- ARGV[5] window_ms    the debounce window
-- ARGV[6] max_wait_ms  how long a burst waits at most
-- ARGV[7] max_intake   how many inbox events to take in at most in this call
-- ARGV[8] outbound_prefix  the tenant's outbound record prefix ("wa:{t}:out:"), for
--         delivery statuses
-- ARGV[9] service_window_s  the customer-service window (86400): how long a person's window
--         stays open after their latest message (lib/lastin.lua)
-- ARGV[10] early_status_ttl_s  how long a status that arrived before its outbound record
--         waits for record_part
-- ARGV[11] welcome     "1": `request_welcome` starts a turn (a welcome text is configured);
--         "0": it is only context
-- ARGV[12] context_ttl_s  how long a conversation's context list lives after its last event
-- ARGV[13] context_max  how many context items a conversation keeps (the newest)
-- ARGV[14] silence_ttl_s  how long the bot's silence in a Chatwoot conversation lasts after
--         its last event (lib/silence.lua)
-- ARGV[15] human_pause_ms  how long an echo (the business wrote from the WhatsApp Business
--         app) pauses the bot for that person (HUMAN_PAUSE_S)
-- ARGV[16] memory_turns  how many exchanges a memory keeps (an echo enters it)
-- ARGV[17] answer_by_ms  Redis's clock time after which the caller no longer waits for this
--         call's answer (0: no limit). A call Redis runs later (it was frozen, or too slow)
--         takes events in and reports but claims nothing: its locks would be held by a token
--         no turn knows until their lease ended (the worker hands back the batches of a call
--         it got no answer to, unclaim.lua, once this time has passed).
--
-- Events that are not messages (kinds "note", "revoke", "edit", "welcome"; shared/events.py)
-- never make a conversation due: a revoke takes its message out of the pending list (an
-- emptied list leaves due and burst), an edit replaces it there; when the message is no
-- longer waiting, and for every note, an item goes on the conversation's context list, which
-- the next new batch takes (field `context`, a JSON array). A number change moves the memory and
-- the window (lib/lastin.lua) to the new id. Each is counted in stats as event:<what>.
--
-- Chatwoot (lib/silence.lua): an agent's message (kind "human") and a conversation event
-- (kind "conversation") start or end the bot's silence in a conversation; while it is silent
-- the customer's messages join the memory instead of the pending list, and so do the agents'.
-- Human takeover (shared/ops/takeover.py, lib/human.lua): a due person whose `human` key exists
-- is not claimed; their due time moves to the pause's end, and their messages keep waiting.
-- An echo (kind "echo": what the business wrote from the WhatsApp Business app) pauses the
-- person, enters their memory as written by a human, takes the waiting messages with it (the
-- human answered them) and starts no turn (stats event:echo).
-- Every person something was taken in for (a message, an agent's message, an echo, a note, a
-- revoke or edit) is listed in `conversations` at now, in one ZADD for the call; a person new
-- there also trims it (older than CONVERSATIONS_KEPT_MS, past the newest CONVERSATIONS_KEPT).
-- A status moves its part's outbound record forward; a `failed` one queues a late delivery
-- failure and, when the person has no batch, makes it a batch due now (lib/outbound.lua).
--
-- Returns {now_ms, next_ms, more, b1, b2, ...} where next_ms is the earliest due time or lease
-- end still pending (-1 if none), more is 1 when the inbox was not drained (nothing was claimed:
-- a message still in the inbox may belong to a due batch, so call again), and each b is
-- {person, token, field1, value1, ...}: the batch hash, plus `last_inbound` (provider ts of
-- the person's last message, 0 if the window has closed; for a new batch whose newest message
-- is under half a window old, that message's ts: the window is open that long at least) and
-- `history` (the memory, a JSON array).
-- A batch's `context` field holds the context items it took (a JSON array). A new batch's row
-- leaves out what the hash holds besides and no reader of the row needs: `person` and `token`
-- (the row's first two), `size` and `created_ms` (read from the hash by the ops pages): eight
-- values fewer of ~26, each ~0.9k Redis instructions to reply (docs/benchmarks/worker.md).
--
-- uses: lib/keys.lua (conv_key, lastin_book, PENDING, BATCH, LOCK, MEMORY, CONTEXT, HUMAN, LASTIN)
-- uses: lib/lastin.lua (lastin_saw, lastin_get, lastin_move, lastin_legacy_possible)
-- uses: lib/lastin.lua (LASTIN_AHEAD_S)
-- uses: lib/human.lua (take_echo)
-- uses: lib/clock.lua (now_ms_text)
-- uses: lib/text.lua (int_text)
-- uses: lib/outbound.lua (apply_status)
-- uses: lib/dispatch_lag.lua (new_lags, add_lag, write_lags)
-- uses: lib/silence.lua (held_silent, take_agent_message, take_conversation_event)
-- uses: lib/silence.lua (silence_of, fold_batch)
-- uses: lib/burst.lua (burst_get, burst_set, burst_del)
local prefix, max_claim, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local window, max_wait, max_intake = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local out_prefix, service_window, early_ttl = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local welcome, context_ttl, context_max = ARGV[11] == '1', tonumber(ARGV[12]), tonumber(ARGV[13])
local human_pause, memory_turns = tonumber(ARGV[15]), tonumber(ARGV[16])
local answer_by = tonumber(ARGV[17])
-- `now` and its text (written per batch) made once.
local now, now_text = now_ms_text()
local now_s = math.floor(now / 1000)
if answer_by > 0 and now > answer_by then max_claim = 0 end
local silence_keys = {due = KEYS[2], burst = KEYS[4], stats = KEYS[5]}
local silence_ttls = {memory = context_ttl, silent = tonumber(ARGV[14])}

-- People something was taken in for in this call: listed in `conversations` at the end.
local active, n_active = {}, 0
local function touched(person)
  if not active[person] then
    active[person] = true
    n_active = n_active + 1
  end
end

-- One ZADD for every person of the call (the index of the ops page's inbox; one per 1000
-- people, as unpack's stack is limited), trimmed only when it gained a person: a call about
-- known people costs that one command.
local function list_active()
  if n_active == 0 then return end
  local args, added = {}, 0
  local function flush()
    added = added + redis.call('ZADD', KEYS[8], unpack(args))
    args = {}
  end
  for person in pairs(active) do
    args[#args + 1] = now_text
    args[#args + 1] = person
    if #args >= 2000 then flush() end
  end
  if #args > 0 then flush() end
  if added > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now - {{CONVERSATIONS_KEPT_MS}})
    redis.call('ZREMRANGEBYRANK', KEYS[8], 0, -{{CONVERSATIONS_KEPT}} - 1)
  end
end

local function next_wake()
  local d = redis.call('ZRANGE', KEYS[2], '0', '0', 'WITHSCORES')
  local r = redis.call('ZRANGE', KEYS[3], '0', '0', 'WITHSCORES')
  local best = -1
  if d[2] then best = tonumber(d[2]) end
  if r[2] and (best < 0 or tonumber(r[2]) < best) then best = tonumber(r[2]) end
  return best
end

-- Usernames: the receiver keys a WhatsApp person by the phone number when the message has one,
-- else by the business-scoped user id (`AR.4410...`, never only digits). A message carrying
-- both records user id -> number; a later one with only the user id joins the number's
-- conversation (memory, window, batch). Messages without `from_user_id` cost nothing here; one
-- with it is decoded: the id is read from the message (`raw`), never pattern-matched in the
-- JSON, where an escaped quote once cut two ids to one.
local function same_person(ev, person)
  if string.find(person, '.', 1, true) then
    return redis.call('HGET', KEYS[7], person) or person
  end
  if not string.find(ev, '"from_user_id":', 1, true) then return person end
  local ok, obj = pcall(cjson.decode, ev)
  if not ok or type(obj) ~= 'table' then return person end
  -- The receiver's event holds it in the message (`raw`); an event written by hand may hold
  -- it beside the others.
  local user_id = type(obj.raw) == 'table' and obj.raw.from_user_id or obj.from_user_id
  if type(user_id) == 'string' and user_id ~= ''
      and redis.call('HGET', KEYS[7], user_id) ~= person then
    redis.call('HSET', KEYS[7], user_id, person)
  end
  return person
end

-- `ev` is the event as stored in the pending list: without its routing prefix when it had one
-- (`slim_event`).
local function take_message(ev, person)
  redis.call('RPUSH', conv_key(prefix, person, PENDING), ev)
  local first = now
  local b, shard = burst_get(KEYS[4], person)
  if b then first = tonumber(string.match(b, '^(%d+)')) end
  burst_set(KEYS[4], person, first, now, shard)
  -- While a batch exists (running or waiting for a retry) the conversation is scheduled
  -- by finish.lua; new messages wait for the next batch.
  if redis.call('EXISTS', conv_key(prefix, person, BATCH)) == 0 then
    redis.call('ZADD', KEYS[2], math.min(now + window, first + max_wait), person)
  end
end

-- The 24-hour window runs from the person's latest message (provider clock; lib/lastin.lua).
local function saw_inbound(ev, person)
  local ts = tonumber(string.match(ev, '"ts":(%d+)'))
  if not ts then return end
  lastin_saw(prefix, person, ts, now_s, service_window)
end

-- Where message `id` waits in `key` (a list of events): its index and event, matched on the
-- event's id or, for an edit put in its place, the id it edited.
local function find_event(key, id)
  for i, item in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local ok, obj = pcall(cjson.decode, item)
    if ok and type(obj) == 'table' and (obj.id == id or obj.target == id) then
      return i - 1, obj
    end
  end
  return nil, nil
end

-- The text of message `id` when a waiting or running batch still holds it, else nil.
local function known_text(person, id)
  if id == '' then return nil end
  local _, obj = find_event(conv_key(prefix, person, PENDING), id)
  if obj then return obj.text end
  local msgs = redis.call('HGET', conv_key(prefix, person, BATCH), 'messages')
  if msgs then
    local ok, list = pcall(cjson.decode, msgs)
    if ok and type(list) == 'table' then
      for _, m in ipairs(list) do
        if type(m) == 'table' and (m.id == id or m.target == id) then return m.text end
      end
    end
  end
  return nil
end

local function add_context(person, what, obj, target_text)
  local ckey = conv_key(prefix, person, CONTEXT)
  redis.call('RPUSH', ckey, cjson.encode({
    what = what, type = obj.type, id = obj.id, text = obj.text, ts = obj.ts,
    target = obj.target, target_text = target_text, new_person = obj.new_person,
    raw = obj.raw,
  }))
  redis.call('LTRIM', ckey, -context_max, -1)
  redis.call('EXPIRE', ckey, context_ttl)
  redis.call('HINCRBY', KEYS[5], 'event:' .. what, 1)
end

-- A number change: the person's memory and window follow them to the new id (same tenant,
-- same hash tag: same slot), unless the new id already has its own.
local function change_number(old, new)
  local from = conv_key(prefix, old, MEMORY)
  if redis.call('EXISTS', from) == 1 then
    redis.call('RENAMENX', from, conv_key(prefix, new, MEMORY))
  end
  lastin_move(prefix, old, new, now_s, service_window)
end

local function take_other(kind, ev, person)
  local ok, obj = pcall(cjson.decode, ev)
  if not ok or type(obj) ~= 'table' then
    redis.call('LPUSH', KEYS[6], ev)
    return
  end
  local target = type(obj.target) == 'string' and obj.target or ''
  if obj.type ~= 'system' then saw_inbound(ev, person) end
  if kind == 'revoke' or kind == 'edit' then
    local pkey = conv_key(prefix, person, PENDING)
    local at = nil
    if target ~= '' then at = find_event(pkey, target) end
    if at then
      if kind == 'revoke' then
        redis.call('LREM', pkey, 1, redis.call('LINDEX', pkey, at))
        if redis.call('LLEN', pkey) == 0 then
          -- Nothing waits any more: no burst, and no due time unless a batch (a retry's)
          -- holds it.
          burst_del(KEYS[4], person)
          if redis.call('EXISTS', conv_key(prefix, person, BATCH)) == 0 then
            redis.call('ZREM', KEYS[2], person)
          end
        end
      else
        redis.call('LSET', pkey, at, ev)
      end
      redis.call('HINCRBY', KEYS[5], 'event:' .. kind .. '_waiting', 1)
      return
    end
    add_context(person, kind .. '_answered', obj, known_text(person, target))
    return
  end
  local what = type(obj.type) == 'string' and obj.type or 'unknown'
  if obj.type == 'interactive' then what = 'call_permission_reply' end
  if obj.type == 'system' then
    local body = type(obj.raw) == 'table' and obj.raw.system
    local sub = type(body) == 'table' and body.type
    if type(sub) == 'string' and sub ~= '' then what = sub end
    local new = obj.new_person
    if type(new) == 'string' and new ~= '' and new ~= person then
      change_number(person, new)
      person = new
    end
  end
  add_context(person, what, obj, known_text(person, target))
end

-- A message as its pending list keeps it: without the routing prefix `{"v":1,"kind":"message",
-- "person":"<person>",` the receiver put first (50 B of a 220 B text event, 3 of them about
-- 130 B of used_memory): the list's key names the person, and the version and kind are the
-- inbox's business (a WhatsApp message's event leaves out what its fields imply already: a
-- text's type, and received_ms as `rd`; shared/events.py). `after` is where the matched prefix
-- ends (nil when the event was decoded instead: kept whole). Readers of pending lists,
-- batches' `messages`, review items and the `sent` list take either form: a message's fields
-- are read by name (id, type, text, ts, ...), and its person comes from where it is kept
-- (shared/conversation/batch.py `Message.from_event`); events stored whole by the release
-- before are read as they are.
local function slim_event(ev, after)
  if after and string.byte(ev, after) == 44 then  -- ','
    -- The prefix matched again (one string made, where sub and concatenation make two).
    return (string.gsub(ev, '^{"v":%d+,"kind":"%a+","person":"[^"\\]+",', '{', 1))
  end
  return ev
end

-- The provider ts of the newest of these events (a number, and its text), when one is not
-- ahead of Redis's clock by more than LASTIN_AHEAD_S (lib/lastin.lua); else nil. Found as
-- saw_inbound finds it when the event is taken in (the first `"ts":`), by a plain search.
local function newest_ts(events)
  local best, best_text = nil, nil
  for i = 1, #events do
    local ev = events[i]
    local at = string.find(ev, '"ts":', 1, true)
    local text = at and string.match(ev, '^%d+', at + 5)
    local ts = text and tonumber(text)
    if ts and (not best or ts > best) then best, best_text = ts, text end
  end
  if best and best <= now_s + LASTIN_AHEAD_S then return best, best_text end
  return nil, nil
end

-- 1. Intake: inbox events (oldest first) into per-person pending lists.
local taken, messages, statuses = 0, 0, 0
while taken < max_intake do
  local ev = redis.call('RPOP', KEYS[1])
  if not ev then break end
  taken = taken + 1
  -- The receiver writes "v", "kind" and "person" first; match that cheaply, decode otherwise.
  -- The person must end at the first quote with no backslash before it: a JSON string
  -- without an escape is spelled exactly as its value, so the match is exact; any other
  -- person (`ab"one`, `ab\`) is decoded, never cut at an escaped quote.
  local kind, person, after = string.match(ev, '^{"v":%d+,"kind":"(%a+)","person":"([^"\\]+)"()')
  if not kind then
    local ok, obj = pcall(cjson.decode, ev)
    if ok and type(obj) == 'table' then kind, person = obj.kind, obj.person end
  end
  if kind == 'welcome' and welcome then kind = 'message' end
  local has_person = type(person) == 'string' and person ~= ''
  if kind == 'message' and has_person then
    messages = messages + 1
    person = same_person(ev, person)
    if not held_silent(prefix, person, ev, KEYS[5], context_ttl, silence_ttls.silent) then
      take_message(slim_event(ev, after), person)
    end
    saw_inbound(ev, person)
    touched(person)
  elseif has_person and kind == 'human' then
    if take_agent_message(prefix, out_prefix, person, ev, silence_keys, now, silence_ttls) then
      touched(person)
    else
      redis.call('LPUSH', KEYS[6], ev)
    end
  elseif has_person and kind == 'conversation' then
    if not take_conversation_event(prefix, person, ev, silence_keys, now, silence_ttls) then
      redis.call('LPUSH', KEYS[6], ev)
    end
  elseif kind == 'status' then
    statuses = statuses + 1
    -- Delivery statuses and late delivery failures: lib/outbound.lua.
    apply_status(prefix, out_prefix, KEYS[5], KEYS[2], ev, early_ttl, now)
  elseif kind == 'echo' and has_person then
    person = same_person(ev, person)
    take_echo(KEYS[2], KEYS[4], KEYS[5], prefix, ev, person, now, human_pause, memory_turns,
      context_ttl)
    touched(person)
  elseif has_person and (kind == 'note' or kind == 'revoke' or kind == 'edit'
      or kind == 'welcome') then
    take_other(kind, ev, person)
    touched(person)
  else
    -- Not ours to interpret: keep it whole for an operator instead of dropping it.
    redis.call('LPUSH', KEYS[6], ev)
  end
end
if messages > 0 then redis.call('HINCRBY', KEYS[5], 'messages', int_text(messages)) end
list_active()
if statuses > 0 then redis.call('HINCRBY', KEYS[5], 'statuses', int_text(statuses)) end
if taken >= max_intake and redis.call('LLEN', KEYS[1]) > 0 then
  return {now, next_wake(), 1}
end

-- 2. Leases that ended without a finish: the holder died. Make the batch due again now;
--    step 3 resumes it (same messages, same attempt count).
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_text, 'LIMIT', '0', '1000')
for _, person in ipairs(expired) do
  if redis.call('EXISTS', conv_key(prefix, person, LOCK)) == 0 then
    redis.call('ZREM', KEYS[3], person)
    redis.call('ZADD', KEYS[2], now, person)
    redis.call('HINCRBY', KEYS[5], 'leases_expired', '1')
  end
end

-- 3. Claim due conversations whose lock is free.
-- Numbers written per batch, turned into text once (a number's text costs Redis a printf;
-- lib/text.lua).
local lease_end = tostring(now + lease)
local out = {now, -1, 0}
local lags = new_lags()
local batches_base, new_batches = nil, 0
-- What every claimed batch writes alike goes in one command at the end of the call (its
-- effects are the same, and nothing of the call reads them meanwhile): the claimed people's
-- lease ends in `running` (lease_end, person, ...), and the pending lists they took. Each is
-- sent early when it grows past 1000 arguments (unpack's stack is limited).
local leases, taken_lists = {}, {}
local function add_leases(last)
  local n = #leases
  if n == 0 or (not last and n < 1000) then return end
  -- The last claimed first: the batches of one claim share their lease end, and a small
  -- sorted set (a listpack) places a member among equal scores by comparing it with each one
  -- it follows; added in reverse, the people of a claim (in order of due time, then name)
  -- mostly land first among their equals, after one comparison.
  local reversed = {}
  for k = n - 1, 1, -2 do
    reversed[n - k], reversed[n - k + 1] = leases[k], leases[k + 1]
  end
  redis.call('ZADD', KEYS[3], unpack(reversed))
  leases = {}
end
local function delete_taken(last)
  if #taken_lists == 0 or (not last and #taken_lists < 1000) then return end
  redis.call('DEL', unpack(taken_lists))
  taken_lists = {}
end
-- While a window key of the release before may be left (lib/lastin.lua: for two days after
-- the tenant's book began), a batch's look for its keys below asks for it too (found out at
-- the first batch).
local legacy_lastin = nil
if max_claim > 0 then
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_text, 'WITHSCORES', 'LIMIT', '0',
    ARGV[2])
  -- Every person found leaves `due` in one command (a ZREM each was a command a turn); one
  -- still held is put back below (ZADD at the held lock's or pause's end).
  local found = {}
  for j = 1, #due, 2 do
    found[#found + 1] = due[j]
    if #found >= 1000 then
      redis.call('ZREM', KEYS[2], unpack(found))
      found = {}
    end
  end
  if #found > 0 then redis.call('ZREM', KEYS[2], unpack(found)) end
  for j = 1, #due, 2 do
    local person, due_ms, i = due[j], due[j + 1], (j + 1) / 2
    local lock, hkey = conv_key(prefix, person, LOCK), conv_key(prefix, person, HUMAN)
    local bkey, ckey = conv_key(prefix, person, BATCH), conv_key(prefix, person, CONTEXT)
    -- Mostly none of the lock, a pause, a batch (a retry's) and context exists: one command
    -- says so, where asking each was three (a person with any of them costs one more); so
    -- for the window key of the release before, while one may be left.
    local none, no_legacy
    if legacy_lastin == nil then
      legacy_lastin = lastin_legacy_possible(lastin_book(prefix), now_s, service_window)
    end
    if legacy_lastin then
      none = redis.call('EXISTS', lock, hkey, bkey, ckey, conv_key(prefix, person, LASTIN)) == 0
      no_legacy = none
      if not none then none = redis.call('EXISTS', lock, hkey, bkey, ckey) == 0 end
    else
      none = redis.call('EXISTS', lock, hkey, bkey, ckey) == 0
    end
    local pttl, held = -2, -2
    if not none and redis.call('EXISTS', lock, hkey) > 0 then
      pttl, held = redis.call('PTTL', lock), redis.call('PTTL', hkey)
    end
    if pttl ~= -2 then
      -- Still held (should not happen: a running conversation is not in due). Look again
      -- when that lease ends rather than spinning on it.
      if pttl < 0 then pttl = lease end
      redis.call('ZADD', KEYS[2], now + pttl, person)
    elseif held ~= -2 then
      -- A human has this conversation: no turn. Due again when the pause ends (resume_human
      -- makes it due at once); the messages keep waiting in `pending`.
      if held < 0 then held = lease end
      redis.call('ZADD', KEYS[2], now + held, person)
    else
      local ok, fresh = true, nil
      if none or redis.call('EXISTS', bkey) == 0 then
        local pkey = conv_key(prefix, person, PENDING)
        local msgs = redis.call('LRANGE', pkey, '0', '-1')
        burst_del(KEYS[4], person)
        if #msgs == 0 then
          ok = false
        else
          taken_lists[#taken_lists + 1] = pkey
          delete_taken(false)
          -- Batch ids number on from `batches`, counted once at the end of the call.
          if not batches_base then
            -- With the stats hash's layout field: the first claim of a tenant writes it, so
            -- the turns' HINCRBYs find their fields in a hash table (shared/fleet/
            -- stats_hash.py), at no extra command a call.
            local got = redis.call('HMGET', KEYS[5], 'batches', '{{STATS_LAYOUT_FIELD}}')
            batches_base = tonumber(got[1] or '0')
            if not got[2] then
              redis.call('HSET', KEYS[5], '{{STATS_LAYOUT_FIELD}}', '{{STATS_LAYOUT}}')
            end
          end
          new_batches = new_batches + 1
          local seq = batches_base + new_batches
          local context = '[]'
          if not none then
            local items = redis.call('LRANGE', ckey, '0', '-1')
            if #items > 0 then
              redis.call('DEL', ckey)
              context = '[' .. table.concat(items, ',') .. ']'
            end
          end
          fresh = {now_text .. '-' .. int_text(seq), int_text(#msgs),
            '[' .. table.concat(msgs, ',') .. ']', context, newest_ts(msgs)}
        end
      elseif silence_of(prefix, person) and fold_batch(prefix, person, context_ttl) then
        ok = false  -- a retry of a Chatwoot conversation a person took over meanwhile
        redis.call('HINCRBY', KEYS[5], 'silent_batches', '1')
      end
      if ok then
        local token = ARGV[4] .. ':' .. int_text(i)
        redis.call('SET', lock, token, 'PX', ARGV[3])
        leases[#leases + 1], leases[#leases + 2] = lease_end, person
        add_leases(false)
        local b
        if fresh then
          -- A new batch is written once, and its row built from what was written (no
          -- HGETALL): the claim's cost per batch is most of a turn's Redis CPU.
          local id, size, messages, context = fresh[1], fresh[2], fresh[3], fresh[4]
          redis.call('HSET', bkey, 'id', id, 'person', person, 'attempt', '0',
            'created_ms', now_text, 'size', size, 'messages', messages, 'context', context,
            'token', token, 'claimed_ms', now_text, 'due_ms', due_ms)
          b = {person, token, 'id', id, 'attempt', '0', 'messages', messages,
            'context', context, 'claimed_ms', now_text, 'due_ms', due_ms, 'last_inbound', false,
            'history', false}
        else
          redis.call('HSET', bkey, 'token', token, 'claimed_ms', now_text, 'due_ms', due_ms)
          b = redis.call('HGETALL', bkey)
          table.insert(b, 1, token)
          table.insert(b, 1, person)
          local n = #b
          b[n + 1], b[n + 2], b[n + 3], b[n + 4] = 'last_inbound', false, 'history', false
        end
        add_lag(lags, now - tonumber(due_ms))
        local n = #b
        -- The window: a new batch whose newest message keeps it open for half a window
        -- more answers what a turn asks of it (is it open, for the minutes a turn takes)
        -- with that message's ts; the book is read otherwise (a fifth of a batch's claim).
        local ts = fresh and fresh[5]
        if ts and ts > now_s - service_window / 2 then
          b[n - 2] = fresh[6]
        else
          b[n - 2] = lastin_get(prefix, person, now_s, service_window, no_legacy)
        end
        b[n] = '[' .. table.concat(
          redis.call('LRANGE', conv_key(prefix, person, MEMORY), '0', '-1'), ',') .. ']'
        out[#out + 1] = b
      end
    end
  end
end
add_leases(true)
delete_taken(true)
write_lags(KEYS[5], lags)
if new_batches > 0 then redis.call('HINCRBY', KEYS[5], 'batches', int_text(new_batches)) end
out[2] = next_wake()
return out
