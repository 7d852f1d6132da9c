"""Helpers of the ops page's tests: settings with an ops token, review items parked as the
worker parks them, signing in, and the CSRF token read from a page as a browser would."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
from redis.asyncio import Redis

from shared import events
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from worker.conversation_store import ConversationStore

OPS_TOKEN = "ops-test-token-0123456789abcdefghijklmnop"
TENANT = "106500000000001"
PERSON = "5491155550001"


def ops_settings(settings: Settings, **overrides: object) -> Settings:
    return settings.with_overrides(ops_token=OPS_TOKEN, **overrides)


async def park(
    redis: Redis,
    settings: Settings,
    texts: list[str],
    *,
    tenant: str = TENANT,
    person: str = PERSON,
    reason: str = "max_attempts",
    error: str = "boom",
) -> str:
    """Store messages, claim them as a batch and park it in review as the worker would; the
    review item's id (the batch id). The tenant is registered as the receiver registers it."""
    scripts = Scripts()
    await scripts.load(redis)
    keys = Keys(settings.key_prefix)
    k = keys.tenant(tenant)
    await redis.sadd(keys.tenants, tenant)
    for i, text in enumerate(texts):
        ev = events.message_event(
            channel="whatsapp",
            tenant=tenant,
            person=person,
            message_id=f"wamid.{person}.{i}.{time.monotonic_ns()}",
            type="text",
            text=text,
            ts=int(time.time()),
            received_ms=0,
            raw={},
        )
        await scripts.ingest(
            redis,
            k,
            seen=[k.seen(events.dedupe_id(ev))],
            dedupe_ttl_s=60,
            events=[events.encode(ev)],
        )
    store = ConversationStore(
        settings.with_overrides(debounce_window_s=0.01, max_wait_s=0.01),
        scripts,
        GroupCommitter(redis, scripts),
    )
    await store.claim(tenant, 0, "t")  # intake
    await asyncio.sleep(0.05)
    claim = await store.claim(tenant, 5, "t")
    (batch,) = claim.batches
    assert await store.finish_review(batch, reason, error, claim.now_ms)
    return batch.id


async def sign_in(client: httpx.AsyncClient, name: str = "Ana") -> str:
    """Sign in with the ops token; the CSRF token of the session."""
    answer = await client.post("/ops/signin", data={"token": OPS_TOKEN, "name": name})
    assert answer.status_code == 303, answer.text
    return await csrf_of(client)


async def csrf_of(client: httpx.AsyncClient, path: str = "/ops/") -> str:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)
