"""Helpers of the Chatwoot tests: the API stand-in's tokens and the webhook secret, the tenant
and conversation they use, signed incoming messages, and waiting for turns to end."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from redis.asyncio import Redis

from scripts.standins import chatwoot_headers, message_created
from tests.worker.support import stats, wait_for

API_TOKEN = "cw-api-token"
TENANT_API_TOKEN = "cw-tenant-token"
WEBHOOK_SECRET = "cw-webhook-secret"
TENANT = "cw-1-3"
CONVERSATION = 42


async def post_message(
    url: str,
    message_id: int,
    content: str,
    conversation: int = CONVERSATION,
    created_at: float | None = None,
    delivery: str | None = None,
    status: str = "pending",
    assignee: dict[str, Any] | None = None,
) -> httpx.Response:
    """A signed incoming `message_created`, as Chatwoot posts it; it must answer 200.
    `status` and `assignee`: the conversation's at that moment."""
    body = orjson.dumps(
        message_created(
            message_id=message_id,
            content=content,
            conversation=conversation,
            created_at=created_at,
            status=status,
            assignee=assignee,
        )
    )
    async with httpx.AsyncClient() as client:
        response = await client.post(
            url, content=body, headers=chatwoot_headers(body, WEBHOOK_SECRET, delivery=delivery)
        )
    assert response.status_code == 200, response.text
    return response


async def ended(redis: Redis, prefix: str, count: int = 1) -> dict[str, int]:
    """The tenant's counters once `count` turns ended (answered or parked for review)."""

    async def counted() -> dict[str, int] | None:
        s = await stats(redis, prefix, TENANT)
        done = s.get("turns", 0) + sum(v for k, v in s.items() if k.startswith("review:"))
        return s if done >= count else None

    return await wait_for(counted, f"{count} Chatwoot turn(s) ended")
