-- Dispatch lag (a batch's due time -> the claim that starts its turn) as a histogram in the
-- tenant's stats hash, read back by shared/fleet/dispatch_lag.py: the bounds and field names are
-- defined there and written in by the loader.
--
-- uses: lib/text.lua (int_text)

local LAG_BUCKETS_MS = { {{LAG_BUCKETS_MS}} }
local LAG_BUCKETS = #LAG_BUCKETS_MS

-- One claim call's lags, counted in a table (`new_lags`) and written once at its end
-- (`write_lags`): one bucket per claim (not cumulative; the last one holds all above the last
-- bound), the sum and the count. A claim of 200 batches writes a few fields, not 600.
local function new_lags()
  return {buckets = {}, sum = 0, count = 0}
end

-- (Every claimed batch comes through here: a numeric loop and arithmetic, where `ipairs`,
-- `math.max` and `math.floor` were each a C call, ~10k instructions a batch at the lags of a
-- backlog, docs/benchmarks/worker.md.)
local function add_lag(lags, lag)
  if lag < 0 then lag = 0 else lag = lag - lag % 1 end
  local bucket = '{{LAG_INF}}'
  for i = 1, LAG_BUCKETS do
    local le = LAG_BUCKETS_MS[i]
    if lag <= le then bucket = le; break end
  end
  lags.buckets[bucket] = (lags.buckets[bucket] or 0) + 1
  lags.sum = lags.sum + lag
  lags.count = lags.count + 1
end

-- A bucket's field name, made once (kept between calls by a function library).
local lag_fields = {}

local function write_lags(stats, lags)
  if lags.count == 0 then return end
  for bucket, n in pairs(lags.buckets) do
    local field = lag_fields[bucket]
    if not field then
      field = '{{LAG_BUCKET_PREFIX}}' .. bucket
      lag_fields[bucket] = field
    end
    redis.call('HINCRBY', stats, field, int_text(n))
  end
  redis.call('HINCRBY', stats, '{{LAG_SUM_FIELD}}', int_text(lags.sum))
  redis.call('HINCRBY', stats, '{{LAG_COUNT_FIELD}}', int_text(lags.count))
end
