"""The writer on its own: merged rounds; timeouts and errors become `StoreUnavailable`."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from receiver.providers.parsing import Item
from receiver.providers.whatsapp import parse_body
from receiver.store import InboxWriter, StoreUnavailable, WriterTuning
from scripts.bench.commandstats import script_stats
from shared.keys import Keys
from shared.storage.scripts import Scripts
from tests.receiver.support import TENANT, dumps, inbox, payload, text_message
from tests.support.helpers import fixture_bytes

BURST = parse_body(fixture_bytes("whatsapp/burst_one_post.json"), 1)
ITEMS = BURST.items


def writer(client: Redis, timeout_s: float = 2.0, **tuning: int) -> InboxWriter:
    return InboxWriter(client, Scripts(), Keys(), 60, timeout_s, WriterTuning(**tuning))


async def test_save_counts_stored_and_duplicates(untimed: Redis, redis: Redis) -> None:
    w = writer(untimed)
    first, again = await asyncio.gather(w.save(ITEMS), w.save(ITEMS))
    assert sorted([(first.stored, first.duplicates), (again.stored, again.duplicates)]) == [
        (0, 3),
        (3, 0),
    ]
    assert len(await inbox(redis)) == 3
    assert await redis.sismember(Keys().tenants, TENANT)


async def test_deadline_applies_even_when_the_client_would_wait_forever(
    untimed: Redis, redis: Redis
) -> None:
    w = writer(untimed, timeout_s=0.3)
    await w.save({})  # nothing to do, no round trip
    await redis.execute_command("CLIENT", "PAUSE", "2000", "WRITE")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not confirm"):
            await w.save(ITEMS)
        # The 0.3 s deadline answered, with room for a loaded machine: not the 2 s pause.
        assert time.monotonic() - started < 1.8
    finally:
        await redis.execute_command("CLIENT", "UNPAUSE")
    await w.save(ITEMS)  # the writer still works afterwards
    assert [e["id"] for e in await inbox(redis)] == [e["id"] for e in BURST.events[TENANT]]


async def test_redis_error_is_store_unavailable(redis: Redis) -> None:
    client = Redis.from_url("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(StoreUnavailable, match="Redis error"):
            await writer(client).save(ITEMS, b"dead letter")
    finally:
        await client.aclose()


async def test_concurrent_requests_share_one_script_call_and_keep_their_own_results(
    untimed: Redis, redis: Redis
) -> None:
    """Ten requests in one round: one ingest call per tenant, each request gets its own counts."""
    w = writer(untimed)
    await w.save(ITEMS)  # these three are now duplicates for whoever sends them again
    other = parse_body(fixture_bytes("whatsapp/two_tenants_one_post.json"), 1).items
    await redis.config_resetstat()
    saved = await asyncio.gather(
        *[w.save(ITEMS) for _ in range(5)], *[w.save(other) for _ in range(5)]
    )
    assert [(s.stored, s.duplicates) for s in saved[:5]] == [(0, 3)] * 5
    assert sorted((s.stored, s.duplicates) for s in saved[5:]) == [(0, 2)] * 4 + [(2, 0)]
    info = await redis.info("commandstats")
    assert script_stats(info)["calls"] == 2  # one per tenant for the whole round
    assert len(await inbox(redis)) == 4  # burst (3) + this tenant's message of the other body


def one_message(message_id: str) -> dict[str, list[Item]]:
    return parse_body(dumps(payload((TENANT, [text_message(message_id)], []))), 1).items


async def test_a_second_round_goes_out_while_one_is_in_flight(untimed: Redis, redis: Redis) -> None:
    """With two slots, two rounds in flight at once; what arrives while both are out gathers
    into the next one.

    Redis is paused, so each round stays in flight: `a` goes out alone, `b` goes out alone on a
    second connection without waiting for `a`, and `c` and `d` share the third round. No request
    is answered before Redis confirmed its own items, and every one of them is answered.
    """
    # A pause long enough that a loaded machine's stalls between the steps below still fall
    # inside it, and a writer deadline far beyond it.
    w = writer(untimed, timeout_s=10, rounds_in_flight=2)
    await w.save(one_message("wamid.warm"))  # scripts loaded, one connection open
    await redis.config_resetstat()
    await redis.execute_command("CLIENT", "PAUSE", "1500", "WRITE")
    a = asyncio.create_task(w.save(one_message("wamid.a")))
    await asyncio.sleep(0.05)
    b = asyncio.create_task(w.save(one_message("wamid.b")))
    await asyncio.sleep(0.05)
    c = asyncio.create_task(w.save(one_message("wamid.c")))
    d = asyncio.create_task(w.save(one_message("wamid.d")))
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in (a, b, c, d))  # nothing answered while Redis holds them
    saved = await asyncio.wait_for(asyncio.gather(a, b, c, d), 10)
    assert [(s.stored, s.duplicates) for s in saved] == [(1, 0)] * 4
    info = await redis.info("commandstats")
    assert script_stats(info)["calls"] == 3  # a, b, then c and d together
    ids = sorted(e["id"] for e in await inbox(redis))
    assert ids == ["wamid.a", "wamid.b", "wamid.c", "wamid.d", "wamid.warm"]


@pytest.mark.parametrize("rounds_in_flight", [1, 2])
async def test_many_concurrent_requests_are_all_answered(
    untimed: Redis, redis: Redis, rounds_in_flight: int
) -> None:
    """Waves of concurrent requests: none is left waiting, whatever the rounds in flight."""
    w = writer(untimed, rounds_in_flight=rounds_in_flight)
    for wave in range(20):
        saved = await asyncio.wait_for(
            asyncio.gather(*(w.save(one_message(f"wamid.{wave}.{n}")) for n in range(wave + 1))),
            5,
        )
        assert [(s.stored, s.duplicates) for s in saved] == [(1, 0)] * (wave + 1)
    assert len(await inbox(redis)) == sum(range(1, 21))


@pytest.mark.parametrize("rounds_in_flight", [1, 2])
async def test_a_request_right_after_an_answer_is_never_left_waiting(
    untimed: Redis, redis: Redis, rounds_in_flight: int
) -> None:
    """Connections that send their next request as soon as the last one was answered (as the
    provider's do): that request joins in the very step its flusher stops, and must still go out
    (with one slot a flusher leaving its slot a loop turn late left it waiting forever).
    """

    async def connection(n: int) -> list[tuple[int, int]]:
        results = []
        for k in range(30):
            saved = await w.save(one_message(f"wamid.{n}.{k}"))
            results.append((saved.stored, saved.duplicates))
        return results

    w = writer(untimed, rounds_in_flight=rounds_in_flight)
    done = await asyncio.wait_for(asyncio.gather(*(connection(n) for n in range(3))), 10)
    assert done == [[(1, 0)] * 30] * 3
    assert len(await inbox(redis)) == 90


async def test_many_tenants_overflow_the_key_cache_and_still_land_in_their_inboxes(
    untimed: Redis, redis: Redis
) -> None:
    w = writer(untimed, max_cached_tenants=2)
    tenants = [f"1065000000000{n:02d}" for n in range(5)]
    for tenant in tenants * 2:  # each tenant's keys dropped from the cache and built again
        body = dumps(payload((tenant, [text_message(f"wamid.cache.{tenant}")], [])))
        saved = await w.save(parse_body(body, 1).items)
        assert saved.stored + saved.duplicates == 1
    for tenant in tenants:
        assert [e["id"] for e in await inbox(redis, tenant)] == [f"wamid.cache.{tenant}"]


@pytest.mark.parametrize("functions", [False, True])
@pytest.mark.parametrize("count", [1, 3, 500])
async def test_ingest_command_from_its_template_is_the_scripts_own(
    untimed: Redis, functions: bool, count: int
) -> None:
    """The writer's template for ingest.lua's call (`_ingest_command`) gives exactly the
    command the script's header builds, for either call mode and any number of items."""
    scripts = Scripts()
    w = InboxWriter(untimed, scripts, Keys(), 60, 2.0)
    scripts.ingest.mode.functions = functions
    for tenant in (TENANT, "106500000000777"):
        tenant_keys = Keys().tenant(tenant)
        seen = [tenant_keys.seen(f"whatsapp:wamid.{i}") for i in range(count)]
        events = [dumps({"id": i}) for i in range(count)]
        for _ in range(2):  # made, then from the cache
            built = w._ingest_command(tenant_keys, seen, events)
            assert built == scripts.ingest.command(
                tenant_keys, seen=seen, dedupe_ttl_s=60, events=events
            )
    scripts.ingest.mode.functions = not functions  # the mode a later load decides
    tenant_keys = Keys().tenant(TENANT)
    assert w._ingest_command(tenant_keys, seen, events)[0] == ("EVALSHA", "FCALL")[not functions]
