-- The bot's silence in a Chatwoot conversation a person of the business handles (an agent
-- assigned, an agent wrote, the conversation opened, the bot handed it over), until it is
-- `pending` again or resolved (receiver/providers/chatwoot_conversations.py). The conversation's `silent`
-- key holds JSON `why`, `since_ms` (Redis clock), `since_s` (Chatwoot's), `by`. While it
-- lives, the customer's messages start no turn; they and the agents' messages enter the
-- memory as lines of one entry, the last of the list, `{"human": true, "lines": [{by, name,
-- text, id, ts}, ...], "ids": [...]}` (by: customer | agent; ids: the customer's message ids),
-- which shared/conversation/human_memory.py shows the AI.
--
-- uses: lib/keys.lua (conv_key, PENDING, BATCH, LOCK, MEMORY, SILENT)
-- uses: lib/outbound.lua (outbound_known)
-- uses: lib/burst.lua (burst_del)

local HUMAN_LINES_MAX = 40  -- the newest lines of one such entry; older ones are dropped

local function text_of(value)
  if type(value) == 'string' then return value end
  if type(value) == 'number' then return tostring(value) end
  return ''
end

-- The conversation's silence record (a table), or nil when the bot may speak.
local function silence_of(prefix, person)
  local raw = redis.call('GET', conv_key(prefix, person, SILENT))
  if not raw then return nil end
  local ok, record = pcall(cjson.decode, raw)
  if ok and type(record) == 'table' then return record end
  return {}
end

-- One line of the conversation (`by` customer or agent) at the end of the memory: into the
-- last entry when that one is such an entry, else in a new one.
local function remember_line(prefix, person, by, obj, memory_ttl_s)
  local mkey = conv_key(prefix, person, MEMORY)
  local entry = nil
  local last = redis.call('LINDEX', mkey, -1)
  if last then
    local ok, decoded = pcall(cjson.decode, last)
    if ok and type(decoded) == 'table' and decoded.human then entry = decoded end
  end
  local fresh = entry == nil
  if fresh then entry = {human = true} end
  if type(entry.lines) ~= 'table' then entry.lines = {} end
  if type(entry.ids) ~= 'table' then entry.ids = {} end
  local id = text_of(obj.id)
  table.insert(entry.lines, {by = by, name = text_of(obj.name), text = text_of(obj.text),
    id = id, ts = tonumber(obj.ts) or 0})
  while #entry.lines > HUMAN_LINES_MAX do table.remove(entry.lines, 1) end
  if by == 'customer' and id ~= '' then
    table.insert(entry.ids, id)
    while #entry.ids > HUMAN_LINES_MAX do table.remove(entry.ids, 1) end
  end
  local encoded = cjson.encode(entry)
  if fresh then
    redis.call('RPUSH', mkey, encoded)
  else
    redis.call('LSET', mkey, -1, encoded)
  end
  redis.call('EXPIRE', mkey, memory_ttl_s)
end

-- A batch that is not running and has nothing decided yet (waiting for a retry, or for the
-- AI after an outage; no reply stored, no review begun, no template noted, not requeued by a
-- person): its messages join the memory and the batch is deleted (true). Anything else stays.
local function fold_batch(prefix, person, memory_ttl_s)
  local bkey = conv_key(prefix, person, BATCH)
  if redis.call('EXISTS', conv_key(prefix, person, LOCK)) == 1 then return false end
  local f = redis.call('HMGET', bkey, 'messages', 'reply', 'handoff', 'requeued', 'template')
  if not f[1] or f[2] or f[3] or f[4] == '1' or f[5] then return false end
  local ok, list = pcall(cjson.decode, f[1])
  if ok and type(list) == 'table' then
    for _, m in ipairs(list) do
      if type(m) == 'table' then remember_line(prefix, person, 'customer', m, memory_ttl_s) end
    end
  end
  redis.call('DEL', bkey)
  return true
end

-- Start the silence (an existing one keeps its record and lives on). What waits for a turn
-- joins the memory first, in order, and leaves the schedule: a batch waiting for a retry
-- (`fold_batch`), then the pending messages. A running batch finishes (finish.lua schedules
-- what follows it, which is nothing: new messages go to the memory now).
local function silence(prefix, person, record, due_key, burst_key, memory_ttl_s, silence_ttl_s)
  if fold_batch(prefix, person, memory_ttl_s) then redis.call('ZREM', due_key, person) end
  local pkey = conv_key(prefix, person, PENDING)
  local waiting = redis.call('LRANGE', pkey, 0, -1)
  for _, item in ipairs(waiting) do
    local ok, obj = pcall(cjson.decode, item)
    if ok and type(obj) == 'table' then remember_line(prefix, person, 'customer', obj, memory_ttl_s) end
  end
  if #waiting > 0 then
    redis.call('DEL', pkey)
    burst_del(burst_key, person)
    if redis.call('EXISTS', conv_key(prefix, person, BATCH)) == 0 then
      redis.call('ZREM', due_key, person)
    end
  end
  local skey = conv_key(prefix, person, SILENT)
  if redis.call('EXPIRE', skey, silence_ttl_s) == 0 then
    redis.call('SET', skey, cjson.encode(record), 'EX', silence_ttl_s)
  end
end

-- The bot may speak again; true when it was silent.
local function speak(prefix, person)
  return redis.call('DEL', conv_key(prefix, person, SILENT)) == 1
end

-- A customer's message `ev` in a silent conversation joins the memory (true: no turn). An
-- agent bot hears of no change back to `pending`: it learns it from the messages, which say
-- the conversation's status. One Chatwoot sent while the conversation was `pending` and
-- assigned to nobody, written after the silence began, ends the silence (false: a turn as
-- usual) when the conversation had left `pending` meanwhile (a message said so: `left`), or
-- the silence began by leaving it (opened, hand_over). An agent who wrote in a `pending`
-- conversation keeps the bot silent until the conversation moves.
local function held_silent(prefix, person, ev, stats_key, memory_ttl_s, silence_ttl_s)
  local record = silence_of(prefix, person)
  if not record then return false end
  local ok, obj = pcall(cjson.decode, ev)
  if not ok or type(obj) ~= 'table' then return false end
  local raw = type(obj.raw) == 'table' and obj.raw or {}
  local skey = conv_key(prefix, person, SILENT)
  if raw.conversation_status == 'pending' and raw.conversation_assigned == false
      and (record.left or record.why == 'opened' or record.why == 'hand_over')
      and (tonumber(obj.ts) or 0) > (tonumber(record.since_s) or 0) then
    speak(prefix, person)
    redis.call('HINCRBY', stats_key, 'speak:pending', 1)
    return false
  end
  if type(raw.conversation_status) == 'string' and raw.conversation_status ~= 'pending'
      and not record.left then
    record.left = true
    redis.call('SET', skey, cjson.encode(record))  -- its EXPIRE follows
  end
  remember_line(prefix, person, 'customer', obj, memory_ttl_s)
  redis.call('EXPIRE', conv_key(prefix, person, SILENT), silence_ttl_s)
  redis.call('HINCRBY', stats_key, 'silent_messages', 1)
  return true
end

-- An agent's message (kind "human"). The bot's own reply comes back the same way when its
-- token is a user's: its id is recorded (lib/outbound.lua), or, when the echo overtook the record,
-- the batch's stored reply holds its text. Anything else silences the bot and is remembered.
local function take_agent_message(prefix, out_prefix, person, ev, keys, now, ttls)
  local ok, obj = pcall(cjson.decode, ev)
  if not ok or type(obj) ~= 'table' then return false end
  local text = text_of(obj.text)
  local reply = redis.call('HGET', conv_key(prefix, person, BATCH), 'reply')
  if outbound_known(out_prefix, text_of(obj.id))
      or (reply and text ~= '' and string.find(reply, text, 1, true)) then
    redis.call('HINCRBY', keys.stats, 'event:own_reply', 1)
    return true
  end
  silence(prefix, person, {why = 'agent', by = text_of(obj.name), since_ms = now,
    since_s = tonumber(obj.ts) or 0}, keys.due, keys.burst, ttls.memory, ttls.silent)
  remember_line(prefix, person, 'agent', obj, ttls.memory)
  redis.call('HINCRBY', keys.stats, 'event:agent_message', 1)
  return true
end

-- A conversation event (kind "conversation"): its `effect` starts or ends the silence.
local function take_conversation_event(prefix, person, ev, keys, now, ttls)
  local ok, obj = pcall(cjson.decode, ev)
  if not ok or type(obj) ~= 'table' then return false end
  local why = text_of(obj.why)
  if obj.effect == 'silence' then
    silence(prefix, person, {why = why, by = text_of(obj.name), since_ms = now,
      since_s = tonumber(obj.ts) or 0}, keys.due, keys.burst, ttls.memory, ttls.silent)
    redis.call('HINCRBY', keys.stats, 'silence:' .. why, 1)
  elseif obj.effect == 'speak' then
    if speak(prefix, person) then redis.call('HINCRBY', keys.stats, 'speak:' .. why, 1) end
  else
    return false
  end
  return true
end
