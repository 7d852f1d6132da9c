"""What a turn adds to its tenant's figures: AI call latency, send latency and tokens.

Recorded the way the dispatch lag is (shared/fleet/dispatch_lag.py): fields of the tenant's stats
hash `wa:{T}:stats`, added by the worker with each turn's finish (`pairs`, finish.lua's
`figures`), read back by `/metrics`.

Fields: `ai_le:<ms>` / `send_le:<ms>` count the AI calls / sends whose latency was at most <ms>
and more than the bucket below (not cumulative: a call increments one bucket; `..._le:inf`
above the last bound), `ai_sum_ms`, `send_sum_ms`; tokens `tokens:input`, `tokens:output`,
`tokens:cache_read`, `tokens:cache_write` (the Messages API's `input_tokens`, `output_tokens`,
`cache_read_input_tokens`, `cache_creation_input_tokens`).

The count of calls is the sum of the buckets (`from_stats`, `count_of`). Releases before
2026-12-05 also kept it as `ai_count` / `send_count`: one `HINCRBY` each per turn that no reader
needed (each costs Redis ~7k instructions of a turn's ~590k, docs/benchmarks/worker.md). Stats
hashes written by them keep those fields, no longer added to: `RETIRED` names them, and the ops
page's counters leave them out (a count frozen at the upgrade would read as a live one).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from shared.fleet.dispatch_lag import INF, LagHistogram


@dataclass(frozen=True)
class HistogramFields:
    """A latency histogram kept as fields of a stats hash."""

    prefix: str  # e.g. "ai_": fields ai_le:<ms>, ai_sum_ms
    bounds_ms: tuple[int, ...]

    @property
    def bucket_prefix(self) -> str:
        return f"{self.prefix}le:"

    @cached_property
    def sum_field(self) -> str:
        return f"{self.prefix}sum_ms"

    @cached_property
    def _bucket_fields(self) -> tuple[str, ...]:
        """Each bound's bucket field, then the one above the last (`..._le:inf`)."""
        return (*(f"{self.bucket_prefix}{b}" for b in self.bounds_ms), self.bucket_prefix + INF)

    def add(self, increments: dict[str, int], ms: float) -> None:
        """Count one observation of `ms` milliseconds into `increments` (every turn adds a few:
        the field names are made once). Its bucket and the sum: the count is the buckets'. The sum
        is set, not looked up, on the turn's first observation (nearly always its only one)."""
        ms = round(ms) if ms > 0 else 0
        field = self._bucket_fields[bisect_left(self.bounds_ms, ms)]
        increments[field] = increments.get(field, 0) + 1
        total = self.sum_field
        if total in increments:
            increments[total] += ms
        else:
            increments[total] = ms

    def count_of(self, stats: Mapping[str, int]) -> int:
        """How many observations the stats hold: the sum of the buckets."""
        return self.from_stats(stats).count

    def from_stats(self, stats: Mapping[str, int]) -> LagHistogram:
        """Cumulative buckets in seconds, Prometheus style (all zero before any observation)."""
        running = 0
        buckets = []
        for bound in self.bounds_ms:
            running += stats.get(f"{self.bucket_prefix}{bound}", 0)
            buckets.append((f"{bound / 1000:g}", running))
        running += stats.get(f"{self.bucket_prefix}{INF}", 0)
        buckets.append(("+Inf", running))
        return LagHistogram(tuple(buckets), stats.get(self.sum_field, 0) / 1000, running)


# One AI call: the Messages API answers in a second or two, a long reply or a tool loop takes
# longer, and `AI_TIMEOUT_S` (60 s) ends it.
AI_CALL = HistogramFields("ai_", (250, 500, 1000, 2000, 4000, 8000, 15000, 30000, 60000))
# One send to the provider (a reply part, a template), answered or failed.
SEND = HistogramFields("send_", (50, 100, 250, 500, 1000, 2500, 5000, 15000))

# Fields the release before kept in the stats hash and nothing adds to any more.
RETIRED = frozenset({"ai_count", "send_count"})

# The Messages API's usage names -> our field names.
TOKEN_FIELDS = {
    "input_tokens": "tokens:input",
    "output_tokens": "tokens:output",
    "cache_read_input_tokens": "tokens:cache_read",
    "cache_creation_input_tokens": "tokens:cache_write",
}


def pairs(
    ai_calls_ms: Iterable[float], sends_ms: Iterable[float], tokens: Mapping[str, int]
) -> tuple[tuple[str, int], ...]:
    """`increments` as (field, increment) pairs, as finish.lua takes them."""
    return tuple(increments(ai_calls_ms, sends_ms, tokens).items())


def increments(
    ai_calls_ms: Iterable[float], sends_ms: Iterable[float], tokens: Mapping[str, int]
) -> dict[str, int]:
    """The stats-hash increments of one turn: its AI calls, its sends and its token usage
    (keyed by the Messages API's names); zero counts are left out."""
    out: dict[str, int] = {}
    for ms in ai_calls_ms:
        AI_CALL.add(out, ms)
    for ms in sends_ms:
        SEND.add(out, ms)
    for name, field in TOKEN_FIELDS.items():
        if tokens.get(name, 0) > 0:
            out[field] = int(tokens[name])
    return out
