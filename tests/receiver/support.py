"""Helpers of the receiver tests, used by other directories too: the app running in-process,
signed posts, webhook bodies as Meta shapes them, and readers of what the receiver stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis
from starlette.applications import Starlette

from receiver.app import create_app
from shared.events import decode
from shared.keys import Keys
from shared.settings import Settings
from tests.support.helpers import sign

URL = "/webhooks/whatsapp"
TENANT = "106500000000001"
TENANT_2 = "106500000000002"


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app of `settings` with its lifespan started, and a client talking to it in-process."""
    app: Starlette = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
            yield client


async def post(
    client: httpx.AsyncClient, body: bytes, signature: str | None = "sign", **headers: str
) -> httpx.Response:
    """POST `body`, signed with the test secret unless `signature` is given (None: unsigned)."""
    if signature == "sign":
        signature = sign(body)
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    headers.setdefault("Content-Type", "application/json")
    return await client.post(URL, content=body, headers=headers)


def dumps(payload: Any) -> bytes:
    return orjson.dumps(payload)


async def inbox(redis: Redis, tenant: str = TENANT) -> list[dict[str, Any]]:
    """The tenant's inbox in arrival order (the receiver LPUSHes, so the list is reversed)."""
    raw = await redis.lrange(Keys().tenant(tenant).inbox, 0, -1)
    return [decode(item) for item in reversed(raw)]


async def deadletters(redis: Redis) -> list[bytes]:
    return list(reversed(await redis.lrange(Keys().deadletter, 0, -1)))


def text_message(message_id: str, person: str = "5491155550001", body: str = "hola") -> Any:
    return {
        "from": person,
        "id": message_id,
        "timestamp": "1764421200",
        "type": "text",
        "text": {"body": body},
    }


def payload(*changes: tuple[str, list[Any], list[Any]]) -> dict[str, Any]:
    """A webhook body with one entry per (tenant, messages, statuses)."""
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": f"waba-{tenant}",
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {"display_phone_number": "1555", "phone_number_id": tenant},
                            "messages": messages,
                            "statuses": statuses,
                        },
                    }
                ],
            }
            for tenant, messages, statuses in changes
        ],
    }


def counts(response: httpx.Response) -> dict[str, Any]:
    """What a 200 webhook answer reports, from its headers (the body is empty)."""
    assert response.status_code == 200 and response.content == b""
    answer: dict[str, Any] = {
        "stored": int(response.headers["x-stored"]),
        "duplicates": int(response.headers["x-duplicates"]),
    }
    if response.headers.get("x-deadlettered"):
        answer["deadlettered"] = True
    return answer
