"""Dispatch lag (a batch's due time -> the claim that starts its turn) as a histogram in each
tenant's stats hash: the claim script records it, any worker, and `/metrics` reads it back.

Fields of `wa:{T}:stats`: `lag_le:<ms>` counts claims whose lag was at most <ms> and more than
the bucket below (not cumulative: a claim increments one bucket; `lag_le:inf` above the last),
`lag_sum_ms` and `lag_count`. The bounds and names are defined here once; the loader writes
them into shared/lua/lib/dispatch_lag.lua.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

BUCKETS_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
BUCKET_PREFIX = "lag_le:"
INF = "inf"
SUM_FIELD = "lag_sum_ms"
COUNT_FIELD = "lag_count"


@dataclass(frozen=True)
class LagHistogram:
    """Cumulative buckets in seconds, Prometheus style: (upper bound, count), `+Inf` last."""

    buckets: tuple[tuple[str, int], ...]
    sum_s: float
    count: int


def from_stats(stats: Mapping[str, int]) -> LagHistogram:
    """The histogram held by one tenant's stats hash (all zero before any claim)."""
    running = 0
    buckets = []
    for bound in BUCKETS_MS:
        running += stats.get(f"{BUCKET_PREFIX}{bound}", 0)
        buckets.append((f"{bound / 1000:g}", running))
    running += stats.get(f"{BUCKET_PREFIX}{INF}", 0)
    buckets.append(("+Inf", running))
    return LagHistogram(tuple(buckets), stats.get(SUM_FIELD, 0) / 1000, running)
