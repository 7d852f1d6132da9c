-- The outbound records that delivery statuses update, what a late delivery failure needs, and
-- its queue for the worker.
--
-- A record is one reply part the provider accepted: its status, when it was sent, its index,
-- the error of a failure, the person and the batch, kept OUTBOUND_TTL_S (7 days: Meta retries
-- a status webhook that long) in the tenant's book of records (lib/book.lua: a generation
-- takes records for a day, so a status's lookup mostly stops at the newest), as one field of
-- a small hash: field = the first 16 hex digits of the SHA-1 of the provider id, value =
-- "<status code>|<sent_ms>|<part>|<error>|<person>|<batch>" (shared/ops/outbound.py reads it
-- too). The key `out:<provider id>` (a hash) holds what came before the record: a status that
-- overtook the send's answer (`early`, `early_failure`, parked for an hour), and, after an
-- upgrade, the records of the release before (batch, person, part, status, sent_ms, error),
-- still moved forward here until they expire.
--
-- A `failed` status for a part Meta had accepted is a late failure: it is queued on the
-- person's `late` hash (field `job:<wamid>`), and a batch is made of it as soon as the person
-- has none (now, or when the running one finishes: finish.lua), due at once. The worker runs
-- it under the person's lock like any batch (worker/turn/late_failures.py: the template for 131047,
-- the review item, the memory's mark), so it never overlaps a turn (invariant 3). Its
-- messages and reply come from the person's `sent` list, filled when a batch's first part is
-- recorded. `template:<batch>` = "sent" on the same hash: the batch's template went out (its
-- turn's or a late failure's): never a second one, whatever statuses arrive.
--
-- uses: lib/keys.lua (conv_key, out_book, BATCH, LOCK, SENT, LATE)
-- uses: lib/book.lua (book_find, book_open, book_key, book_added, book_hash)

-- Delivery statuses only move forward: a late "delivered" never undoes "read".
local STATUS_RANK = {accepted = 0, sent = 1, delivered = 2, read = 3, played = 4, failed = 5}
-- A status as a record holds it, and back.
local STATUS_CODE = {accepted = 'a', sent = 's', delivered = 'd', read = 'r', played = 'p',
  failed = 'f'}
local CODE_STATUS = {a = 'accepted', s = 'sent', d = 'delivered', r = 'read', p = 'played',
  f = 'failed'}
local OUT_FILL = 48  -- records a shard of the book is sized for (a listpack holds 128)
local OUT_GEN_S = 86400  -- a generation of the book takes records for a day

-- Where the record of provider id `id` lives in the book: its shard hash and field.
local function record_place(id)
  local digest = redis.sha1hex(id)
  return book_hash(digest), string.sub(digest, 1, 16)
end

-- A record's value (the book's field), from its parts: no table is needed to spell one.
local function record_value(status, sent_ms, part, err, person, batch)
  return STATUS_CODE[status] .. '|' .. sent_ms .. '|' .. part .. '|' .. err .. '|' .. person
    .. '|' .. batch
end

-- The record of provider id `id` (a table: status, sent_ms, part, error, person, batch, and
-- where it is kept), or nil when there is none.
local function find_record(out_prefix, id)
  local h, field = record_place(id)
  local value, key = book_find(out_book(out_prefix), h, 'HGET', field)
  if value then
    local c, sent_ms, part, err, person, batch =
      string.match(value, '^(%a)|(%d*)|(%d*)|([^|]*)|([^|]*)|(.*)$')
    if c and CODE_STATUS[c] then
      return {status = CODE_STATUS[c], sent_ms = sent_ms, part = part, error = err,
        person = person, batch = batch, key = key, field = field}
    end
  end
  -- A record of the release before.
  local okey = out_prefix .. id
  local r = redis.call('HMGET', okey, 'status', 'sent_ms', 'part', 'error', 'person', 'batch')
  if not r[1] then return nil end
  return {status = r[1], sent_ms = r[2] or '0', part = r[3] or '0', error = r[4] or '',
    person = r[5], batch = r[6], legacy = okey}
end

-- Write back a record's status and error.
local function save_record(r)
  if r.legacy then
    redis.call('HSET', r.legacy, 'status', r.status, 'error', r.error)
  else
    redis.call('HSET', r.key, r.field,
      record_value(r.status, r.sent_ms, r.part, r.error, r.person, r.batch))
  end
