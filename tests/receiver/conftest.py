"""Receiver fixtures: the app with its lifespan running and an httpx client on it, a Redis
client without timeouts, and a Redis server of the test's own, to stop and restart (helpers are
in tests/receiver/support.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer
from shared.settings import Settings
from tests.receiver.support import running


@pytest.fixture
async def untimed(redis_server: RedisServer, redis: Redis) -> AsyncIterator[Redis]:
    """A client without socket timeouts: only the writer's own deadline can end a wait."""
    client = Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A Redis of this test alone, stopped after it: the one a test may take down."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def admin(own_server: RedisServer) -> AsyncIterator[Redis]:
    """A client of the test's own Redis (`own_server`), which unpauses it after the test."""
    client = Redis.from_url(own_server.url)
    try:
        yield client
    finally:
        await client.client_unpause()
        await client.aclose()


@pytest.fixture
async def client(settings: Settings, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    async with running(settings) as c:
        yield c
