"""Ids that are not of their documented shape (shared/ids.py), signed and posted to the real
receiver (issue 21, finding 3): each gets 200 with `x-deadlettered`, its body kept whole on the
dead-letter list, the reason in the log, and nothing else in Redis: no inbox, no conversation,
no tenant registered. A good item beside a bad one is still stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from scripts.webhooks import (
    chatwoot_headers,
    inbound_webhook,
    message_created,
    meta_headers,
    text_message,
    whatsapp_webhook,
)
from shared.keys import Keys
from shared.settings import Settings
from tests.receiver.support import TENANT, URL, counts, deadletters, inbox, running
from tests.support.helpers import APP_SECRET

PERSON = "5491155550001"
MIB = 1024 * 1024
# What an attacker puts where an id goes: a quote and a backslash (JSON escapes, which the
# intake once matched as text), hash-tag braces, path steps for the Graph URL, a megabyte.
HOSTILE = {
    "quote": 'ab"one',
    "backslash": "ab\\",
    "brace": "a{b}",
    "slash": "106/../me",
    "dots": "../../me",
    "1MiB": "1" * MIB,
}
Body = Callable[[str], dict[str, Any]]


def _message(person: str = PERSON, message_id: str = "wamid.OK1", **extra: Any) -> dict[str, Any]:
    return {**text_message(message_id, "hola", person), **extra}


def _status(recipient: str = PERSON, status_id: str = "wamid.OUT1") -> dict[str, Any]:
    return whatsapp_webhook(
        {
            "statuses": [
                {
                    "id": status_id,
                    "status": "read",
                    "recipient_id": recipient,
                    "timestamp": "1764421200",
                }
            ]
        },
        phone_number_id=TENANT,
    )


def _image(media_id: str) -> dict[str, Any]:
    image = {
        "id": "wamid.IMG1",
        "from": PERSON,
        "timestamp": "1764421200",
        "type": "image",
        "image": {"id": media_id, "mime_type": "image/jpeg", "sha256": "x"},
    }
    return inbound_webhook(TENANT, PERSON, [image])


def _number_change(new: str) -> dict[str, Any]:
    system = {
        "id": "wamid.SYS1",
        "from": PERSON,
        "timestamp": "1764421200",
        "type": "system",
        "system": {"type": "user_changed_number", "wa_id": new, "body": "changed"},
    }
    return inbound_webhook(TENANT, PERSON, [system])


def _user_only(user_id: str) -> dict[str, Any]:
    message = _message()
    del message["from"]
    message["from_user_id"] = user_id
    return whatsapp_webhook(
        {"contacts": [{"profile": {"name": "Ana"}, "user_id": user_id}], "messages": [message]},
        phone_number_id=TENANT,
    )


# Where an id goes, the body that carries a hostile one there, and the reason logged.
PLACES: dict[str, tuple[Body, str]] = {
    "phone_number_id": (
        lambda bad: inbound_webhook(bad, PERSON, [_message()]),
        "tenant id missing or unusable in a Redis key",
    ),
    "from": (lambda bad: inbound_webhook(TENANT, bad, [_message(bad)]), "message without from"),
    "from_user_id": (_user_only, "from_user_id is not a business-scoped user id"),
    "from_user_id beside a number": (
        lambda bad: inbound_webhook(TENANT, PERSON, [_message(from_user_id=bad)]),
        "from_user_id is not a business-scoped user id",
    ),
    "message id": (
        lambda bad: inbound_webhook(TENANT, PERSON, [_message(message_id=bad)]),
        "message without id",
    ),
    "status recipient": (lambda bad: _status(recipient=bad), "status without recipient"),
    "status id": (lambda bad: _status(status_id=bad), "status without id"),
    "media id": (_image, "media id is not digits"),
    "new wa_id": (_number_change, "number change to a wa_id that is not digits"),
}


@pytest.fixture
def caplog_warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="receiver.app")
    return caplog


async def _post_signed(client: httpx.AsyncClient, doc: Any) -> tuple[bytes, httpx.Response]:
    body = orjson.dumps(doc)
    return body, await client.post(URL, content=body, headers=meta_headers(APP_SECRET, body))


async def _only_the_deadletter(redis: Redis) -> bool:
    keys = {k async for k in redis.scan_iter()}
    return keys == {Keys().deadletter.encode()}


def _reason_logged(caplog: pytest.LogCaptureFixture, reason: str) -> bool:
    return any(
        "dead-lettered" in r.getMessage() and reason in r.getMessage() for r in caplog.records
    )


# A wamid is base64, which holds `/`, and is never part of a URL: a slash or dots there are
# not hostile (the other shapes are).
CASES = [
    pytest.param(place, value, id=f"{place}-{name}")
    for place in PLACES
    for name, value in HOSTILE.items()
    if not (place.endswith(" id") and place != "media id" and name in ("slash", "dots"))
]


@pytest.mark.parametrize(("place", "value"), CASES)
async def test_a_hostile_id_is_dead_lettered_and_stores_nothing(
    client: httpx.AsyncClient,
    redis: Redis,
    caplog_warnings: pytest.LogCaptureFixture,
    place: str,
    value: str,
) -> None:
    """Every place an id goes, every hostile shape: 200, the body kept whole with the reason
    logged, nothing stored, no tenant registered."""
    make, reason = PLACES[place]
    body, response = await _post_signed(client, make(value))
    assert counts(response) == {"stored": 0, "duplicates": 0, "deadlettered": True}
    assert await deadletters(redis) == [body]
    assert await _only_the_deadletter(redis)
    assert _reason_logged(caplog_warnings, reason)


async def test_a_good_message_beside_a_hostile_one_is_stored(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    """One bad item never holds the others back; the body is still kept for the bad one."""
    doc = inbound_webhook(TENANT, PERSON, [_message(), _message('ab"two', "wamid.BAD")])
    body, response = await _post_signed(client, doc)
    assert counts(response) == {"stored": 1, "duplicates": 0, "deadlettered": True}
    assert [e["id"] for e in await inbox(redis)] == ["wamid.OK1"]
    assert await deadletters(redis) == [body]


@pytest.mark.parametrize(
    "person", ["16505551234", "US.13491208655302741918", "US.ENT.11815799212886844830"]
)
async def test_documented_ids_are_stored(
    client: httpx.AsyncClient, redis: Redis, person: str
) -> None:
    """The shapes Meta documents pass: a number, a business-scoped user id, a parent one."""
    number = inbound_webhook(TENANT, person, [_message(person)])
    doc = _user_only(person) if "." in person else number
    _, response = await _post_signed(client, doc)
    assert counts(response) == {"stored": 1, "duplicates": 0}
    assert [e["person"] for e in await inbox(redis)] == [person]


# --- tenants of the two providers -----------------------------------------------------------


async def test_a_chatwoot_tenant_id_as_phone_number_id_never_reaches_the_chatwoot_tenant(
    settings: Settings, redis: Redis, caplog_warnings: pytest.LogCaptureFixture
) -> None:
    """`cw-1-3` is Chatwoot's inbox 3 of account 1; as a WhatsApp phone_number_id it is not
    digits, so it is dead-lettered and the Chatwoot tenant's inbox holds only Chatwoot's
    message (the rule: WhatsApp tenants are digits, Chatwoot tenants start with `cw-`)."""
    secret = "cw-webhook-secret"
    async with running(settings.with_overrides(chatwoot_webhook_secrets=(secret,))) as client:
        cw_body = orjson.dumps(message_created(message_id=7, content="hola", conversation=42))
        answer = await client.post(
            "/webhooks/chatwoot", content=cw_body, headers=chatwoot_headers(cw_body, secret)
        )
        assert counts(answer) == {"stored": 1, "duplicates": 0}
        doc = inbound_webhook("cw-1-3", "42", [_message("42", "wamid.WA1")])
        body, response = await _post_signed(client, doc)
    assert counts(response) == {"stored": 0, "duplicates": 0, "deadlettered": True}
    assert await deadletters(redis) == [body]
    assert [(e["channel"], e["id"]) for e in await inbox(redis, "cw-1-3")] == [("chatwoot", "7")]
    assert await redis.smembers(Keys().tenants) == {b"cw-1-3"}


# --- how many tenants one body may register -------------------------------------------------


def _many_tenants(count: int, tenant: Callable[[int], str]) -> dict[str, Any]:
    """One body with a change per tenant, one message each (8 000 of them: about 2 MiB)."""
    changes = [
        {
            "field": "messages",
            "value": {
                "metadata": {"phone_number_id": tenant(i)},
                "messages": [_message(message_id=f"wamid.T{i}")],
            },
        }
        for i in range(count)
    ]
    return {"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": changes}]}


async def test_one_body_registers_at_most_a_hundred_tenants(
    client: httpx.AsyncClient, redis: Redis, caplog_warnings: pytest.LogCaptureFixture
) -> None:
    """8 000 valid tenants in one body once registered 8 000 tenants for good: now the first
    100 are stored and registered, and the body is kept for the rest."""
    body, response = await _post_signed(client, _many_tenants(8000, lambda i: str(10**14 + i)))
    assert counts(response) == {"stored": 100, "duplicates": 0, "deadlettered": True}
    assert await redis.scard(Keys().tenants) == 100
    assert await deadletters(redis) == [body]
    assert _reason_logged(caplog_warnings, "more than 100 tenants in one body")


async def test_hostile_tenants_register_nothing(client: httpx.AsyncClient, redis: Redis) -> None:
    body, response = await _post_signed(client, _many_tenants(8000, lambda i: f"t-{i}"))
    assert counts(response) == {"stored": 0, "duplicates": 0, "deadlettered": True}
    assert await _only_the_deadletter(redis)
    assert await deadletters(redis) == [body]


# --- Chatwoot ids ---------------------------------------------------------------------------

CW_SECRET = "cw-webhook-secret"


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("conversation", "42/../../profile"),
        ("conversation", "4.2"),
        ("conversation", "1" * MIB),
        ("conversation", 2**60),
        ("account", "1/../2"),
        ("account", -1),
        ("inbox", "3 "),
        ("inbox", '3"'),
    ],
)
async def test_a_chatwoot_id_that_is_not_an_integer_is_dead_lettered(
    settings: Settings, redis: Redis, where: str, value: Any
) -> None:
    """Chatwoot's account, inbox and conversation ids go into the tenant id, the keys and the
    API URL (`/accounts/{account}/conversations/{conversation}`): only integers pass."""
    doc = message_created(message_id=7, content="hola", conversation=42)
    target = {"conversation": doc["conversation"], "account": doc["account"], "inbox": doc["inbox"]}
    target[where]["id"] = value
    if where == "inbox":
        doc["conversation"]["inbox_id"] = value
    body = orjson.dumps(doc)
    async with running(settings.with_overrides(chatwoot_webhook_secrets=(CW_SECRET,))) as client:
        response = await client.post(
            "/webhooks/chatwoot", content=body, headers=chatwoot_headers(body, CW_SECRET)
        )
    assert counts(response) == {"stored": 0, "duplicates": 0, "deadlettered": True}
    assert await deadletters(redis) == [body]
    assert await _only_the_deadletter(redis)
