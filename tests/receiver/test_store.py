"""The group-committed writer on its own: timeouts and errors become `StoreUnavailable`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from receiver.store import InboxWriter, StoreUnavailable
from receiver.whatsapp import parse_body
from shared.group_commit import GroupCommitter
from shared.keys import Keys
from shared.redis_server import RedisServer
from shared.scripts import Scripts
from tests.conftest import fixture_bytes
from tests.receiver.conftest import TENANT, inbox

BURST = parse_body(fixture_bytes("whatsapp/burst_one_post.json"), 1)
ITEMS = BURST.items


@pytest.fixture
async def untimed(redis_server: RedisServer, redis: Redis) -> AsyncIterator[Redis]:
    """A client without socket timeouts: only the writer's own deadline can end a wait."""
    client = Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


def writer(client: Redis, timeout_s: float = 2.0) -> InboxWriter:
    scripts = Scripts()
    return InboxWriter(Keys(), GroupCommitter(client, scripts), scripts.ingest, 60, timeout_s)


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
        assert time.monotonic() - started < 1.0
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
