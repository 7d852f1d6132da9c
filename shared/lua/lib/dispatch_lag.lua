-- Dispatch lag (a batch's due time -> the claim that starts its turn) as a histogram in the
-- tenant's stats hash, read back by shared/fleet/dispatch_lag.py: the bounds and field names are
-- defined there and written in by the loader.

local LAG_BUCKETS_MS = { {{LAG_BUCKETS_MS}} }

-- One claim's lag: one bucket (not cumulative; the last one holds all above the last bound),
-- the sum and the count.
local function record_dispatch_lag(stats, lag)
  lag = math.max(0, math.floor(lag))
  local bucket = '{{LAG_INF}}'
  for _, le in ipairs(LAG_BUCKETS_MS) do
    if lag <= le then bucket = le; break end
  end
  redis.call('HINCRBY', stats, '{{LAG_BUCKET_PREFIX}}' .. bucket, 1)
  redis.call('HINCRBY', stats, '{{LAG_SUM_FIELD}}', lag)
  redis.call('HINCRBY', stats, '{{LAG_COUNT_FIELD}}', 1)
end
