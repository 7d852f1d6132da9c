-- wrk script of scripts/bench_receiver: POSTs pre-signed, unique webhook bodies.
--
-- Environment (set by the runner):
--   BENCH_PAYLOADS          path prefix: thread n reads "<prefix>.<n>", lines of
--                           "<hex signature>\t<body>\n" (scripts/bench/payloads.py)
--   BENCH_CONNS_PER_THREAD  wrk -c / wrk -t
--   BENCH_SECONDS           measured duration; wrk's own -d must be a little longer
--
-- Each thread owns its own file (a slice of the run's bodies) and walks it once; running past
-- its end wraps around and is counted (`wraps`), so repeated bodies (duplicates for the
-- receiver) never go unnoticed. A thread's clock starts at its first request; after
-- BENCH_SECONDS it stops issuing requests: each connection,
-- once its last response is in, gets an empty request (nothing is written, it just idles),
-- and when all of the thread's connections idle the thread stops. So every request sent got
-- its answer, and "answered 200 x messages per request" must equal what Redis holds.
-- Clock: CLOCK_MONOTONIC through LuaJIT's FFI (os.time has a 1 s resolution).

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local ts = ffi.new("bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- main state: remember the threads to report on them in done()
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

-- thread state ---------------------------------------------------------------------------
local reqs, size, idx, conns, seconds, deadline
local verify_pending

function init(args)
  local t0 = now()
  local path = assert(os.getenv("BENCH_PAYLOADS"), "BENCH_PAYLOADS not set") .. "." .. tid
  seconds = tonumber(os.getenv("BENCH_SECONDS"))
  conns = tonumber(os.getenv("BENCH_CONNS_PER_THREAD"))
  local host = wrk.host .. ":" .. wrk.port
  reqs = {}
  size = 0
  for line in io.lines(path) do
    local tab = line:find("\t", 1, true)
    size = size + 1
    reqs[size] = wrk.format("POST", wrk.path, {
      ["Host"] = host,
      ["Content-Type"] = "application/json",
      ["User-Agent"] = "facebookexternalua",
      ["X-Hub-Signature-256"] = "sha256=" .. line:sub(1, tab - 1),
    }, line:sub(tab + 1))
  end
  assert(size > 0, "no payloads in " .. path)
  slice = size
  load_s = now() - t0
  idx = 0
  sent, responses, ok, non2xx, wraps, parked = 0, 0, 0, 0, 0, 0
  statuses = {}
  t_first, t_last = 0, 0
  deadline = math.huge -- set at the first request
  -- wrk calls request() once on the first thread to check the request parses, and never
  -- sends it: hand it the first body without consuming it.
  verify_pending = (tid == 0)
end

function request()
  if verify_pending then
    verify_pending = false
    return reqs[1]
  end
  local t = now()
  if t >= deadline then
    parked = parked + 1
    if parked >= conns then
      wrk.thread:stop()
    end
    return ""
  end
  if sent == 0 then
    t_first = t
    deadline = t + seconds
  end
  idx = idx + 1
  if idx > size then
    idx = 1
    wraps = wraps + 1
  end
  sent = sent + 1
  return reqs[idx]
end

function response(status, headers, body)
  responses = responses + 1
  t_last = now()
  if status >= 200 and status < 300 then
    ok = ok + 1
  else
    non2xx = non2xx + 1
  end
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH summary duration_us=%d requests=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout))
  io.write(string.format(
    "BENCH latency min=%d mean=%.1f max=%d stdev=%.1f p50=%d p75=%d p90=%d p99=%d p999=%d\n",
    latency.min, latency.mean, latency.max, latency.stdev,
    latency:percentile(50), latency:percentile(75), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
  for _, thread in ipairs(threads) do
    local st = {}
    for code, n in pairs(thread:get("statuses")) do
      table.insert(st, string.format("%d:%d", code, n))
    end
    io.write(string.format(
      "BENCH thread tid=%d load_s=%.3f slice=%d sent=%d responses=%d ok=%d non2xx=%d wraps=%d parked=%d t_first=%.6f t_last=%.6f statuses=%s\n",
      thread:get("tid"), thread:get("load_s"), thread:get("slice"), thread:get("sent"),
      thread:get("responses"), thread:get("ok"), thread:get("non2xx"), thread:get("wraps"),
      thread:get("parked"), thread:get("t_first"), thread:get("t_last"), table.concat(st, ",")))
  end
end
