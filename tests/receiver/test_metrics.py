"""GET /metrics: Prometheus text that parses, receiver figures that move with traffic, fleet
figures read from Redis at scrape time, and a scrape that survives Redis being down."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from receiver.metrics import ReceiverMetrics
from scripts.dev.redis_server import RedisServer
from shared.group_commit import GroupCommitter
from shared.keys import Keys
from shared.scripts import Scripts
from shared.settings import Settings
from tests.receiver.support import TENANT, counts, dumps, payload, post, running, text_message
from tests.support.helpers import fixture_bytes
from tests.worker.support import push_message
from worker.review_journal import ReviewJournal
from worker.store import ConversationStore
from worker.turn_state import TurnState
from worker.unknowns import UnknownDelivery

TEXT = fixture_bytes("whatsapp/text.json")
PERSON = "5491155550001"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


async def test_receiver_figures_move_as_traffic_flows(client: httpx.AsyncClient) -> None:
    before = await scrape(client)
    assert value(before, "wa_fleet_scrape_ok") == 1
    assert value(before, "wa_webhook_items_stored_total") == 0

    assert counts(await post(client, TEXT)) == {"stored": 1, "duplicates": 0}
    assert counts(await post(client, TEXT)) == {"stored": 0, "duplicates": 1}
    assert (await post(client, TEXT, signature="sha256=" + "0" * 64)).status_code == 403
    assert counts(await post(client, b"{not json")) == {
        "stored": 0,
        "duplicates": 0,
        "deadlettered": True,
    }

    after = await scrape(client)
    assert value(after, "wa_webhook_requests_total", status="200") == 3
    assert value(after, "wa_webhook_requests_total", status="403") == 1
    assert value(after, "wa_webhook_items_stored_total") == 1
    assert value(after, "wa_webhook_items_duplicate_total") == 1
    assert value(after, "wa_webhook_deadlettered_total") == 1
    assert value(after, "wa_webhook_request_seconds_count") == 4
    assert 0 < value(after, "wa_webhook_request_seconds_sum") < 10
    assert value(after, "wa_webhook_request_seconds_bucket", le="+Inf") == 4


@pytest.mark.cluster
async def test_fleet_gauges_reflect_redis(
    client: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    assert await push_message(redis, settings.key_prefix, PERSON, "wamid.m1", "hola", tenant=TENANT)
    k = Keys(settings.key_prefix).tenant(TENANT)
    await redis.zadd(k.due, {PERSON: 1, "5491155550002": 2})
    await redis.zadd(k.running, {"5491155550003": 3})
    await redis.hset(k.review, "batch-1", "{}")
    await redis.hset(
        k.stats,
        mapping={"messages": 7, "turns": 5, "parts_read": 2, "review:too_old": 1},
    )

    samples = await scrape(client)
    assert value(samples, "wa_fleet_scrape_ok") == 1
    assert value(samples, "wa_inbox_depth", tenant=TENANT) == 1
    assert value(samples, "wa_conversations_waiting", tenant=TENANT) == 2
    assert value(samples, "wa_turns_running", tenant=TENANT) == 1
    assert value(samples, "wa_review_items", tenant=TENANT) == 1
    assert value(samples, "wa_messages_total", tenant=TENANT) == 7
    assert value(samples, "wa_turns_total", tenant=TENANT) == 5
    assert value(samples, "wa_parts_read_total", tenant=TENANT) == 2
    assert ("wa_retries_total", (("tenant", TENANT),)) in samples
    assert value(samples, "wa_review_total", tenant=TENANT, reason="too_old") == 1

    # A webhook for a second tenant shows up as its own series, read at the next scrape.
    other = "106500000000002"
    body = dumps(payload((other, [text_message("wamid.m2")], [])))
    assert counts(await post(client, body))["stored"] == 1
    samples = await scrape(client)
    assert value(samples, "wa_inbox_depth", tenant=other) == 1
    assert value(samples, "wa_inbox_depth", tenant=TENANT) == 1


async def test_dispatch_lag_moves_as_turns_are_claimed(
    client: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """The claim script records due -> claim per batch; /metrics shows it as a histogram."""
    scripts = Scripts()
    store = ConversationStore(settings, scripts, GroupCommitter(redis, scripts))
    k = Keys(settings.key_prefix).tenant(TENANT)
    late = {PERSON: 0.3, "5491155550002": 3.0}  # seconds overdue when claimed
    for i, person in enumerate(late):
        await push_message(redis, settings.key_prefix, person, f"wamid.l{i}", "hola", tenant=TENANT)
    await store.claim(TENANT, 0, "intake")
    before = await scrape(client)
    assert value(before, "wa_dispatch_lag_seconds_count", tenant=TENANT) == 0
    assert value(before, "wa_dispatch_lag_seconds_bucket", tenant=TENANT, le="+Inf") == 0

    sec, usec = await redis.time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    await redis.zadd(k.due, {p: now_ms - int(s * 1000) for p, s in late.items()})
    claim = await store.claim(TENANT, 5, "t")
    assert len(claim.batches) == 2

    after = await scrape(client)
    bucket = "wa_dispatch_lag_seconds_bucket"
    assert value(after, "wa_dispatch_lag_seconds_count", tenant=TENANT) == 2
    assert value(after, bucket, tenant=TENANT, le="+Inf") == 2
    assert value(after, bucket, tenant=TENANT, le="0.25") == 0  # both were later than that
    assert value(after, bucket, tenant=TENANT, le="2.5") == 1  # 0.3 s (a noisy machine: ≤ 2.5)
    assert value(after, bucket, tenant=TENANT, le="1") <= 1
    assert 3.3 <= value(after, "wa_dispatch_lag_seconds_sum", tenant=TENANT) < 3.3 + 10


async def test_sends_nobody_can_confirm_are_counted_by_kind(
    client: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """finish.lua counts what of a parked batch has an unknown outcome (a part, a template,
    a hand-over note); /metrics shows it as wa_deliveries_unknown_total{kind}."""
    scripts = Scripts()
    store = ConversationStore(settings, scripts, GroupCommitter(redis, scripts))
    k = Keys(settings.key_prefix).tenant(TENANT)
    await push_message(redis, settings.key_prefix, PERSON, "wamid.u1", "hola", tenant=TENANT)
    await store.claim(TENANT, 0, "intake")
    await redis.zadd(k.due, {PERSON: 0})
    (batch,) = (await store.claim(TENANT, 1, "t")).batches
    unknown = UnknownDelivery("part", 0, 1, 0, "ReadTimeout", "Hola")
    note = "unknown: Chatwoot did not answer"
    journal = ReviewJournal("delivery_unknown", "x", 0, unknown, {"note": note})
    state = TurnState(delivery_unknown=unknown, journal=journal)
    told = f"{note}; status open"
    assert await store.finish_review(batch, "delivery_unknown", "x", 0, told, state)

    samples = await scrape(client)
    assert value(samples, "wa_deliveries_unknown_total", tenant=TENANT, kind="part") == 1
    assert value(samples, "wa_deliveries_unknown_total", tenant=TENANT, kind="note") == 1
    assert value(samples, "wa_deliveries_unknown_total", tenant=TENANT, kind="template") == 0
    assert value(samples, "wa_review_total", tenant=TENANT, reason="delivery_unknown") == 1
    assert value(samples, "wa_review_items", tenant=TENANT) == 1


async def test_redis_down_still_serves_receiver_figures(
    settings: Settings, own_server: RedisServer
) -> None:
    config = settings.with_overrides(redis_url=own_server.url, redis_timeout_s=0.5)
    async with running(config) as client:
        assert counts(await post(client, TEXT))["stored"] == 1
        own_server.stop()
        assert (await post(client, TEXT)).status_code == 503
        samples = await scrape(client)
        assert value(samples, "wa_fleet_scrape_ok") == 0
        assert value(samples, "wa_webhook_requests_total", status="200") == 1
        assert value(samples, "wa_webhook_requests_total", status="503") == 1
        assert value(samples, "wa_webhook_items_stored_total") == 1
        assert not [name for name, _ in samples if name.startswith("wa_inbox_depth")]


async def test_each_app_counts_on_its_own(settings: Settings, redis: Redis) -> None:
    async with running(settings) as first:
        assert counts(await post(first, TEXT))["stored"] == 1
        first_samples = await scrape(first)
    async with running(settings) as second:
        second_samples = await scrape(second)
    assert value(first_samples, "wa_webhook_requests_total", status="200") == 1
    assert value(second_samples, "wa_webhook_requests_total", status="200") == 0


def test_latency_buckets_are_cumulative_and_bounds_inclusive() -> None:
    """Prometheus buckets count answers with latency <= their bound, each including the ones
    below; an answer slower than every bound lands only in +Inf."""
    metrics = ReceiverMetrics()
    for seconds in (0.0004, 0.001, 0.001, 3.0):
        metrics.answered(200, seconds)
    metrics.answered(503, 0.02)
    families = text_string_to_metric_families(metrics.render(None).decode())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples
    }
    assert value(samples, "wa_webhook_request_seconds_bucket", le="0.0005") == 1
    assert value(samples, "wa_webhook_request_seconds_bucket", le="0.001") == 3
    assert value(samples, "wa_webhook_request_seconds_bucket", le="0.025") == 4
    assert value(samples, "wa_webhook_request_seconds_bucket", le="2.5") == 4
    assert value(samples, "wa_webhook_request_seconds_bucket", le="+Inf") == 5
    assert value(samples, "wa_webhook_request_seconds_count") == 5
    assert value(samples, "wa_webhook_request_seconds_sum") == pytest.approx(3.0224)
    assert value(samples, "wa_webhook_requests_total", status="200") == 4
    assert value(samples, "wa_webhook_requests_total", status="503") == 1
