-- A human has a conversation: while the person's `human` key exists the claim gives the bot
-- no turn for them (claim.lua), and the key lapses by itself (PX). shared/ops/takeover.py reads it.
--
-- uses: lib/keys.lua (conv_key, HUMAN, PENDING, BATCH, MEMORY)
-- uses: lib/memory.lua (remember)
-- uses: lib/burst.lua (burst_del)

-- A pause a review set (finish.lua: by "review:<reason>") is the review's: requeueing or
-- dropping the item lifts it (lift_review_pause). Any other pause is a person's (the ops
-- page, the CLI, a reply by hand, an echo from the WhatsApp Business app): no action on a
-- review item lifts it, only a resume or its own end.
local REVIEW_BY = 'review:'

local function is_review_pause(pause)
  return type(pause) == 'table' and type(pause.by) == 'string'
    and string.sub(pause.by, 1, #REVIEW_BY) == REVIEW_BY
end

local function decode_pause(raw)
  if not raw then return nil end
  local ok, pause = pcall(cjson.decode, raw)
  if ok and type(pause) == 'table' then return pause end
  return nil
end

-- Pause the bot for `person` for `ms` from `now`: JSON {by, why, since_ms, until_ms}. With
-- `extend_only` a pause that already lasts longer is kept (an automatic pause never shortens
-- one a person set); a person's pause kept that way over a review's makes it the person's
-- (`by`, `why`), so dropping the item no longer lifts it. A review's pause replacing a
-- person's shorter one keeps it as `prior`: lifting the review's pause gives it back for what
-- is left of it. Returns the pause's JSON as it now stands.
local function set_human_pause(prefix, person, by, why, now, ms, extend_only)
  local key = conv_key(prefix, person, HUMAN)
  local review = string.sub(by, 1, #REVIEW_BY) == REVIEW_BY
  local prior = nil
  if extend_only then
    local left = redis.call('PTTL', key)
    if left ~= -2 then
      local old = decode_pause(redis.call('GET', key))
      if left == -1 or left >= ms then
        if not review and is_review_pause(old) then
          old.by, old.why, old.prior = by, why, nil
          redis.call('SET', key, cjson.encode(old), 'KEEPTTL')
        end
        return redis.call('GET', key)
      end
      if review and old then
        if is_review_pause(old) then prior = old.prior else prior = old end
      end
    end
  end
  local pause = {by = by, why = why, since_ms = now, until_ms = now + ms, prior = prior}
  local encoded = cjson.encode(pause)
  redis.call('SET', key, encoded, 'PX', ms)
  return encoded
end

-- Lift the person's pause if a review set it (see REVIEW_BY): a person's pause it had
-- replaced (`prior`) comes back for what is left of it. Returns 1 when the bot may answer the
-- person again (the caller makes what waits due: make_due_after_resume), else 0.
local function lift_review_pause(prefix, person, now)
  local key = conv_key(prefix, person, HUMAN)
  local pause = decode_pause(redis.call('GET', key))
  if not is_review_pause(pause) then return 0 end
  local prior = pause.prior
  local until_ms = type(prior) == 'table' and tonumber(prior.until_ms) or nil
  if until_ms and until_ms > now then
    redis.call('SET', key, cjson.encode(prior), 'PX', math.floor(until_ms - now))
    return 0
  end
  redis.call('DEL', key)
  return 1
end

-- The pause was lifted: a running turn is scheduled by its finish (finish.lua); otherwise a
-- waiting batch (a retry) or waiting messages are due now, whatever time the pause had moved
-- them to. Returns 1 when something was made due (the caller relays the tenant to a worker).
local function make_due_after_resume(prefix, person, due_key, running_key, now)
  if redis.call('ZSCORE', running_key, person) then return 0 end
  local waits = redis.call('EXISTS', conv_key(prefix, person, BATCH),
    conv_key(prefix, person, PENDING))
  if waits == 0 then return 0 end
  local due = redis.call('ZSCORE', due_key, person)
  if not due or tonumber(due) > now then redis.call('ZADD', due_key, now, person) end
  return 1
end

local ECHO_BY, ECHO_WHY = 'business_app', 'the business wrote from the WhatsApp Business app'

-- The text and id of an inbox event, '' where it has none.
local function text_and_id(obj)
  local text = type(obj.text) == 'string' and obj.text or ''
  return text, type(obj.id) == 'string' and obj.id or ''
end

-- An echo: the business wrote to `person` from the WhatsApp Business app. The person is paused
-- (extend only), and what the human wrote enters the memory as the answer, marked `human`, to
-- the messages that were waiting when it was written (provider ts up to the echo's): the
-- human answered those, so they leave `pending` and no turn answers them again. Echoes in a
-- row with no message between them are one memory entry. No turn starts; `lastin` is not
-- touched (an echo does not open the 24-hour window).
local function take_echo(due_key, burst_key, stats_key, prefix, ev, person, now, pause_ms,
    memory_turns, memory_ttl_s)
  redis.call('HINCRBY', stats_key, 'event:echo', 1)
  local ok, echo = pcall(cjson.decode, ev)
  if not ok or type(echo) ~= 'table' then
    set_human_pause(prefix, person, ECHO_BY, ECHO_WHY, now, pause_ms, true)
    return
  end
  set_human_pause(prefix, person, ECHO_BY, ECHO_WHY, now, pause_ms, true)
  local echo_text, echo_id = text_and_id(echo)
  local echo_ts = tonumber(echo.ts) or math.huge
  local pkey = conv_key(prefix, person, PENDING)
  local answered, later, texts, ids = 0, {}, {}, {}
  for _, item in ipairs(redis.call('LRANGE', pkey, 0, -1)) do
    local ok2, m = pcall(cjson.decode, item)
    if ok2 and type(m) == 'table' and (tonumber(m.ts) or 0) <= echo_ts then
      answered = answered + 1
      local text, id = text_and_id(m)
      if text ~= '' then table.insert(texts, text) end
      if id ~= '' then table.insert(ids, id) end
    else
      table.insert(later, item)
    end
  end
  if answered > 0 then
    redis.call('DEL', pkey)
    if #later > 0 then
      redis.call('RPUSH', pkey, unpack(later))
    else
      burst_del(burst_key, person)
      -- A batch (running, or waiting for a retry) keeps its own due time.
      if redis.call('EXISTS', conv_key(prefix, person, BATCH)) == 0 then
        redis.call('ZREM', due_key, person)
      end
    end
  end
  if memory_turns <= 0 then return end
  local mkey = conv_key(prefix, person, MEMORY)
  if answered == 0 then
    local last = redis.call('LINDEX', mkey, -1)
    local ok3, entry = pcall(cjson.decode, last or '')
    if last and ok3 and type(entry) == 'table' and entry.by == 'human' and entry.echo == true
        and type(entry.assistant) == 'string' and type(entry.out) == 'table' then
      entry.assistant = entry.assistant .. '\n' .. echo_text
      table.insert(entry.out, echo_id)
      redis.call('LSET', mkey, -1, cjson.encode(entry))
      redis.call('EXPIRE', mkey, memory_ttl_s)
      return
    end
  end
  -- Marked as a reply by hand is (`by`, shared/conversation/presentation.py), `echo` for the merge above.
  local entry = {user = table.concat(texts, '\n'), assistant = echo_text, by = 'human',
    echo = true, out = {echo_id}}
  if #ids > 0 then entry.ids = ids end
  remember(mkey, cjson.encode(entry), memory_turns, memory_ttl_s * 1000)
end
