"""`GET /metrics`: the receiver's own figures and the fleet's, in Prometheus text format.

Private: the route exists only when `METRICS_TOKEN` is set (404 otherwise) and answers only a
request with `Authorization: Bearer <METRICS_TOKEN>` (compared in constant time; 401 else).

Receiver figures live in a `CollectorRegistry` owned by one app (tests create many apps). The
webhook's hot path only adds to plain integers (requests by status, the latency bucket, item
counts), turned into Prometheus families at scrape time: prometheus-client's own `observe` and
`inc` take a lock each, a measurable share of a request (docs/benchmarks/receiver.md). They
are this process's, so they carry its `dyno` label (`DYNO`, else the host name), and so do the
standard `process_*` figures: a scraper that reaches the web dynos through one router (Heroku)
still tells their counters apart. The fleet figures come from Redis, the same on every
receiver, without that label (receiver/metrics/fleet.py: cached, read in chunks, few series).
"""

from __future__ import annotations

import socket
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from receiver.metrics.fleet import FleetFigures
from receiver.providers.signature import token_matches
from shared.keys import Keys
from shared.settings import Settings

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def authorized(header: str | None, token: str) -> bool:
    """`Authorization: Bearer <token>`, compared in constant time (an empty token: never)."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return token_matches(given.strip(), token)


class ReceiverMetrics:
    """The figures of one receiver app and their exposition."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        self.dyno = settings.dyno or socket.gethostname()
        self.registry = CollectorRegistry(auto_describe=False)
        self.by_status: dict[int, int] = {}
        # latency_buckets[i]: answers within LATENCY_BUCKETS_S[i] and above the bucket before
        # (the last one: above every bound); made cumulative at scrape time
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.latency_sum_s = 0.0
        self.items_stored = 0
        self.items_duplicate = 0
        self.bodies_deadlettered = 0
        self.deadletters_dropped = 0
        self.fleet = FleetFigures(settings, Keys(settings.key_prefix))
        self.registry.register(_Labelled(_ItemCollector(self), "dyno", self.dyno))
        self.registry.register(_Labelled(ProcessCollector(registry=None), "dyno", self.dyno))

    def answered(self, status: int, seconds: float) -> None:
        """The hot path's share: three integer additions."""
        self.by_status[status] = self.by_status.get(status, 0) + 1
        self.latency_buckets[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.latency_sum_s += seconds

    def saved(self, stored: int, duplicates: int, deadlettered: bool) -> None:
        self.items_stored += stored
        self.items_duplicate += duplicates
        self.bodies_deadlettered += deadlettered

    def dropped_deadletters(self, count: int) -> None:
        """Old dead-letter bodies the list's bounds pushed out (DEADLETTER_MAX*)."""
        self.deadletters_dropped += count

    def render(self, fleet_text: bytes = b"") -> bytes:
        """This receiver's exposition text, then `fleet_text` (the fleet figures)."""
        return generate_latest(self.registry) + fleet_text

    async def exposition(self, redis: Any) -> bytes:
        """What `GET /metrics` answers: this receiver's figures now, the fleet's as cached."""
        fleet_text = await self.fleet.text(redis)
        return self.render(fleet_text)


class _Labelled(Collector):
    """Another collector's families, each sample with one more label."""

    def __init__(self, inner: Collector, label: str, value: str) -> None:
        self.inner = inner
        self.label = label
        self.value = value

    def collect(self) -> Iterator[Metric]:
        for family in self.inner.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                labels = {self.label: self.value, **s.labels}
                labelled.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
            yield labelled


class _ItemCollector(Collector):
    def __init__(self, metrics: ReceiverMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        requests = CounterMetricFamily(
            "wa_webhook_requests", "Webhook POSTs answered, by HTTP status", labels=["status"]
        )
        for status, n in sorted(m.by_status.items()):
            requests.add_metric([str(status)], n)
        yield requests
        cumulative = []
        total = 0
        for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), m.latency_buckets, strict=True):
            total += n
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), total))
        yield HistogramMetricFamily(
            "wa_webhook_request_seconds",
            "Time from a webhook POST's start to its answer",
            buckets=cumulative,
            sum_value=m.latency_sum_s,
        )
        yield CounterMetricFamily(
            "wa_webhook_items_stored", "Items stored in a tenant inbox", value=m.items_stored
        )
        yield CounterMetricFamily(
            "wa_webhook_items_duplicate",
            "Items already seen (dedupe), not stored again",
            value=m.items_duplicate,
        )
        yield CounterMetricFamily(
            "wa_webhook_deadlettered",
            "Signed bodies kept on the dead-letter list",
            value=m.bodies_deadlettered,
        )
        yield CounterMetricFamily(
            "wa_webhook_deadletters_dropped",
            "Old dead-letter bodies dropped to keep the list within DEADLETTER_MAX(_BYTES)",
            value=m.deadletters_dropped,
        )
        age = m.fleet.age_s()
        yield GaugeMetricFamily(
            "wa_fleet_figures_age_seconds",
            "How old the fleet figures this receiver serves are (-1: none read yet)",
            value=-1 if age is None else age,
        )
