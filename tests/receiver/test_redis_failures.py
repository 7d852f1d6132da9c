"""Redis down, restarted or stalled: 503 quickly, nothing acknowledged is lost, retries dedupe."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer
from shared.settings import Settings
from tests.receiver.support import counts, inbox, post, running
from tests.support.helpers import fixture_bytes

BURST = fixture_bytes("whatsapp/burst_one_post.json")
BURST_IDS = ["wamid.FIXTURE0002", "wamid.FIXTURE0003", "wamid.FIXTURE0004"]


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


async def timed_post(client: httpx.AsyncClient, body: bytes) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await post(client, body)
    return response, time.monotonic() - started


async def test_redis_stopped_then_restarted(settings: Settings, own_server: RedisServer) -> None:
    config = settings.with_overrides(redis_url=own_server.url, redis_timeout_s=0.5)
    async with running(config) as client:
        assert (await post(client, fixture_bytes("whatsapp/text.json"))).status_code == 200
        own_server.stop()

        response, elapsed = await timed_post(client, BURST)
        assert response.status_code == 503
        assert elapsed < 2.5  # REDIS_TIMEOUT_S=0.5, with room for a loaded machine
        assert (await client.get("/readyz")).status_code == 503
        assert (await client.get("/healthz")).status_code == 200

        own_server.start()  # same port, empty (no persistence): the script cache is gone too
        response = await post(client, BURST)
        assert response.status_code == 200
        assert counts(response) == {"stored": 3, "duplicates": 0}
        assert counts(await post(client, BURST)) == {"stored": 0, "duplicates": 3}
        assert (await client.get("/readyz")).status_code == 200

    check = Redis.from_url(own_server.url)
    try:
        assert [e["id"] for e in await inbox(check)] == BURST_IDS
    finally:
        await check.aclose()


async def test_redis_down_at_start_up_then_up(settings: Settings, own_server: RedisServer) -> None:
    own_server.stop()
    config = settings.with_overrides(redis_url=own_server.url, redis_timeout_s=0.5)
    async with running(config) as client:
        assert (await client.get("/readyz")).status_code == 503
        assert (await post(client, BURST)).status_code == 503
        own_server.start()
        assert counts(await post(client, BURST)) == {"stored": 3, "duplicates": 0}


async def test_redis_paused_is_503_within_the_timeout(
    settings: Settings, own_server: RedisServer
) -> None:
    config = settings.with_overrides(redis_url=own_server.url, redis_timeout_s=0.3)
    admin = Redis.from_url(own_server.url)
    try:
        async with running(config) as client:
            await admin.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
            response, elapsed = await timed_post(client, BURST)
            assert response.status_code == 503
            assert elapsed < 2.5  # well inside the 3 s pause: the timeout answered
            await admin.execute_command("CLIENT", "UNPAUSE")
            response = await post(client, BURST)
            assert response.status_code == 200
        assert [e["id"] for e in await inbox(admin)] == BURST_IDS
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()
