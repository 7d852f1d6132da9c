"""`POST /webhooks/chatwoot` on the real receiver app and a real Redis: what each request gets
and what it leaves in Redis (nothing, unless it is an authentic incoming message)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import chatwoot_headers, message_created
from shared.events import decode
from shared.keys import Keys
from shared.ops import markers
from shared.settings import Settings
from tests.receiver.support import running
from tests.support.helpers import fixture_bytes, sign

URL = "/webhooks/chatwoot"
SECRET = "cw-webhook-secret"
TOKEN = "cw-url-token"
TENANT = "cw-1-3"


def incoming(message_id: int, content: str = "hola", conversation: int = 42) -> bytes:
    return orjson.dumps(
        message_created(message_id=message_id, content=content, conversation=conversation)
    )


async def post(
    client: httpx.AsyncClient, body: bytes, headers: dict[str, str], query: str = ""
) -> httpx.Response:
    return await client.post(URL + query, content=body, headers=headers)


async def inbox(redis: Redis, tenant: str = TENANT) -> list[dict[str, Any]]:
    return [decode(x) for x in reversed(await redis.lrange(Keys().tenant(tenant).inbox, 0, -1))]


async def stored_nothing(redis: Redis) -> bool:
    return await redis.dbsize() == 0


def stored(response: httpx.Response) -> tuple[int, int]:
    assert response.status_code == 200, response.text
    return int(response.headers["x-stored"]), int(response.headers["x-duplicates"])


@pytest.fixture
def cw_settings(settings: Settings) -> Settings:
    return settings.with_overrides(
        chatwoot_webhook_secrets=(SECRET,), chatwoot_webhook_tokens=(TOKEN,)
    )


async def test_a_signed_incoming_message_is_stored_and_the_tenant_registered(
    cw_settings: Settings, redis: Redis
) -> None:
    body = incoming(9001, "hola, ¿tienen turno?")
    async with running(cw_settings) as client:
        response = await post(client, body, chatwoot_headers(body, SECRET, delivery="d-1"))
    assert stored(response) == (1, 0)
    (event,) = await inbox(redis)  # the tenant's
    assert (event["person"], event["id"]) == ("42", "9001")
    assert event["text"] == "hola, ¿tienen turno?" and event["raw"]["delivery"] == "d-1"
    assert await redis.smembers(Keys().tenants) == {TENANT.encode()}
    assert await markers.marked(redis, Keys().tenant(TENANT), ["chatwoot:9001"]) == [True]


async def test_the_url_token_authenticates_an_unsigned_agent_bot(
    cw_settings: Settings, redis: Redis
) -> None:
    body = incoming(9002)
    async with running(cw_settings) as client:
        response = await post(client, body, chatwoot_headers(body), f"?token={TOKEN}")
    assert stored(response) == (1, 0)
    assert [e["id"] for e in await inbox(redis)] == ["9002"]


def _stale(body: bytes) -> dict[str, str]:
    return chatwoot_headers(body, SECRET, timestamp=int(time.time()) - 400)


def _unsigned_with_timestamp(body: bytes) -> dict[str, str]:
    headers = chatwoot_headers(body, SECRET)
    del headers["X-Chatwoot-Signature"]
    return headers


REFUSALS = {
    "unsigned, no token": (lambda body: chatwoot_headers(body), "", 401),
    "unsigned, only a timestamp": (_unsigned_with_timestamp, "", 401),
    "wrong secret": (lambda body: chatwoot_headers(body, "not-the-secret"), "", 403),
    "stale timestamp": (_stale, "", 403),
    "wrong token": (lambda body: chatwoot_headers(body), "?token=nope", 403),
    "empty token": (lambda body: chatwoot_headers(body), "?token=", 401),
    "wrong signature with the right token": (
        lambda body: chatwoot_headers(body, "not-the-secret"),
        f"?token={TOKEN}",
        403,
    ),
    "Meta's signature": (
        lambda body: {"X-Hub-Signature-256": sign(body), "Content-Type": "application/json"},
        "",
        401,
    ),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
async def test_unauthenticated_requests_are_refused_and_store_nothing(
    cw_settings: Settings, redis: Redis, case: str
) -> None:
    make_headers, query, status = REFUSALS[case]
    body = incoming(9003)
    async with running(cw_settings) as client:
        response = await post(client, body, make_headers(body), query)
    assert response.status_code == status, response.text
    assert await stored_nothing(redis)


async def test_without_secret_or_token_the_route_refuses_everything(
    settings: Settings, redis: Redis
) -> None:
    body = incoming(9004)
    async with running(settings) as client:  # only WhatsApp's secret is configured
        for headers, query in [
            (chatwoot_headers(body, SECRET), ""),
            (chatwoot_headers(body), "?token=anything"),
            (chatwoot_headers(body), ""),
        ]:
            assert (await post(client, body, headers, query)).status_code == 403
    assert await stored_nothing(redis)


@pytest.mark.parametrize(
    "fixture", ["message_created_outgoing.json", "message_created_private_note.json"]
)
async def test_outgoing_messages_and_private_notes_are_answered_200_and_not_stored(
    cw_settings: Settings, redis: Redis, fixture: str
) -> None:
    body = fixture_bytes(f"chatwoot/{fixture}")
    async with running(cw_settings) as client:
        response = await post(client, body, chatwoot_headers(body, SECRET))
    assert stored(response) == (0, 0)
    assert await stored_nothing(redis)


async def test_template_messages_and_other_events_are_answered_200_and_not_stored(
    cw_settings: Settings, redis: Redis
) -> None:
    template = message_created(message_id=9005, content="Hi", conversation=42)
    template["message_type"] = "template"
    status_changed = {"event": "conversation_status_changed", "id": 42, "status": "open"}
    async with running(cw_settings) as client:
        for payload in (template, status_changed):
            body = orjson.dumps(payload)
            assert stored(await post(client, body, chatwoot_headers(body, SECRET))) == (0, 0)
    assert await stored_nothing(redis)


async def test_the_same_message_again_is_a_duplicate_whatever_its_delivery_id(
    cw_settings: Settings, redis: Redis
) -> None:
    body = incoming(9006)
    async with running(cw_settings) as client:
        first = await post(client, body, chatwoot_headers(body, SECRET, delivery="d-6"))
        # Chatwoot's retry: the same delivery id, signed anew.
        retry = await post(client, body, chatwoot_headers(body, SECRET, delivery="d-6"))
        # Chatwoot's duplicate-event bug: a new delivery id for the same message.
        again = await post(client, body, chatwoot_headers(body, SECRET, delivery="d-7"))
        # Through the other credential, too.
        token = await post(client, body, chatwoot_headers(body), f"?token={TOKEN}")
    assert stored(first) == (1, 0)
    assert [stored(r) for r in (retry, again, token)] == [(0, 1)] * 3
    assert [e["id"] for e in await inbox(redis)] == ["9006"]


async def test_one_conversation_per_person_and_one_tenant_per_inbox(
    cw_settings: Settings, redis: Redis
) -> None:
    bodies = [
        incoming(1, conversation=42),
        incoming(2, conversation=43),
        orjson.dumps(message_created(message_id=3, content="x", conversation=44, inbox=4)),
        orjson.dumps(message_created(message_id=4, content="x", conversation=45, account=2)),
    ]
    async with running(cw_settings) as client:
        for body in bodies:
            assert stored(await post(client, body, chatwoot_headers(body, SECRET))) == (1, 0)
    assert [e["person"] for e in await inbox(redis)] == ["42", "43"]
    assert [e["person"] for e in await inbox(redis, "cw-1-4")] == ["44"]
    assert [e["person"] for e in await inbox(redis, "cw-2-3")] == ["45"]


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        orjson.dumps({**message_created(message_id=9, content="x", conversation=42), "id": None}),
        orjson.dumps({**message_created(message_id=9, content="x", conversation=42), "account": 5}),
    ],
    ids=["not-json", "not-an-object", "no-message-id", "no-account"],
)
async def test_signed_garbage_is_dead_lettered_whole_and_answered_200(
    cw_settings: Settings, redis: Redis, body: bytes
) -> None:
    async with running(cw_settings) as client:
        response = await post(client, body, chatwoot_headers(body, SECRET))
    assert stored(response) == (0, 0) and response.headers["x-deadlettered"] == "1"
    assert await redis.lrange(Keys().deadletter, 0, -1) == [body]
    assert await redis.keys(f"{Keys().prefix}:{{*") == [], "no tenant key was written"


async def test_the_whatsapp_route_is_unchanged_next_to_it(
    cw_settings: Settings, redis: Redis
) -> None:
    wa = fixture_bytes("whatsapp/text.json")
    cw = incoming(9010)
    async with running(cw_settings) as client:
        wa_answer = await client.post(
            "/webhooks/whatsapp",
            content=wa,
            headers={"X-Hub-Signature-256": sign(wa), "Content-Type": "application/json"},
        )
        # A Chatwoot request to WhatsApp's route (and back) is not authenticated there.
        crossed = await client.post("/webhooks/whatsapp", content=cw, headers=chatwoot_headers(cw))
        crossed_back = await post(client, wa, {"X-Hub-Signature-256": sign(wa)})
    assert stored(wa_answer) == (1, 0)
    assert (crossed.status_code, crossed_back.status_code) == (401, 401)
    assert await redis.smembers(Keys().tenants) == {b"106500000000001"}


async def test_an_oversize_body_is_413_before_anything_is_checked(
    cw_settings: Settings, redis: Redis
) -> None:
    body = incoming(9011, "x" * 2000)
    async with running(cw_settings.with_overrides(max_body_bytes=1000)) as client:
        response = await post(client, body, chatwoot_headers(body, SECRET))
    assert response.status_code == 413
    assert await stored_nothing(redis)