end

-- Whether provider id `id` is a part we sent (and is still recorded).
local function outbound_known(out_prefix, id)
  return find_record(out_prefix, id) ~= nil
end

-- The start of a `sent` entry of `batch`: {"batch":<id>,"reply":<text>,"messages":[...]}.
local function sent_head(batch)
  return '{"batch":' .. cjson.encode(batch) .. ',"reply":'
end

-- What record_outbound reads of the batch hash `bkey`, in one call: its id, reply and
-- messages (for the `sent` list), whether it is a late failure's, its template note; as
-- HMGET gives them (false for a missing field), at these places (RB_ID, ...): a finish
-- makes no table of names for it.
local RB_ID, RB_REPLY, RB_MESSAGES, RB_LATE, RB_TEMPLATE, RB_TEMPLATE_PART = 1, 2, 3, 4, 5, 6
local function recorded_batch(bkey)
  return redis.call('HMGET', bkey, 'id', 'reply', 'messages', 'late_jobs', 'template',
    'template_part')
end

-- Part `part` of `batch` is recorded: on its first part, keep its messages and reply (as the
-- batch holds them, byte for byte, `b`: recorded_batch) for a failure reported after the batch
-- is gone. Not for a late failure's own batch (its template): that batch's messages are kept
-- already; not for Chatwoot. A batch's first part is part 0 unless its reply was replaced
-- (a template in place of a later part), so only a later part looks whether the newest entry
-- is the batch's already: a one-part reply, most of them, costs the push alone.
local function keep_sent(prefix, person, batch, part, b)
  if b[RB_LATE] then return end
  local skey = conv_key(prefix, person, SENT)
  local head = sent_head(batch)
  if part ~= '0' and tonumber(part) ~= 0 then
    local newest = redis.call('LINDEX', skey, '0')
    if newest and string.sub(newest, 1, #head) == head then return end
  end
  local messages = b[RB_MESSAGES] or '[]'
  -- Chatwoot reports no delivery failures: nothing to keep for it.
  if string.find(messages, '"channel":"chatwoot"', 1, true) then return end
  local kept = redis.call('LPUSH', skey,
    head .. cjson.encode(b[RB_REPLY] or '') .. ',"messages":' .. messages .. '}')
  if kept > {{SENT_KEEP}} then redis.call('LTRIM', skey, 0, {{SENT_KEEP}} - 1) end
  redis.call('EXPIRE', skey, '{{SENT_TTL_S}}')
end

-- The messages (JSON, as kept) and reply of `batch` from the `sent` list; '[]' and '' when
-- it is no longer kept. The reply is a JSON string, which cannot hold ',"messages":' unescaped.
local function sent_of(prefix, person, batch)
  local head = sent_head(batch)
  for _, entry in ipairs(redis.call('LRANGE', conv_key(prefix, person, SENT), '0', '-1')) do
    if string.sub(entry, 1, #head) == head then
      local at = string.find(entry, ',"messages":', #head + 1, true)
      if at then
        local ok, reply = pcall(cjson.decode, string.sub(entry, #head + 1, at - 1))
        return string.sub(entry, at + 12, -2), ok and type(reply) == 'string' and reply or ''
      end
    end
  end
  return '[]', ''
end

-- The error of a `failed` status event (decoded): Meta's `errors[1]` (code, title, message,
-- details).
local function failure_of(obj)
  local e = type(obj.errors) == 'table' and obj.errors[1]
  if type(e) ~= 'table' then return {} end
  local data = type(e.error_data) == 'table' and e.error_data or {}
  local function text(v) return type(v) == 'string' and v or nil end
  return {code = tonumber(e.code), title = text(e.title), message = text(e.message),
    details = text(data.details)}
end

-- Queue a late failure of part `part` (provider id `id`) of `batch` for the worker.
local function queue_late(prefix, person, batch, part, id, failure, sent_ms, now)
  local lkey = conv_key(prefix, person, LATE)
  redis.call('HSET', lkey, 'job:' .. id, cjson.encode({
    batch = batch, part = tonumber(part), id = id, code = failure.code, title = failure.title,
    message = failure.message, details = failure.details, sent_ms = tonumber(sent_ms),
    at_ms = now,
  }))
  redis.call('EXPIRE', lkey, '{{LATE_TTL_S}}')
end

-- When the person has no batch: make one of the late failures of one batch (the oldest
-- queued batch's, all its parts), due now. When the person's batch is a late failure's that
-- no worker holds (still due, or waiting for a retry), the queued failures of the same batch
-- join it: one review item per batch. For 131047 the batch asks for the template unless that
-- batch's template went out already. Returns true when it made or joined one. `gone`: the
-- caller just deleted the person's batch (nothing to look up).
local function start_late_job(prefix, person, due_key, now, gone)
  local bkey = conv_key(prefix, person, BATCH)
  local joining = nil
  if not gone and redis.call('EXISTS', bkey) == 1 then
    joining = redis.call('HMGET', bkey, 'late_of', 'late_jobs')
    if not joining[1] or redis.call('EXISTS', conv_key(prefix, person, LOCK)) == 1 then
      return false
    end
  end
  local lkey = conv_key(prefix, person, LATE)
  local fields = redis.call('HGETALL', lkey)
  local batch, jobs, window = joining and joining[1], {}, false
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 4) == 'job:' then
      local ok, job = pcall(cjson.decode, fields[i + 1])
      if not ok or type(job) ~= 'table' or type(job.batch) ~= 'string' then
        redis.call('HDEL', lkey, fields[i])  -- not ours to read; never retried forever
      elseif batch == nil or job.batch == batch then
        batch = job.batch
        table.insert(jobs, fields[i + 1])
        redis.call('HDEL', lkey, fields[i])
        if job.code == 131047 then window = true end
      end
    end
  end
  if #jobs == 0 then return false end
  local template = '0'
  if window and redis.call('HGET', lkey, 'template:' .. batch) ~= 'sent' then
    -- Noted before the worker sends it: no other late failure of this batch asks again.
    redis.call('HSET', lkey, 'template:' .. batch, 'sent')
    template = '1'
  end
  if joining then
    local before = string.sub(joining[2] or '[]', 2, -2)
    if before ~= '' then table.insert(jobs, 1, before) end
    redis.call('HSET', bkey, 'late_jobs', '[' .. table.concat(jobs, ',') .. ']')
    if template == '1' then redis.call('HSET', bkey, 'late_template', '1') end
    return true
  end
  local messages, reply = sent_of(prefix, person, batch)
  redis.call('HSET', bkey, 'id', batch .. ':late-' .. now, 'person', person, 'attempt', 0,
    'created_ms', now, 'messages', messages, 'context', '[]', 'requeued', 1,
    'late_of', batch, 'late_reply', reply, 'late_jobs', '[' .. table.concat(jobs, ',') .. ']',
    'late_template', template,
    -- During a rolling deploy a worker of the release before late failures may claim it:
    -- it finds a review decided (shared/conversation/review_journal.py) and parks it without sending.
    'handoff', cjson.encode({reason = 'delivery_failed', at_ms = now,
      detail = 'Meta reported a sent part failed (parked by a worker of an earlier release)'}))
  redis.call('ZADD', due_key, now, person)
  return true
end

-- A `failed` status applied to our record `r`: note its error, queue it for the worker and,
-- when the person has no batch and `due_key` is given, start it.
local function failed_part(prefix, r, id, failure, due_key, now)
  r.error = failure.code and tostring(failure.code) or ''
  save_record(r)
  if not r.batch or not r.person then return end
  queue_late(prefix, r.person, r.batch, r.part or 0, id, failure, r.sent_ms or 0, now)
  if due_key then start_late_job(prefix, r.person, due_key, now) end
end

-- Count one `field` in `stats`: the stats hash's key, or a function(field, n) of the caller's.
local function count_to(stats, field)
  if type(stats) == 'function' then
    stats(field, 1)
  else
    redis.call('HINCRBY', stats, field, '1')
  end
end

-- The provider accepted part `part` of `batch` as `id`: record it in the book, keep the
-- batch's messages for a late failure, note a template, and apply a status that overtook the
-- send's answer (parked as `early` by apply_status). A late failure found here is only
-- queued: the batch is still running; finish.lua starts it. `b` is what the caller read of
-- the person's batch hash (recorded_batch; nil: read here). `batch` names the batch: `b.id`,
-- or a reply by hand's own id. `now_text`: `now` as text, when the caller has it already.
-- `stats` is the stats hash's key, or a function(field, n) that sums the counts for the caller
-- (finish.lua adds them with its turns' figures: one HINCRBY per field a call).
local function record_outbound(prefix, stats, out_prefix, id, batch, person, part, ttl, now,
    b, now_text)
  local okey = out_prefix .. id
  -- Mostly no status came first: one field says so, and the rest is read only when it did.
  local early = redis.call('HGET', okey, 'early')
  local failure, early_error = nil, nil
  if early then
    local e = redis.call('HMGET', okey, 'early_failure', 'early_error')
    failure, early_error = e[1], e[2]
    redis.call('DEL', okey)
  end
  local book, h, field = out_book(out_prefix), record_place(id)
  local gen = book_open(book, math.floor(now / 1000), ttl, OUT_GEN_S, OUT_FILL, 'HLEN')
  local status, sent_ms, key = STATUS_CODE[early or ''] and early or 'accepted', now_text or now,
    book_key(gen, h)
  -- Only an early failure below makes a record's table (every reply part comes through here).
  local value = record_value(status, sent_ms, part, '', person, batch)
  if redis.call('HSET', key, field, value) == 1 then
    book_added(book, gen, key, redis.call('HLEN', key), OUT_FILL)
  end
  count_to(stats, 'parts_out')
  b = b or recorded_batch(conv_key(prefix, person, BATCH))
  keep_sent(prefix, person, batch, part, b)
  if b[RB_TEMPLATE] == '1' and b[RB_TEMPLATE_PART] == tostring(part) then
    local lkey = conv_key(prefix, person, LATE)
    redis.call('HSET', lkey, 'template:' .. batch, 'sent')
    redis.call('EXPIRE', lkey, '{{LATE_TTL_S}}')
  end
  if not early then return end
  count_to(stats, 'parts_' .. early)
  if early ~= 'failed' then return end
  local ok, f = pcall(cjson.decode, failure or '')
  -- (`early_error`: the code alone, as the release before late failures parked it)
  if not ok or type(f) ~= 'table' then f = {code = tonumber(early_error or '')} end
  failed_part(prefix, {status = status, sent_ms = sent_ms, part = part, error = '',
    person = person, batch = batch, key = key, field = field}, id, f, nil, now)
end

-- One status event (kind "status") of the intake: move its outbound record forward. A status
-- whose record does not exist yet overtook the send's answer: the furthest one is parked on
-- `out:<id>` (`early`, with its failure) for record_outbound; ids that are not ours expire.
-- The event is decoded: its id is never pattern-matched in the JSON (an escaped quote would
-- cut it short, and the cut id could name another record). Applying a status again changes
-- nothing but the `status:<status>` count, so statuses need no dedupe marker (ingest.lua).
local function apply_status(prefix, out_prefix, stats_key, due_key, ev, early_ttl, now)
  local ok, obj = pcall(cjson.decode, ev)
  if not ok or type(obj) ~= 'table' then obj = {} end
  local st = obj.status
  if type(st) ~= 'string' or not string.find(st, '^%a+$') then st = 'unknown' end
  redis.call('HINCRBY', stats_key, 'status:' .. st, '1')
  local id = obj.id
  if type(id) ~= 'string' or id == '' then return end
  local r = find_record(out_prefix, id)
  if not r and STATUS_RANK[st] then
    local okey = out_prefix .. id
    local early = redis.call('HGET', okey, 'early')
    if not early or STATUS_RANK[st] > (STATUS_RANK[early] or -1) then
      redis.call('HSET', okey, 'early', st)
      if st == 'failed' then
        redis.call('HSET', okey, 'early_failure', cjson.encode(failure_of(obj)))
      end
      redis.call('EXPIRE', okey, early_ttl)
    end
    return
  end
  if not r or not STATUS_RANK[st] or STATUS_RANK[st] <= (STATUS_RANK[r.status] or 0) then
    return
  end
  r.status = st
  save_record(r)
  redis.call('HINCRBY', stats_key, 'parts_' .. st, '1')
  if st == 'failed' then failed_part(prefix, r, id, failure_of(obj), due_key, now) end
end
