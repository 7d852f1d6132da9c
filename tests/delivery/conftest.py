"""Fixtures of the delivery tests: the stand-ins (one each per module, reset around every test),
a tenants file, in-process workers, the real receiver app on uvicorn, and worker processes.
Everything started here is stopped here, whatever the test did."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from receiver.app import create_app
from scripts.standins import BackgroundServer, GraphApiStandIn, MessagesApiStandIn
from shared.settings import Settings
from tests.conftest import APP_SECRET, RedisTarget
from tests.delivery.support import (
    API_KEY,
    TENANT_TOKEN,
    TENANTS_TOML,
    TOKEN,
    InProcessWorkers,
    worker_env,
)
from tests.worker.support import WorkerFleet


@pytest.fixture
def prefix() -> str:
    return f"dt{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def graph_server() -> Iterator[GraphApiStandIn]:
    with GraphApiStandIn(access_tokens=[TOKEN, TENANT_TOKEN]) as standin:
        yield standin


@pytest.fixture
def graph(graph_server: GraphApiStandIn) -> Iterator[GraphApiStandIn]:
    graph_server.reset()
    yield graph_server
    graph_server.reset()


@pytest.fixture(scope="module")
def ai_server() -> Iterator[MessagesApiStandIn]:
    with MessagesApiStandIn(api_keys=API_KEY) as standin:
        yield standin


@pytest.fixture
def ai(ai_server: MessagesApiStandIn) -> Iterator[MessagesApiStandIn]:
    ai_server.reset()
    yield ai_server
    ai_server.reset()


@pytest.fixture
def env(
    redis_target: RedisTarget,
    prefix: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, str]:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS_TOML)
    values = {**worker_env(redis_target.url, prefix, graph, ai, tenants), **redis_target.env()}
    # In-process workers build their SDK client here: it reads these from the environment.
    monkeypatch.setenv("ANTHROPIC_BASE_URL", values["ANTHROPIC_BASE_URL"])
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    return values


@pytest.fixture
async def workers(
    env: dict[str, str], redis: Redis, prefix: str
) -> AsyncIterator[InProcessWorkers]:
    running = InProcessWorkers(env, redis, prefix)
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def receiver_url(redis: Redis, redis_target: RedisTarget, prefix: str) -> AsyncIterator[str]:
    """The real receiver app on uvicorn (its own thread and loop): its webhook URL."""
    settings = Settings.from_env(
        {**redis_target.env(), "KEY_PREFIX": prefix, "WHATSAPP_APP_SECRET": APP_SECRET}
    )
    async with BackgroundServer(create_app(settings), name="receiver") as server:
        yield f"{server.url}/webhooks/whatsapp"


@pytest.fixture
def fleet(
    redis: Redis, redis_target: RedisTarget, prefix: str, tmp_path: Path
) -> Iterator[WorkerFleet]:
    workers = WorkerFleet(redis, redis_target.url, prefix, tmp_path, redis_target.cluster)
    try:
        yield workers
    finally:
        workers.close()
        print(workers.dump())  # shown by pytest only when the test failed
