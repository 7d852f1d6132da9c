"""Helpers of the delivery tests: the environment a worker gets, in-process workers, webhook
bodies as Meta shapes them, and readers of what the product wrote to Redis.

Workers are configured exactly as a process is (`Settings.from_env` on an environment, with a
real `TENANTS_FILE`); the Claude brain and the WhatsApp sender are the real ones, talking through
the anthropic SDK and httpx to the stand-ins. Nothing of ours is patched.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from scripts.webhooks import inbound_webhook, meta_headers
from shared import events
from shared.keys import Keys
from shared.ops import outbound as outbound_records
from shared.senders.loading import Sender
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.support.helpers import API_KEY, APP_SECRET, TENANT_TOKEN, TOKEN
from tests.worker.support import listening, wait_for, wake_up
from worker.process import Worker

# A tenant with every per-tenant override, and one that runs on the global configuration.
TENANT = "106540352242922"
PLAIN_TENANT = "106540352242923"
MODEL = "claude-test-model"
DEFAULT_PROMPT = "You are the default assistant."
TENANT_PROMPT = "Sos el asistente de Turnos SRL. Respondé breve."
TEMPLATE = "reengagement_es"
TEMPLATE_LANGUAGE = "es_AR"
DAY_S = 24 * 3600
THREE_PARTS = "\n\n".join(" ".join(f"Parte {p}, frase {i}." for i in range(200)) for p in range(3))

TENANTS_TOML = f"""
[tenants."{TENANT}"]
system_prompt = "{TENANT_PROMPT}"
access_token = "{TENANT_TOKEN}"
template = "{TEMPLATE}"
template_language = "{TEMPLATE_LANGUAGE}"
"""


def add_to_tenant(env: dict[str, str], lines: str) -> None:
    """Append TOML `lines` to TENANT's table in the workers' tenants file."""
    Path(env["TENANTS_FILE"]).write_text(TENANTS_TOML + lines)


def worker_env(
    redis_url: str, prefix: str, graph: GraphApiStandIn, ai: MessagesApiStandIn, tenants: Path
) -> dict[str, str]:
    """What a delivery worker runs with: the real brain and sender, pointed at the stand-ins."""
    return {
        "REDIS_URL": redis_url,
        "KEY_PREFIX": prefix,
        "BRAIN": "anthropic",
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": ai.url,  # read by the SDK itself, not by Settings
        "AI_MODEL": MODEL,
        "SYSTEM_PROMPT": DEFAULT_PROMPT,
        "AI_TIMEOUT_S": "5",
        # SENDER is left unset: a Graph API token makes it `whatsapp`.
        "WHATSAPP_ACCESS_TOKEN": TOKEN,
        "WHATSAPP_API_BASE_URL": graph.url,
        "TENANTS_FILE": str(tenants),
        "DEBOUNCE_WINDOW_S": "0.25",
        "MAX_WAIT_S": "2",
        "LEASE_S": "5",
        "LEASE_RENEW_S": "1",
        "RETRY_BASE_S": "0.1",
        "MAX_ATTEMPTS": "4",
        "AI_OUTAGE_PAUSE_S": "0.1",
        "AI_OUTAGE_MAX_PAUSE_S": "1",
        "SHUTDOWN_GRACE_S": "1",
        # Far beyond every test: turns start from wake-ups and due times, never the sweep.
        "POLL_INTERVAL_S": "60",
    }


class InProcessWorkers:
    """`Worker` objects running in the test's event loop; `stop()` shuts them down as SIGTERM
    would. `start(**overrides)` takes environment variables by name (values stringified)."""

    def __init__(self, env: dict[str, str], redis: Redis, prefix: str) -> None:
        self.env = env
        self._redis = redis
        self._prefix = prefix
        self._running: list[tuple[Worker, asyncio.Task[None]]] = []
        self._given: list[Any] = []

    def settings(self, **overrides: object) -> Settings:
        return Settings.from_env({**self.env, **{k: str(v) for k, v in overrides.items()}})

    async def start(self, *, sender: Sender | None = None, **overrides: object) -> Worker:
        """A running worker; a `sender` given here is closed (`aclose()`) by `stop()`."""
        worker = Worker(self.settings(**overrides), sender=sender)
        if sender is not None:
            self._given.append(sender)
        self._running.append((worker, asyncio.create_task(worker.run())))
        count = len(self._running)

        async def up() -> bool:
            for _, task in self._running:
                if task.done():
                    task.result()  # a worker that died at start-up: show why
            return await listening(self._redis, self._prefix) >= count

        await wait_for(up, "the worker listening for wake-ups")
        return worker

    async def stop(self) -> None:
        for worker, _ in self._running:
            worker.handle_exit()
        for _, task in self._running:
            await asyncio.wait_for(task, 10)
        self._running.clear()
        for sender in self._given:
            await sender.aclose()
        self._given.clear()


# --- webhooks as Meta sends them ---------------------------------------------------------------
def image(message_id: str, caption: str, person: str) -> dict[str, Any]:
    return {
        "from": person,
        "id": message_id,
        "timestamp": str(int(time.time())),
        "type": "image",
        "image": {"caption": caption, "mime_type": "image/jpeg", "id": "880000000000007"},
    }


def inbound(tenant: str, person: str, *messages: dict[str, Any]) -> bytes:
    return orjson.dumps(inbound_webhook(tenant, person, messages))


async def post_webhook(url: str, body: bytes) -> None:
    """POST a signed webhook to the receiver, as Meta does; it must answer 200."""
    async with httpx.AsyncClient() as client:
        response = await client.post(url, content=body, headers=meta_headers(APP_SECRET, body))
    assert response.status_code == 200, response.text


async def push_failed_status(
    redis: Redis, prefix: str, person: str, wamid: str, code: int, tenant: str = TENANT
) -> None:
    """A `failed` status with Meta's error, stored as the receiver stores it."""
    event = events.status_event(
        channel="whatsapp",
        person=person,
        message_id=wamid,
        status="failed",
        ts=int(time.time()),
        received_ms=int(time.time() * 1000),
        raw={"id": wamid, "status": "failed"},
        errors=[{"code": code, "title": "Re-engagement message"}],
    )
    keys = Keys(prefix)
    k = keys.tenant(tenant)
    await redis.sadd(keys.tenants, tenant)
    await Scripts().ingest(
        redis,
        k,
        seen=[k.seen(events.dedupe_id(event))],
        dedupe_ttl_s=60,
        events=[events.encode(event)],
    )
    await wake_up(redis, prefix, tenant)


# --- what the product wrote --------------------------------------------------------------------
def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def hash_of(redis: Redis, key: str) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in (await redis.hgetall(key)).items()}


async def batch_hash(
    redis: Redis, prefix: str, person: str, tenant: str = TENANT
) -> dict[str, str]:
    return await hash_of(redis, Keys(prefix).tenant(tenant).batch(person))


async def outbound(redis: Redis, prefix: str, wamid: str, tenant: str = TENANT) -> dict[str, str]:
    """The outbound record of `wamid` ({} when none), as the ops page reads it."""
    (record,) = await outbound_records.records(redis, Keys(prefix).tenant(tenant), [wamid])
    return record


def ai_requests(ai: MessagesApiStandIn) -> list[Any]:
    """The recorded `/v1/messages` calls, oldest first."""
    return [r for r in ai.requests if r.kind == "messages"]


def said(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """A request's messages as (role, text): the text is a message's last block (a user turn's
    first block is the presentation's header: tests/worker/test_presentation.py)."""
    return [(m["role"], m["content"][-1]["text"]) for m in messages]
