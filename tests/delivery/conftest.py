"""Fixtures of the delivery tests: the workers' environment (a tenants file, the stand-ins of
tests/support/fixtures.py) and the real receiver app on uvicorn. Everything started here is
stopped here, whatever the test did."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from receiver.app import create_app
from scripts.standins import BackgroundServer, GraphApiStandIn, MessagesApiStandIn
from shared.settings import Settings
from tests.delivery.support import TENANTS_TOML, worker_env
from tests.support.helpers import APP_SECRET, RedisTarget


@pytest.fixture
def prefix() -> str:
    return f"dt{uuid.uuid4().hex[:8]}"


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
async def receiver_url(redis: Redis, redis_target: RedisTarget, prefix: str) -> AsyncIterator[str]:
    """The real receiver app on uvicorn (its own thread and loop): its webhook URL."""
    settings = Settings.from_env(
        {**redis_target.env(), "KEY_PREFIX": prefix, "WHATSAPP_APP_SECRET": APP_SECRET}
    )
    async with BackgroundServer(create_app(settings), name="receiver") as server:
        yield f"{server.url}/webhooks/whatsapp"
