-- Dispatch lag (a batch's due time -> the claim that starts its turn) as a histogram in the
-- tenant's stats hash, read back by shared/fleet/dispatch_lag.py: the bounds and field names are
-- defined there and written in by the loader.
--
-- uses: lib/text.lua (int_text)

local LAG_BUCKETS_MS = { {{LAG_BUCKETS_MS}} }

-- One claim call's lags, counted in a table (`new_lags`) and written once at its end
-- (`write_lags`): one bucket per claim (not cumulative; the last one holds all above the last
-- bound), the sum and the count. A claim of 200 batches writes a few fields, not 600.
local function new_lags()
  return {buckets = {}, sum = 0, count = 0}
end

local function add_lag(lags, lag)
  lag = math.max(0, math.floor(lag))
  local bucket = '{{LAG_INF}}'
  for _, le in ipairs(LAG_BUCKETS_MS) do
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
