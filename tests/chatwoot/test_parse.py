"""Chatwoot bodies into inbox events, and the authentication of a request: pure functions."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from receiver.providers.base import WebhookRequest
from receiver.providers.chatwoot import ChatwootInbound, describe, parse_body, timestamp
from receiver.providers.signature import SignatureError
from scripts.standins import message_created, sign_chatwoot
from shared.events import decode
from tests.support.helpers import fixture_bytes, fixture_json

NOW_MS = 1_764_500_000_123
SECRET = "cw-secret"


def body(**changes: Any) -> bytes:
    payload = fixture_json("chatwoot/message_created_incoming.json")
    payload.update(changes)
    return orjson.dumps(payload)


def test_an_incoming_message_is_one_event_of_the_inbox_tenant_and_the_conversation() -> None:
    parsed = parse_body(fixture_bytes("chatwoot/message_created_incoming.json"), NOW_MS, "d-1")
    assert parsed.problems == [] and parsed.ignored_fields == []
    ((tenant, [event]),) = parsed.events.items()
    assert tenant == "cw-1-3"
    assert event["channel"] == "chatwoot" and "tenant" not in event
    assert event["person"] == "42" and event["id"] == "9001"
    assert (event["type"], event["text"]) == ("text", "hola, ¿tienen turno?")
    assert event["name"] == "Ana Pérez" and "context" not in event, "left out when none"
    assert event["ts"] == 1795964400  # 2026-11-29T15:00:00Z
    assert event["received_ms"] == NOW_MS
    assert event["raw"]["conversation_id"] == 42 and event["raw"]["delivery"] == "d-1"
    assert "conversation" not in event["raw"], "the conversation block is not kept per message"
    # Stored as the claim script routes it; deduped on channel + Chatwoot's message id.
    ((dedupe, encoded),) = parsed.items["cw-1-3"]
    assert dedupe == "chatwoot:9001"
    assert decode(encoded) == event
    assert encoded.startswith(b'{"v":1,"kind":"message","person":"42"')


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("message_created_outgoing.json", "message_type outgoing"),
        ("message_created_private_note.json", "message_type outgoing"),
    ],
)
def test_the_bots_and_agents_messages_are_ignored(name: str, why: str) -> None:
    parsed = parse_body(fixture_bytes(f"chatwoot/{name}"), NOW_MS)
    assert parsed.events == {} and parsed.problems == []
    assert parsed.ignored_fields == [why]


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"message_type": "template"}, "message_type template"),
        ({"message_type": "activity"}, "message_type activity"),
        ({"message_type": 1}, "message_type int"),
        ({"private": True}, "private note"),  # an incoming private message: never for the bot
        ({"event": "conversation_status_changed"}, "event conversation_status_changed"),
        ({"event": "message_updated"}, "event message_updated"),
        ({"event": None}, "event missing"),
    ],
)
def test_templates_private_notes_and_other_events_are_ignored(
    changes: dict[str, Any], why: str
) -> None:
    parsed = parse_body(body(**changes), NOW_MS)
    assert (parsed.events, parsed.problems, parsed.ignored_fields) == ({}, [], [why])


def test_the_enum_index_zero_counts_as_incoming() -> None:
    assert parse_body(body(message_type=0), NOW_MS).count == 1


def test_only_pending_conversations_when_asked() -> None:
    pending = body()  # the fixture's conversation is pending
    opened = orjson.loads(pending)
    opened["conversation"]["status"] = "open"
    assert parse_body(pending, NOW_MS, only_pending=True).count == 1
    parsed = parse_body(orjson.dumps(opened), NOW_MS, only_pending=True)
    assert parsed.count == 0 and parsed.ignored_fields == ["conversation status open"]
    assert parse_body(orjson.dumps(opened), NOW_MS).count == 1, "answered by default"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"not json", "body is not JSON"),
        (b"[1, 2]", "body is not an object"),
        (body(id=None), "message without id"),
        (body(id="abc"), "message without id"),
        (body(id=True), "message without id"),
        (body(account=None), "message without account id"),
        (body(account={"id": "1}"}), "message without account id"),
        (body(conversation=None), "message without conversation"),
        (body(conversation={"id": None, "inbox_id": 3}), "message without conversation id"),
        (body(conversation={"id": "{42}", "inbox_id": 3}), "message without conversation id"),
        (body(inbox=None, conversation={"id": 42}), "message without inbox id"),
    ],
)
def test_an_incoming_message_that_cannot_be_routed_is_a_problem(raw: bytes, problem: str) -> None:
    parsed = parse_body(raw, NOW_MS)
    assert parsed.events == {} and parsed.problems == [problem]


def test_ids_as_digit_strings_and_the_inbox_from_the_conversation() -> None:
    parsed = parse_body(
        body(id="9001", account={"id": "1"}, inbox=None, conversation={"id": "42", "inbox_id": 3}),
        NOW_MS,
    )
    ((tenant, [event]),) = parsed.events.items()
    assert (tenant, event["person"], event["id"]) == ("cw-1-3", "42", "9001")


def test_attachments_are_described_like_whatsapp_media() -> None:
    image = {"file_type": "image", "data_url": "https://x/1.jpg"}
    assert describe({"content": "así está", "attachments": [image]}) == (
        "image",
        "[image: así está]",
    )
    assert describe({"content": None, "attachments": [{"file_type": "file"}, image]}) == (
        "document",
        "[document] [image]",
    )
    assert describe({"content": None, "attachments": [{}]}) == ("attachment", "[attachment]")
    assert describe({"content": None}) == ("text", "")
    assert describe({"content": "hola", "content_attributes": {"in_reply_to": 7}}) == (
        "text",
        "hola",
    )


def test_a_reply_keeps_the_quoted_message_id() -> None:
    (event,) = parse_body(body(content_attributes={"in_reply_to": 8999}), NOW_MS).events["cw-1-3"]
    assert event["context"] == "8999"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-29T15:00:00.000Z", 1795964400),
        ("2026-11-29T15:00:00+00:00", 1795964400),
        (1795964400, 1795964400),
        (1795964400.7, 1795964400),
        ("1795964400", 1795964400),
        ("yesterday", NOW_MS // 1000),
        (None, NOW_MS // 1000),
        (-5, NOW_MS // 1000),
        (float("nan"), NOW_MS // 1000),
        (True, NOW_MS // 1000),
    ],
)
def test_created_at_in_every_shape_else_the_receive_time(value: Any, expected: int) -> None:
    assert timestamp(value, NOW_MS) == expected


# --- authentication -----------------------------------------------------------------------


def request(raw: bytes, query: bytes = b"", **headers: str) -> WebhookRequest:
    return WebhookRequest({k.replace("_", "-").encode(): v for k, v in headers.items()}, query, raw)


def signed(raw: bytes, secret: str = SECRET, at: float | None = None) -> WebhookRequest:
    stamp = int(time.time() if at is None else at)
    return request(
        raw,
        x_chatwoot_timestamp=str(stamp),
        x_chatwoot_signature=sign_chatwoot(secret, raw, stamp),
    )


def tampered(req: WebhookRequest) -> WebhookRequest:
    return WebhookRequest(req.headers, req.query_string, req.body + b" ")


def refusal(inbound: ChatwootInbound, req: WebhookRequest, now: float | None = None) -> int:
    with pytest.raises(SignatureError) as caught:
        inbound.verify(req, time.time() if now is None else now)
    return caught.value.status_code


RAW = orjson.dumps(message_created(message_id=1, content="hola", conversation=42))


def test_a_signature_over_timestamp_dot_body_is_accepted_with_any_rotated_secret() -> None:
    inbound = ChatwootInbound(["new", SECRET], [])
    inbound.verify(signed(RAW), time.time())
    inbound.verify(signed(RAW, "new"), time.time())
    assert inbound.configured


@pytest.mark.parametrize(
    ("make", "status"),
    [
        (lambda: request(RAW), 401),  # unsigned
        (lambda: request(RAW, x_chatwoot_signature=sign_chatwoot(SECRET, RAW, 1)), 401),
        (lambda: signed(RAW, "other-secret"), 403),
        (lambda: tampered(signed(RAW)), 403),  # a body changed after signing
        (lambda: signed(RAW, at=time.time() - 301), 403),  # stale
        (lambda: signed(RAW, at=time.time() + 301), 403),  # from the future
        (
            lambda: request(
                RAW,
                x_chatwoot_timestamp="soon",
                x_chatwoot_signature=sign_chatwoot(SECRET, RAW, "soon"),
            ),
            403,
        ),
        (
            lambda: request(
                RAW,
                x_chatwoot_timestamp=str(int(time.time())),
                x_chatwoot_signature=sign_chatwoot(SECRET, RAW, int(time.time())).removeprefix(
                    "sha256="
                ),
            ),
            403,
        ),
    ],
    ids=[
        "unsigned",
        "no-timestamp",
        "wrong-secret",
        "tampered",
        "stale",
        "future",
        "bad-timestamp",
        "no-prefix",
    ],
)
def test_bad_signatures_are_refused(make: Any, status: int) -> None:
    assert refusal(ChatwootInbound([SECRET], []), make()) == status


def test_the_timestamp_signed_is_the_one_in_the_header() -> None:
    stamp = int(time.time())
    req = request(
        RAW,
        x_chatwoot_timestamp=str(stamp),
        x_chatwoot_signature=sign_chatwoot(SECRET, RAW, stamp - 1),
    )
    assert refusal(ChatwootInbound([SECRET], []), req) == 403


def test_a_url_token_authenticates_unsigned_webhooks() -> None:
    inbound = ChatwootInbound([], ["tok-1", "tok-2"])
    inbound.verify(request(RAW, b"token=tok-2"), time.time())
    inbound.verify(request(RAW, b"a=1&token=tok-1"), time.time())
    assert refusal(inbound, request(RAW)) == 401
    assert refusal(inbound, request(RAW, b"token=")) == 401
    assert refusal(inbound, request(RAW, b"token=tok-3")) == 403
    assert refusal(inbound, request(RAW, b"token=TOK-1")) == 403


def test_with_secret_and_token_a_request_needs_one_and_a_wrong_signature_is_never_saved() -> None:
    inbound = ChatwootInbound([SECRET], ["tok"])
    inbound.verify(signed(RAW), time.time())
    inbound.verify(request(RAW, b"token=tok"), time.time())  # an agent bot: unsigned
    bad = signed(RAW, "other")
    bad_with_token = WebhookRequest(bad.headers, b"token=tok", RAW)
    assert refusal(inbound, bad_with_token) == 403
    assert refusal(inbound, request(RAW)) == 401


def test_nothing_configured_refuses_everything() -> None:
    inbound = ChatwootInbound([], [])
    assert not inbound.configured
    assert refusal(inbound, signed(RAW)) == 403
    assert refusal(inbound, request(RAW, b"token=")) == 403


def test_absurd_headers_and_fields_are_refusals_or_fallbacks_never_crashes() -> None:
    huge = "9" * 400  # int() takes it; a float cannot hold it
    req = request(
        RAW, x_chatwoot_timestamp=huge, x_chatwoot_signature=sign_chatwoot(SECRET, RAW, huge)
    )
    assert refusal(ChatwootInbound([SECRET], []), req) == 403
    assert describe({"content": "hola", "attachments": 5}) == ("text", "hola")
    assert describe({"content": "hola", "attachments": "image"}) == ("text", "hola")
    assert timestamp("9999-12-31T23:59:59-23:59", NOW_MS) == 253402387139  # no overflow
    assert timestamp("0001-01-01T00:00:00+14:00", NOW_MS) == NOW_MS // 1000
