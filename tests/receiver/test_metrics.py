"""GET /metrics: private (404 without METRICS_TOKEN, 401 without the bearer token), Prometheus
text that parses, receiver figures (labelled with the dyno) that move with traffic, fleet
totals and the busiest tenants' series read from Redis at most every METRICS_FLEET_MAX_AGE_S
by one read shared by concurrent scrapes, and a scrape that survives Redis being down."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from receiver.metrics.endpoint import ReceiverMetrics
from scripts.dev.redis_server import RedisServer
from shared.conversation.review_journal import ReviewJournal
from shared.conversation.turn_state import TurnState
from shared.conversation.unknowns import UnknownDelivery
from shared.fleet import turn_figures
from shared.keys import Keys
from shared.settings import ConfigError, Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.receiver.support import TENANT, counts, dumps, payload, post, running, text_message
from tests.support.helpers import fixture_bytes
from tests.worker.support import push_message, wait_for
from worker.conversation_store import ConversationStore

TEXT = fixture_bytes("whatsapp/text.json")
PERSON = "5491155550001"

METRICS_TOKEN = "test-metrics-token"
AUTH = {"Authorization": f"Bearer {METRICS_TOKEN}"}
DYNO = "web.7"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_settings(settings: Settings, **changes: object) -> Settings:
    """Metrics on, fleet figures read at every scrape unless `changes` say otherwise."""
    base: dict[str, object] = {
        "metrics_token": METRICS_TOKEN,
        "metrics_fleet_max_age_s": 0.0,
        "dyno": DYNO,
    }
    return settings.with_overrides(**{**base, **changes})


@pytest.fixture
async def client(settings: Settings, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    async with running(metrics_settings(settings)) as c:
        yield c


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics", headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def mine(samples: Samples, name: str, **labels: str) -> float:
    """A sample of this receiver's own figures (they carry its dyno)."""
    return value(samples, name, dyno=DYNO, **labels)


async def test_receiver_figures_move_as_traffic_flows(client: httpx.AsyncClient) -> None:
    before = await scrape(client)
    assert value(before, "wa_fleet_scrape_ok") == 1
    assert mine(before, "wa_webhook_items_stored_total") == 0

    assert counts(await post(client, TEXT)) == {"stored": 1, "duplicates": 0}
    assert counts(await post(client, TEXT)) == {"stored": 0, "duplicates": 1}
    assert (await post(client, TEXT, signature="sha256=" + "0" * 64)).status_code == 403
    assert counts(await post(client, b"{not json")) == {
        "stored": 0,
        "duplicates": 0,
        "deadlettered": True,
    }

    after = await scrape(client)
    assert mine(after, "wa_webhook_requests_total", status="200") == 3
    assert mine(after, "wa_webhook_requests_total", status="403") == 1
    assert mine(after, "wa_webhook_items_stored_total") == 1
    assert mine(after, "wa_webhook_items_duplicate_total") == 1
    assert mine(after, "wa_webhook_deadlettered_total") == 1
    assert mine(after, "wa_webhook_request_seconds_count") == 4
    assert 0 < mine(after, "wa_webhook_request_seconds_sum") < 10
    assert mine(after, "wa_webhook_request_seconds_bucket", le="+Inf") == 4
    # The standard process figures, this receiver's too.
    assert mine(after, "process_cpu_seconds_total") > 0
    assert mine(after, "process_resident_memory_bytes") > 0
    # Fleet figures carry no dyno: every receiver serves the same ones.
    assert value(after, "wa_inbox_depth") == 1
    assert not [labels for name, labels in after if name == "wa_inbox_depth" and labels]


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
    assert value(samples, "wa_tenants") == 1
    for scope, labels in (("wa_", {}), ("wa_tenant_", {"tenant": TENANT})):
        assert value(samples, f"{scope}inbox_depth", **labels) == 1
        assert value(samples, f"{scope}conversations_waiting", **labels) == 2
        assert value(samples, f"{scope}turns_running", **labels) == 1
        assert value(samples, f"{scope}review_items", **labels) == 1
        assert value(samples, f"{scope}messages_total", **labels) == 7
        assert value(samples, f"{scope}turns_total", **labels) == 5
        assert value(samples, f"{scope}parts_read_total", **labels) == 2
        assert (f"{scope}retries_total", tuple(labels.items())) in samples
        assert value(samples, f"{scope}review_total", reason="too_old", **labels) == 1

    # A webhook for a second tenant shows up, summed into the totals and as its own series.
    other = "106500000000002"
    body = dumps(payload((other, [text_message("wamid.m2")], [])))
    assert counts(await post(client, body))["stored"] == 1
    samples = await scrape(client)
    assert value(samples, "wa_tenant_inbox_depth", tenant=other) == 1
    assert value(samples, "wa_tenant_inbox_depth", tenant=TENANT) == 1
    assert value(samples, "wa_inbox_depth") == 2
    assert value(samples, "wa_tenants") == 2


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
    assert value(before, "wa_tenant_dispatch_lag_seconds_count", tenant=TENANT) == 0
    assert value(before, "wa_tenant_dispatch_lag_seconds_bucket", tenant=TENANT, le="+Inf") == 0

    sec, usec = await redis.time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    await redis.zadd(k.due, {p: now_ms - int(s * 1000) for p, s in late.items()})
    claim = await store.claim(TENANT, 5, "t")
    assert len(claim.batches) == 2

    after = await scrape(client)
    bucket = "wa_tenant_dispatch_lag_seconds_bucket"
    assert value(after, "wa_tenant_dispatch_lag_seconds_count", tenant=TENANT) == 2
    assert value(after, bucket, tenant=TENANT, le="+Inf") == 2
    assert value(after, bucket, tenant=TENANT, le="0.25") == 0  # both were later than that
    assert value(after, bucket, tenant=TENANT, le="2.5") == 1  # 0.3 s (a noisy machine: ≤ 2.5)
    assert value(after, bucket, tenant=TENANT, le="1") <= 1
    assert 3.3 <= value(after, "wa_tenant_dispatch_lag_seconds_sum", tenant=TENANT) < 3.3 + 10
    assert value(after, "wa_dispatch_lag_seconds_count") == 2  # the fleet's: one tenant here


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
    unknown = "wa_tenant_deliveries_unknown_total"
    assert value(samples, unknown, tenant=TENANT, kind="part") == 1
    assert value(samples, unknown, tenant=TENANT, kind="note") == 1
    assert value(samples, unknown, tenant=TENANT, kind="template") == 0
    assert value(samples, "wa_tenant_review_total", tenant=TENANT, reason="delivery_unknown") == 1
    assert value(samples, "wa_tenant_review_items", tenant=TENANT) == 1
    assert value(samples, "wa_deliveries_unknown_total", kind="part") == 1
    assert value(samples, "wa_review_items") == 1


