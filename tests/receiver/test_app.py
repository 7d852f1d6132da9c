"""The receiver app in-process (httpx.ASGITransport, lifespan running) against a real Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from receiver.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.receiver.support import (
    TENANT,
    TENANT_2,
    URL,
    counts,
    deadletters,
    dumps,
    inbox,
    payload,
    post,
    running,
    text_message,
)
from tests.support.helpers import APP_SECRET, VERIFY_TOKEN, fixture_bytes, sign

TEXT = fixture_bytes("whatsapp/text.json")


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


# --- verification handshake --------------------------------------------------------------------


async def test_handshake_echoes_the_challenge(client: httpx.AsyncClient) -> None:
    params = {
        "hub.mode": "subscribe",
        "hub.verify_token": VERIFY_TOKEN,
        "hub.challenge": "1158201444",
    }
    response = await client.get(URL, params=params)
    assert response.status_code == 200
    assert response.text == "1158201444"
    assert response.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize(
    "params",
    [
        {"hub.mode": "subscribe", "hub.verify_token": "wrong", "hub.challenge": "1"},
        {"hub.mode": "unsubscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1"},
        {"hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1"},
        {"hub.mode": "subscribe", "hub.challenge": "1"},
        {},
    ],
)
async def test_handshake_refused(client: httpx.AsyncClient, params: dict[str, str]) -> None:
    response = await client.get(URL, params=params)
    assert response.status_code == 403
    assert "1" not in response.text


async def test_empty_configured_token_never_matches(settings: Settings, redis: Redis) -> None:
    async with running(settings.with_overrides(whatsapp_verify_token="")) as client:
        params = {"hub.mode": "subscribe", "hub.verify_token": "", "hub.challenge": "1"}
        assert (await client.get(URL, params=params)).status_code == 403


# --- signatures ---------------------------------------------------------------------------------


async def test_signed_post_is_stored(client: httpx.AsyncClient, redis: Redis) -> None:
    response = await post(client, TEXT)
    assert response.status_code == 200
    assert counts(response) == {"stored": 1, "duplicates": 0}
    [event] = await inbox(redis)
    assert (event["id"], event["text"], event["person"]) == (
        "wamid.FIXTURE0001",
        "Hola",
        "5491155550001",
    )


@pytest.mark.parametrize(
    ("signature", "status"),
    [
        (None, 401),
        (sign(TEXT, "not-the-secret"), 403),
        (sign(TEXT + b"\n"), 403),
        ("sha256=nothex", 403),
        ("sha1=" + sign(TEXT).removeprefix("sha256="), 403),
        ("", 403),
    ],
)
async def test_unsigned_or_wrongly_signed_stores_nothing(
    client: httpx.AsyncClient, redis: Redis, signature: str | None, status: int
) -> None:
    response = await post(client, TEXT, signature=signature)
    assert response.status_code == status
    assert await redis.dbsize() == 0


async def test_rotated_secret_is_accepted(settings: Settings, redis: Redis) -> None:
    rotated = settings.with_overrides(whatsapp_app_secrets=("brand-new", APP_SECRET))
    async with running(rotated) as client:
        assert (await post(client, TEXT, sign(TEXT, "brand-new"))).status_code == 200
        other = fixture_bytes("whatsapp/image.json")
        assert (await post(client, other, sign(other, APP_SECRET))).status_code == 200
        assert (await post(client, TEXT, sign(TEXT, "retired"))).status_code == 403
    assert [e["id"] for e in await inbox(redis)] == ["wamid.FIXTURE0001", "wamid.FIXTURE0007"]


async def test_no_secret_configured_refuses_and_warns(
    settings: Settings, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="receiver.app")
    async with running(settings.with_overrides(whatsapp_app_secrets=())) as client:
        assert any("WHATSAPP_APP_SECRET" in r.getMessage() for r in caplog.records)
        assert (await post(client, TEXT, sign(TEXT, ""))).status_code == 403
        assert (await post(client, TEXT)).status_code == 403
        assert (await post(client, TEXT, signature=None)).status_code == 403
    assert await redis.dbsize() == 0


# --- storage ------------------------------------------------------------------------------------


async def test_same_payload_five_times_concurrently_is_one_item(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    responses = await asyncio.gather(*(post(client, TEXT) for _ in range(5)))
    assert [r.status_code for r in responses] == [200] * 5
    assert sum(counts(r)["stored"] for r in responses) == 1
    assert sum(counts(r)["duplicates"] for r in responses) == 4
    assert len(await inbox(redis)) == 1


async def test_many_messages_for_two_tenants_land_in_order(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    first = [text_message(f"wamid.A{i}", body=f"a{i}") for i in range(300)]
    second = [text_message(f"wamid.B{i}", person="15550009999") for i in range(200)]
    more = [text_message(f"wamid.A{i}") for i in range(300, 500)]
    body = dumps(payload((TENANT, first, []), (TENANT_2, second, []), (TENANT, more, [])))
    response = await post(client, body)
    assert counts(response) == {"stored": 700, "duplicates": 0}
    assert [e["id"] for e in await inbox(redis, TENANT)] == [f"wamid.A{i}" for i in range(500)]
    assert [e["id"] for e in await inbox(redis, TENANT_2)] == [f"wamid.B{i}" for i in range(200)]
    assert await redis.smembers(Keys().tenants) == {TENANT.encode(), TENANT_2.encode()}


async def test_every_fixture_is_stored_once(client: httpx.AsyncClient, redis: Redis) -> None:
    names = [
        "text.json",
        "burst_one_post.json",
        "image.json",
        "interactive_button_reply.json",
        "location.json",
        "reaction.json",
        "reply_with_context.json",
        "unsupported.json",
        "user_without_phone.json",
        "messages_and_statuses.json",
        "two_tenants_one_post.json",
    ]
    for _ in range(2):
        for name in names:
            assert (await post(client, fixture_bytes(f"whatsapp/{name}"))).status_code == 200
    events = await inbox(redis)
    messages = [e for e in events if e["kind"] != "status"]
    assert len(messages) == len({e["id"] for e in messages}) == 13
    # A status has no dedupe marker: applying it again changes nothing (lib/outbound.lua).
    assert [e["id"] for e in events if e["kind"] == "status"] == ["wamid.OUTBOUND0001"] * 2
    by_id = {e["id"]: e for e in events}
    assert by_id["wamid.FIXTURE0013"]["person"] == "AR.4410000000000000001"
    assert by_id["wamid.FIXTURE0008"]["context"] == "wamid.OUTBOUND0001"
    assert by_id["wamid.FIXTURE0009"]["text"] == "[button: Confirmar]"
    assert await deadletters(redis) == []


async def test_statuses_are_stored_each_time_without_a_marker(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    names = ["status_sent", "status_delivered", "status_read", "status_delivered"]
    for name in names:
        assert (await post(client, fixture_bytes(f"whatsapp/{name}.json"))).status_code == 200
    events = await inbox(redis)
    assert [(e["kind"], e["id"], e["status"]) for e in events] == [
        ("status", "wamid.OUTBOUND0001", "sent"),
        ("status", "wamid.OUTBOUND0001", "delivered"),
        ("status", "wamid.OUTBOUND0001", "read"),
        ("status", "wamid.OUTBOUND0001", "delivered"),
    ]
    k = Keys().tenant(TENANT)
    assert [key async for key in redis.scan_iter(match=f"{k.base}:*")] == [k.inbox.encode()]


async def test_duplicates_inside_one_body_are_stored_once(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    body = dumps(
        payload((TENANT, [text_message("w1"), text_message("w1"), text_message("w2")], []))
    )
    assert counts(await post(client, body)) == {"stored": 2, "duplicates": 1}


async def test_dedupe_marker_expires(
    client: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await post(client, TEXT)
    k = Keys().tenant(TENANT)
    book = sorted([key.decode() async for key in redis.scan_iter(match=f"{k.seen_book}*")])
    [shard] = [key for key in book if not key.endswith("gens")]
    # A generation takes markers for DEDUPE_TTL_S, its shards live that much longer.
    assert settings.dedupe_ttl_s < await redis.ttl(shard) <= 2 * settings.dedupe_ttl_s
    assert 0 < await redis.ttl(k.seen_gens) <= 2 * settings.dedupe_ttl_s + 60
    assert await redis.scard(shard) == 1


async def test_workers_are_woken_once_per_tenant(client: httpx.AsyncClient, redis: Redis) -> None:
    queue = Keys().wake_queue
    await post(client, fixture_bytes("whatsapp/two_tenants_one_post.json"))
    # Every tenant that got new work is on the new-work queue, once.
    woken = await redis.zrange(queue, 0, -1, withscores=True)
    assert sorted(m for m, _ in woken) == sorted([TENANT.encode(), TENANT_2.encode()])
    # New messages while the tenant waits: it keeps its place (no worker needed, no growth).
    for i in range(5):
        await asyncio.sleep(0.002)  # a later score, were it replaced
        body = dumps(payload((TENANT, [text_message(f"wamid.again{i}")], [])))
        assert counts(await post(client, body))["stored"] == 1
    assert await redis.zrange(queue, 0, -1, withscores=True) == woken


# --- dead letters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"this is not json {",
        b"\xff\xfe\x00garbage",
        b"",
        b"[1, 2, 3]",
        b'"just a string"',
        b'{"object": "whatsapp_business_account"}',
        b'{"object": "whatsapp_business_account", "entry": {"not": "a list"}}',
        dumps(payload(("{tag}", [text_message("w1")], []))),
        json.dumps(payload((TENANT, [{**text_message("w1"), "x": nested(300)}], []))).encode(),
    ],
)
async def test_signed_garbage_is_dead_lettered_whole(
    client: httpx.AsyncClient, redis: Redis, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="receiver")
    response = await post(client, body)
    assert response.status_code == 200
    assert await deadletters(redis) == [body]
    assert await redis.keys("*{*}*") == []  # no tenant key was touched
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "w1" not in warnings[0].getMessage()


async def test_partially_valid_body_stores_the_good_and_dead_letters_the_body(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    body = dumps(
        payload(
            (TENANT, [text_message("good1"), {"type": "text", "text": {"body": "no id"}}], []),
            (TENANT_2, [text_message("good2", person="1555")], []),
        )
    )
    response = await post(client, body)
    assert response.status_code == 200
    assert counts(response) == {"stored": 2, "duplicates": 0, "deadlettered": True}
    assert [e["id"] for e in await inbox(redis, TENANT)] == ["good1"]
    assert [e["id"] for e in await inbox(redis, TENANT_2)] == ["good2"]
    assert await deadletters(redis) == [body]


async def test_other_fields_are_ignored(client: httpx.AsyncClient, redis: Redis) -> None:
    body = dumps(
        {
            "object": "whatsapp_business_account",
            "entry": [
                {"id": "1", "changes": [{"field": "account_update", "value": {"event": "x"}}]}
            ],
        }
    )
    response = await post(client, body)
    assert counts(response) == {"stored": 0, "duplicates": 0}
    assert await redis.dbsize() == 0


# --- size limits --------------------------------------------------------------------------------


async def test_oversize_with_content_length_is_413(settings: Settings, redis: Redis) -> None:
    async with running(settings.with_overrides(max_body_bytes=1000)) as client:
        body = b"x" * 1001
        assert (await post(client, body)).status_code == 413
        assert (await post(client, b"{}" + b" " * 998)).status_code == 200  # exactly the limit
    assert await redis.lrange(Keys().deadletter, 0, -1) == [b"{}" + b" " * 998]


async def test_oversize_chunked_is_413(settings: Settings, redis: Redis) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"y" * 100

    async with running(settings.with_overrides(max_body_bytes=1000)) as client:
        response = await client.post(
            URL, content=chunks(), headers={"X-Hub-Signature-256": "sha256=00"}
        )
        assert "content-length" not in response.request.headers
        assert response.status_code == 413
    assert await redis.dbsize() == 0


@pytest.mark.parametrize(("declared", "max_pulled"), [(b"10", 4), (b"5000", 0), (None, 4)])
async def test_lying_content_length_cannot_make_it_read_more(
    settings: Settings, redis: Redis, declared: bytes | None, max_pulled: int
) -> None:
    app = create_app(settings.with_overrides(max_body_bytes=1000))
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"z" * 300, "more_body": pulled < 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": URL,
        "raw_path": URL.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"x-hub-signature-256", b"sha256=00")],
        "client": ("127.0.0.1", 1),
        "server": ("receiver", 80),
    }
    if declared is not None:
        scope["headers"].append((b"content-length", declared))
    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    assert sent[0]["status"] == 413
    assert pulled <= max_pulled  # stopped right after crossing 1000 bytes, not after 300 KB
    assert await redis.dbsize() == 0


# --- health -------------------------------------------------------------------------------------


async def test_healthz_and_readyz(client: httpx.AsyncClient) -> None:
    health = await client.get("/healthz")
    assert (health.status_code, health.text) == (200, "ok")
    assert (await client.get("/readyz")).status_code == 200


async def test_create_app_does_not_connect(settings: Settings) -> None:
    app = create_app(settings.with_overrides(redis_url="redis://127.0.0.1:1/0"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
        assert (await c.get("/healthz")).status_code == 200


async def test_an_unexpected_error_is_503_not_500(
    client: httpx.AsyncClient, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    app = client._transport.app  # type: ignore[attr-defined]
    app.state.receiver.writer = object()  # anything that blows up inside the handler
    response = await post(client, TEXT)
    assert response.status_code == 503
    assert any(r.levelno == logging.ERROR for r in caplog.records)
