"""Fixtures of the Chatwoot tests: the Chatwoot API stand-in (one per module, reset around
every test), the real receiver on uvicorn, and the environment of the workers answering through
the stand-in (`workers` and `fleet` come from tests/support/fixtures.py). Everything started here
is stopped here."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from receiver.app import create_app
from scripts.dev.redis_server import RedisServer
from scripts.standins import BackgroundServer, ChatwootApiStandIn
from shared.settings import Settings
from tests.chatwoot.support import API_TOKEN, TENANT_API_TOKEN, WEBHOOK_SECRET
from tests.support.helpers import APP_SECRET, standin_fixtures

chatwoot_server, chatwoot = standin_fixtures(
    "chatwoot", lambda: ChatwootApiStandIn(access_tokens=[API_TOKEN, TENANT_API_TOKEN])
)


@pytest.fixture
def prefix() -> str:
    return f"cw{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def receiver_url(redis: Redis, redis_server: RedisServer, prefix: str) -> AsyncIterator[str]:
    """The real receiver app on uvicorn (its own thread and loop): its Chatwoot webhook URL."""
    settings = Settings.from_env(
        {
            "REDIS_URL": redis_server.url,
            "KEY_PREFIX": prefix,
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "CHATWOOT_WEBHOOK_SECRET": WEBHOOK_SECRET,
        }
    )
    async with BackgroundServer(create_app(settings), name="receiver") as server:
        yield f"{server.url}/webhooks/chatwoot"


@pytest.fixture
def env(
    redis_server: RedisServer, prefix: str, chatwoot: ChatwootApiStandIn, receiver_url: str
) -> dict[str, str]:
    """A worker answering through the Chatwoot stand-in, which posts every message it creates
    back to the receiver as Chatwoot does. WhatsApp conversations go to the outbox."""
    chatwoot.configure(webhook_url=receiver_url, webhook_secret=WEBHOOK_SECRET)
    return {
        "REDIS_URL": redis_server.url,
        "KEY_PREFIX": prefix,
        "BRAIN": "echo",
        "CHATWOOT_BASE_URL": chatwoot.url,
        "CHATWOOT_API_ACCESS_TOKEN": API_TOKEN,
        "DEBOUNCE_WINDOW_S": "0.3",
        "MAX_WAIT_S": "2",
        "LEASE_S": "5",
        "LEASE_RENEW_S": "1",
        "RETRY_BASE_S": "0.1",
        "MAX_ATTEMPTS": "3",
        "SHUTDOWN_GRACE_S": "1",
        # Far beyond every test: turns start from wake-ups and due times, never the sweep.
        "POLL_INTERVAL_S": "60",
    }