async def test_redis_down_still_serves_receiver_figures(
    settings: Settings, own_server: RedisServer
) -> None:
    config = metrics_settings(settings, redis_url=own_server.url, redis_timeout_s=0.5)
    async with running(config) as client:
        assert counts(await post(client, TEXT))["stored"] == 1
        own_server.stop()
        assert (await post(client, TEXT)).status_code == 503
        samples = await scrape(client)
        assert value(samples, "wa_fleet_scrape_ok") == 0
        assert mine(samples, "wa_webhook_requests_total", status="200") == 1
        assert mine(samples, "wa_webhook_requests_total", status="503") == 1
        assert mine(samples, "wa_webhook_items_stored_total") == 1
        assert not [name for name, _ in samples if name.startswith("wa_inbox_depth")]


async def test_each_app_counts_on_its_own(settings: Settings, redis: Redis) -> None:
    async with running(metrics_settings(settings)) as first:
        assert counts(await post(first, TEXT))["stored"] == 1
        first_samples = await scrape(first)
    async with running(metrics_settings(settings)) as second:
        second_samples = await scrape(second)
    assert mine(first_samples, "wa_webhook_requests_total", status="200") == 1
    assert mine(second_samples, "wa_webhook_requests_total", status="200") == 0


def test_latency_buckets_are_cumulative_and_bounds_inclusive() -> None:
    """Prometheus buckets count answers with latency <= their bound, each including the ones
    below; an answer slower than every bound lands only in +Inf."""
    metrics = ReceiverMetrics()
    for seconds in (0.0004, 0.001, 0.001, 3.0):
        metrics.answered(200, seconds)
    metrics.answered(503, 0.02)
    samples = {
        (name, tuple((k, v) for k, v in labels if k != "dyno")): n
        for (name, labels), n in parse(metrics.render().decode()).items()
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


# --- private -------------------------------------------------------------------------------


async def test_without_metrics_token_there_is_no_metrics_route(
    settings: Settings, redis: Redis
) -> None:
    """METRICS_TOKEN unset: /metrics is 404 for everyone, a bearer token included."""
    async with running(settings) as client:
        assert (await client.get("/metrics")).status_code == 404
        assert (await client.get("/metrics", headers=AUTH)).status_code == 404
        assert (await client.get("/healthz")).status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [
        None,  # no header
        "",
        "Bearer",
        "Bearer ",
        f"Bearer {METRICS_TOKEN}x",  # longer
        f"Bearer {METRICS_TOKEN[:-1]}",  # a prefix
        "Bearer wrong-token",
        f"Basic {METRICS_TOKEN}",  # another scheme
        METRICS_TOKEN,  # no scheme
    ],
)
async def test_a_wrong_or_missing_bearer_token_gets_401(
    client: httpx.AsyncClient, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "wa_" not in response.text


async def test_the_right_bearer_token_gets_the_page(client: httpx.AsyncClient) -> None:
    for authorization in (f"Bearer {METRICS_TOKEN}", f"bearer {METRICS_TOKEN}"):
        response = await client.get("/metrics", headers={"Authorization": authorization})
        assert response.status_code == 200
        assert "wa_fleet_scrape_ok 1.0" in response.text


# --- cheap -----------------------------------------------------------------------------------


async def smembers_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_smembers", {}).get("calls", 0))


async def test_fleet_figures_are_cached_for_their_max_age(settings: Settings, redis: Redis) -> None:
    """Within METRICS_FLEET_MAX_AGE_S a scrape serves the figures read before (Redis is not
    read again); after it they are read anew. The receiver's own figures are always fresh."""
    k = Keys(settings.key_prefix).tenant(TENANT)
    await redis.sadd(Keys(settings.key_prefix).tenants, TENANT)
    await redis.hset(k.stats, "messages", 1)
    async with running(metrics_settings(settings, metrics_fleet_max_age_s=1.5)) as client:
        first = await scrape(client)
        assert value(first, "wa_messages_total") == 1
        await redis.hset(k.stats, "messages", 2)
        assert counts(await post(client, TEXT))["stored"] == 1
        cached = await scrape(client)
        assert value(cached, "wa_messages_total") == 1  # not read again
        assert mine(cached, "wa_webhook_items_stored_total") == 1  # fresh
        assert 0 <= mine(cached, "wa_fleet_figures_age_seconds") < 1.5
        await asyncio.sleep(1.6)
        fresh = await scrape(client)
        assert value(fresh, "wa_messages_total") == 2


async def test_concurrent_scrapes_share_one_read(settings: Settings, redis: Redis) -> None:
    """Ten scrapes at once, the figures always stale (max age 0): one read of the registry
    serves them all, and each gets the whole page."""
    keys = Keys(settings.key_prefix)
    tenants = [f"1065000000{i:05d}" for i in range(1500)]  # several read chunks
    await redis.sadd(keys.tenants, *tenants)
    pipe = redis.pipeline(transaction=False)
    for tenant in tenants:
        pipe.hset(keys.tenant(tenant).stats, "messages", 1)
    await pipe.execute()
    async with running(metrics_settings(settings)) as client:
        await redis.config_resetstat()
        pages = await asyncio.gather(*(scrape(client) for _ in range(10)))
        assert await smembers_calls(redis) == 1
        assert {value(page, "wa_messages_total") for page in pages} == {1500}
        await scrape(client)  # once they are served, the next scrape reads again
        assert await smembers_calls(redis) == 2


async def test_per_tenant_series_only_for_the_busiest_and_the_named(
    settings: Settings, redis: Redis
) -> None:
    """METRICS_TENANTS_TOP_N=2: the two tenants with the most messages, plus those
    METRICS_TENANTS names, get series of their own; the totals count every tenant."""
    keys = Keys(settings.key_prefix)
    messages = {f"10650000000000{i}": i for i in range(1, 6)}  # tenant ...1 has 1, ...5 has 5
    for tenant, n in messages.items():
        await redis.sadd(keys.tenants, tenant)
        await redis.hset(keys.tenant(tenant).stats, mapping={"messages": n, "turns": 1})
    named = "106500000000001"
    config = metrics_settings(settings, metrics_tenants_top_n=2, metrics_tenants=(named,))
    async with running(config) as client:
        samples = await scrape(client)
    shown = {dict(labels)["tenant"] for name, labels in samples if name == "wa_tenant_turns_total"}
    assert shown == {"106500000000005", "106500000000004", named}
    assert value(samples, "wa_tenant_messages_total", tenant="106500000000005") == 5
    assert value(samples, "wa_messages_total") == 15
    assert value(samples, "wa_turns_total") == 5
    assert value(samples, "wa_tenants") == 5

    async with running(metrics_settings(settings, metrics_tenants_top_n=0)) as client:
        samples = await scrape(client)
    assert not [name for name, _ in samples if name.startswith("wa_tenant_")]
    assert value(samples, "wa_messages_total") == 15


async def test_turn_figures_in_the_stats_hash_become_histograms_and_token_counters(
    client: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """What shared/fleet/turn_figures.py adds per turn, summed over tenants: AI call and send
    latency histograms (cumulative buckets) and tokens by kind."""
    keys = Keys(settings.key_prefix)
    per_turn = turn_figures.increments(
        [300.0, 1200.0],
        [40.0],
        {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100},
    )
    for tenant in (TENANT, "106500000000002"):
        await redis.sadd(keys.tenants, tenant)
        await redis.hset(keys.tenant(tenant).stats, mapping=per_turn)
    samples = await scrape(client)
    assert value(samples, "wa_ai_call_seconds_count") == 4
    assert value(samples, "wa_ai_call_seconds_bucket", le="0.25") == 0
    assert value(samples, "wa_ai_call_seconds_bucket", le="0.5") == 2
    assert value(samples, "wa_ai_call_seconds_bucket", le="2") == 4
    assert value(samples, "wa_ai_call_seconds_bucket", le="+Inf") == 4
    assert value(samples, "wa_ai_call_seconds_sum") == pytest.approx(3.0)
    assert value(samples, "wa_send_seconds_bucket", le="0.05") == 2
    assert value(samples, "wa_send_seconds_count") == 2
    assert value(samples, "wa_ai_tokens_total", kind="input") == 20
    assert value(samples, "wa_ai_tokens_total", kind="output") == 10
    assert value(samples, "wa_ai_tokens_total", kind="cache_read") == 200
    assert value(samples, "wa_ai_tokens_total", kind="cache_write") == 0
    assert value(samples, "wa_tenant_ai_tokens_total", tenant=TENANT, kind="input") == 10
    assert value(samples, "wa_tenant_ai_call_seconds_count", tenant=TENANT) == 2


async def test_receiver_figures_name_the_host_without_dyno(
    settings: Settings, redis: Redis
) -> None:
    config = settings.with_overrides(metrics_token=METRICS_TOKEN)
    async with running(config) as client:
        samples = await scrape(client)
    host = socket.gethostname()
    assert value(samples, "wa_webhook_request_seconds_count", dyno=host) == 0
    assert ("wa_webhook_request_seconds_count", (("dyno", host),)) in samples


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("METRICS_TENANTS_TOP_N", "1001", "METRICS_TENANTS_TOP_N must be between 0 and 1000"),
        ("METRICS_TENANTS_TOP_N", "-1", "METRICS_TENANTS_TOP_N must be between 0 and 1000"),
        ("METRICS_TENANTS_TOP_N", "ten", "METRICS_TENANTS_TOP_N must be an integer"),
        ("METRICS_FLEET_MAX_AGE_S", "-0.5", "METRICS_FLEET_MAX_AGE_S must be >= 0"),
        ("HEARTBEAT_INTERVAL_S", "0", "HEARTBEAT_INTERVAL_S must be > 0"),
    ],
)
def test_bad_metrics_settings_are_refused_naming_the_variable(
    name: str, raw: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({name: raw})


def test_metrics_settings_read_from_the_environment() -> None:
    s = Settings.from_env(
        {
            "METRICS_TOKEN": "t0k",
            "METRICS_TENANTS": "106500000000001, 106500000000002",
            "METRICS_TENANTS_TOP_N": "0",
            "DYNO": "web.2",
        }
    )
    assert s.metrics_token == "t0k" and s.masked()["metrics_token"] == "***"
    assert s.metrics_tenants == ("106500000000001", "106500000000002")
    assert (s.metrics_tenants_top_n, s.metrics_fleet_max_age_s, s.dyno) == (0, 5.0, "web.2")


async def test_a_slow_read_serves_the_figures_read_before(settings: Settings, redis: Redis) -> None:
    """Redis paused during a read: a scrape that has figures waits at most SCRAPE_WAIT_S for
    it and gets the earlier ones (their age says so); the read completes for a later scrape."""
    keys = Keys(settings.key_prefix)
    await redis.sadd(keys.tenants, TENANT)
    await redis.hset(keys.tenant(TENANT).stats, "messages", 1)
    async with running(metrics_settings(settings)) as client:
        assert value(await scrape(client), "wa_messages_total") == 1
        await redis.hset(keys.tenant(TENANT).stats, "messages", 2)
        await redis.execute_command("CLIENT", "PAUSE", 3000, "ALL")
        began = time.monotonic()
        stale = await scrape(client)
        assert time.monotonic() - began < 2.0  # SCRAPE_WAIT_S (0.5 s), not the pause (3 s)
        assert value(stale, "wa_messages_total") == 1
        assert value(stale, "wa_fleet_scrape_ok") == 1

        async def fresh() -> Samples | None:
            samples = await scrape(client)
            return samples if value(samples, "wa_messages_total") == 2 else None

        await wait_for(fresh, "the read after the pause", timeout_s=10, every_s=0.2)
