"""The pure parsing functions: every fixture, every message type, every malformed shape."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from receiver.providers.whatsapp import (
    Contacts,
    message_from,
    parse_body,
    parse_payload,
    status_from,
    timestamp,
)
from receiver.providers.whatsapp_text import describe
from shared.events import message_type, received_ms, restore_raw
from tests.receiver.support import TENANT, TENANT_2, payload, text_message
from tests.support.helpers import FIXTURES, fixture_bytes, fixture_json

NOW_MS = 1_764_500_000_123
ANA = "5491155550001"

# fixture -> [(tenant, kind, person, id, type-or-status, text, extra fields)]
EXPECTED: dict[str, list[tuple[str, str, str, str, str, str, dict[str, Any]]]] = {
    "text.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0001", "text", "Hola", {"name": "Ana Pérez"}),
    ],
    "burst_one_post.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0002", "text", "una consulta", {}),
        (TENANT, "message", ANA, "wamid.FIXTURE0003", "text", "¿tienen turno para el sábado?", {}),
        (TENANT, "message", ANA, "wamid.FIXTURE0004", "text", "a la tarde", {"ts": 1764421208}),
    ],
    "image.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0007", "image", "[image: así está la canilla]", {}),
    ],
    "interactive_button_reply.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0009", "interactive", "[button: Confirmar]", {}),
    ],
    "location.json": [
        (
            TENANT,
            "message",
            ANA,
            "wamid.FIXTURE0010",
            "location",
            "[location: Obelisco, Av. 9 de Julio s/n]",
            {},
        ),
    ],
    "reaction.json": [
        (
            *(TENANT, "note", ANA, "wamid.FIXTURE0011", "reaction", "[reaction: 👍]"),
            {"target": "wamid.OUTBOUND0001"},
        ),
    ],
    # Events that are not messages: their own kind, and the message they are about.
    "reaction_removed.json": [
        (
            *(TENANT, "note", ANA, "wamid.FIXTURE0022", "reaction", "[reaction]"),
            {"target": "wamid.OUTBOUND0001"},
        ),
    ],
    "revoke.json": [
        (
            *(TENANT, "revoke", ANA, "wamid.FIXTURE0020", "revoke", "[revoke]"),
            {"target": "wamid.FIXTURE0001"},
        ),
    ],
    "edit.json": [  # the text is the new content
        (
            *(TENANT, "edit", ANA, "wamid.FIXTURE0021", "edit", "Hola, ¿abren el domingo?"),
            {"target": "wamid.FIXTURE0001"},
        ),
    ],
    "system_changed_number.json": [
        (
            *(TENANT, "note", ANA, "wamid.FIXTURE0023", "system"),
            "[system: User A changed from 5491155550001 to 5491155550099]",
            {"new_person": "5491155550099"},
        ),
    ],
    "system_identity_changed.json": [
        (
            *(TENANT, "note", ANA, "wamid.FIXTURE0024", "system"),
            "[system: User A's security code changed]",
            {},
        ),
    ],
    "call_permission_reply.json": [
        (TENANT, "note", ANA, "wamid.FIXTURE0025", "interactive", "[interactive]", {}),
    ],
    "request_welcome.json": [
        (TENANT, "welcome", ANA, "wamid.FIXTURE0026", "request_welcome", "[request_welcome]", {}),
    ],
    "reply_with_context.json": [
        (
            TENANT,
            "message",
            ANA,
            "wamid.FIXTURE0008",
            "text",
            "sí, ese horario me sirve",
            {"context": "wamid.OUTBOUND0001"},
        ),
    ],
    "unsupported.json": [
        (
            *(TENANT, "message", ANA, "wamid.FIXTURE0012", "unsupported"),
            "[the customer sent a message of a kind that cannot be shown here: edit]",
            {},
        ),
    ],
    "user_without_phone.json": [
        (
            TENANT,
            "message",
            "AR.4410000000000000001",
            "wamid.FIXTURE0013",
            "text",
            "hola, soy usuaria nueva",
            {"name": "Luz"},
        ),
    ],
    # Presented in full by the worker from `raw` (tests/worker/test_presentation.py).
    "order.json": [(TENANT, "message", ANA, "wamid.FIXTURE0101", "order", "[order: 2 items]", {})],
    "contacts.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0102", "contacts", "[contacts: Juan García]", {}),
    ],
    "interactive_list_reply.json": [
        (
            TENANT,
            "message",
            ANA,
            "wamid.FIXTURE0103",
            "interactive",
            "[button: Martes 10:00]",
            {"context": "wamid.OUTBOUND0004"},
        ),
    ],
    "interactive_flow_reply.json": [
        (
            TENANT,
            "message",
            ANA,
            "wamid.FIXTURE0104",
            "interactive",
            "[interactive]",
            {"context": "wamid.OUTBOUND0005"},
        ),
    ],
    "button_template_reply.json": [
        (
            TENANT,
            "message",
            ANA,
            "wamid.FIXTURE0105",
            "button",
            "[button: Confirmar]",
            {"context": "wamid.OUTBOUND0006"},
        ),
    ],
    "ad_referral.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0106", "text", "Hola! vi el anuncio, ¿precio?", {}),
    ],
    "forwarded.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0107", "text", "mirá esta promo", {}),
    ],
    "user_with_phone_and_id.json": [
        (
            TENANT,
            "message",
            ANA,
            "wamid.FIXTURE0108",
            "text",
            "soy Ana, con usuario",
            {"name": "Ana Pérez"},
        ),
    ],
    "messages_and_statuses.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0014", "text", "gracias!", {}),
        (TENANT, "status", ANA, "wamid.OUTBOUND0001", "read", "", {"ts": 1764421235}),
    ],
    "status_sent.json": [(TENANT, "status", ANA, "wamid.OUTBOUND0001", "sent", "", {})],
    "status_delivered.json": [
        (TENANT, "status", ANA, "wamid.OUTBOUND0001", "delivered", "", {"ts": 1764421211}),
    ],
    "status_read.json": [(TENANT, "status", ANA, "wamid.OUTBOUND0001", "read", "", {})],
    "status_failed_window.json": [
        (TENANT, "status", ANA, "wamid.OUTBOUND0002", "failed", "", {}),
    ],
    # What the business wrote from the WhatsApp Business app (`smb_message_echoes`): the
    # person is `to` without its "+", so the echo joins the conversation of Ana's messages.
    "echo_text.json": [
        (
            *(TENANT, "echo", ANA, "wamid.ECHO0001", "text"),
            "Hola Ana, soy Marta de la tienda: sí, tenemos talle M.",
            {"ts": 1764421260, "name": ""},
        ),
    ],
    "two_tenants_one_post.json": [
        (TENANT, "message", ANA, "wamid.FIXTURE0005", "text", "buenas", {"name": "Ana Pérez"}),
        (TENANT_2, "message", "15550009999", "wamid.FIXTURE0006", "text", "hello", {"name": "Bo"}),
    ],
}


def test_every_fixture_is_described() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in (FIXTURES / "whatsapp").glob("*.json"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_parses_to_the_right_events(name: str) -> None:
    body = fixture_bytes(f"whatsapp/{name}")
    parsed = parse_body(body, NOW_MS)
    assert parsed.problems == []
    got = [(t, event) for t, events in parsed.events.items() for event in events]
    assert len(got) == len(EXPECTED[name])
    for (of, event), (tenant, kind, person, item_id, what, text, extra) in zip(
        got, EXPECTED[name], strict=True
    ):
        assert list(event)[:3] == ["v", "kind", "person"]  # the prefix the claim script matches
        assert (of, event["kind"], event["person"], event["id"]) == (tenant, kind, person, item_id)
        assert "tenant" not in event, "the keys it is stored under name the tenant"
        assert event.get("channel", "whatsapp") == "whatsapp"
        assert received_ms(event) == NOW_MS
        if kind == "message":  # what its other fields imply is left out (shared/events.py)
            assert "received_ms" not in event and event["rd"] == NOW_MS - event["ts"] * 1000
            assert ("type" in event) == (what != "text")
        if kind != "status":
            assert "channel" not in event, "left out for WhatsApp"
            assert (message_type(event), event["text"]) == (what, text)
            assert event.get("context", "") == extra.get("context", "")
            assert event.get("name", "") == extra.get("name", event.get("name", ""))
            if kind != "message":
                assert event["target"] == extra.get("target", "")
                assert event["new_person"] == extra.get("new_person", "")
            else:
                assert "target" not in event, "a plain message carries no event fields"
        else:
            assert event["status"] == what
        assert event["ts"] == extra.get("ts", event["ts"])
        assert isinstance(event["ts"], int) and event["ts"] > 1_700_000_000
        assert orjson.dumps(event)  # encodable as stored


def test_raw_is_the_provider_object() -> None:
    doc = fixture_json("whatsapp/messages_and_statuses.json")
    value = doc["entry"][0]["changes"][0]["value"]
    events = parse_payload(doc, NOW_MS).events[TENANT]
    assert "raw" not in events[0], "a text: the event's fields hold all of it"
    assert restore_raw(events[0]) == value["messages"][0]
    assert events[1]["raw"] == value["statuses"][0]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_message_object_comes_back_whole_from_its_event(name: str) -> None:
    """The event keeps of `raw` only what its fields do not hold: `restore_raw` (what a turn
    reads as `Message.raw`) gives back Meta's message object exactly, field for field."""
    doc = fixture_json(f"whatsapp/{name}")
    sent = {
        m["id"]: m
        for entry in doc["entry"]
        for change in entry["changes"]
        for key in ("messages", "message_echoes")
        for m in change["value"].get(key, [])
    }
    events = [e for es in parse_payload(doc, NOW_MS).events.values() for e in es]
    for event in events:
        if event["kind"] != "status":
            assert restore_raw(orjson.loads(orjson.dumps(event))) == sent[event["id"]]
            assert len(orjson.dumps(event.get("raw"))) < len(orjson.dumps(sent[event["id"]]))


def test_failed_status_keeps_its_errors() -> None:
    event = parse_body(fixture_bytes("whatsapp/status_failed_window.json"), NOW_MS).events[TENANT]
    assert event[0]["errors"][0]["code"] == 131047


def test_events_grouped_by_tenant_in_body_order() -> None:
    doc = payload(
        (TENANT, [text_message("a1"), text_message("a2")], []),
        (TENANT_2, [text_message("b1")], []),
        (TENANT, [text_message("a3")], [{"id": "o1", "status": "sent", "recipient_id": ANA}]),
    )
    events = parse_payload(doc, NOW_MS).events
    assert [e["id"] for e in events[TENANT]] == ["a1", "a2", "a3", "o1"]
    assert [e["id"] for e in events[TENANT_2]] == ["b1"]


def test_every_entry_and_change_is_read_not_only_the_first() -> None:
    doc = payload((TENANT, [text_message(f"m{i}") for i in range(1000)], []))
    doc["entry"][0]["changes"].append(
        payload((TENANT_2, [text_message("x")], []))["entry"][0]["changes"][0]
    )
    parsed = parse_payload(doc, NOW_MS)
    assert parsed.count == 1001
    assert [e["id"] for e in parsed.events[TENANT]][-1] == "m999"


@pytest.mark.parametrize(
    ("kind", "body", "text"),
    [
        ("text", {"body": "hola"}, "hola"),
        ("image", {"id": "1"}, "[image]"),
        ("video", {"caption": "mirá"}, "[video: mirá]"),
        ("audio", {"id": "1", "voice": True}, "[audio]"),
        ("sticker", {"id": "1"}, "[sticker]"),
        ("document", {"filename": "factura.pdf", "caption": "x"}, "[document: factura.pdf]"),
        ("document", {"caption": "sin nombre"}, "[document: sin nombre]"),
        ("location", {"latitude": -34.6, "longitude": -58.38}, "[location: -34.6, -58.38]"),
        ("location", {"name": "Casa"}, "[location: Casa]"),
        (
            "contacts",
            [{"name": {"formatted_name": "Juan"}}, {"name": {"formatted_name": "Eva"}}],
            "[contacts: Juan, Eva]",
        ),
        (
            "interactive",
            {"type": "list_reply", "list_reply": {"id": "r1", "title": "Sábado"}},
            "[button: Sábado]",
        ),
        ("interactive", {"type": "nfm_reply", "nfm_reply": {}}, "[interactive]"),
        ("button", {"payload": "p", "text": "Confirmar"}, "[button: Confirmar]"),
        ("reaction", {"message_id": "w", "emoji": ""}, "[reaction]"),
        ("order", {"product_items": [{}, {}]}, "[order: 2 items]"),
        ("system", {"body": "cambió de número"}, "[system: cambió de número]"),
        (
            "unsupported",
            {"type": "poll"},
            "[the customer sent a message of a kind that cannot be shown here: poll]",
        ),
        (
            "unsupported",
            "not an object",
            "[the customer sent a message of a kind that cannot be shown here: unknown]",
        ),
        (
            "edit",
            {"original_message_id": "w", "message": {"type": "text", "text": {"body": "hi"}}},
            "hi",
        ),
        ("edit", {"original_message_id": "w"}, "[edit]"),
        ("ephemeral", {}, "[ephemeral]"),
        ("image", "not an object", "[image]"),
    ],
)
def test_describe(kind: str, body: Any, text: str) -> None:
    assert describe({"type": kind, kind: body}) == text


def test_describe_without_type() -> None:
    assert describe({"id": "x"}) == "[unknown]"


def test_status_person_can_be_a_user_id() -> None:
    event = status_from(
        {"id": "o1", "status": "read", "timestamp": "5", "recipient_user_id": "AR.1"}, TENANT, 0
    )
    assert event["person"] == "AR.1"


def test_message_person_from_user_id_without_contacts() -> None:
    message = {"from_user_id": "AR.9", "id": "w1", "type": "text", "text": {"body": "x"}}
    assert message_from(message, TENANT, Contacts.parse(None), 0)["person"] == "AR.9"


def test_message_person_from_lone_contact_user_id() -> None:
    contacts = Contacts.parse([{"profile": {"name": "Luz"}, "user_id": "AR.7"}])
    event = message_from({"id": "w1", "type": "text", "text": {"body": "x"}}, TENANT, contacts, 0)
    assert (event["person"], event["name"]) == ("AR.7", "Luz")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1764421200", 1764421200),
        (1764421200, 1764421200),
        (1764421200.9, 1764421200),
        ("soon", NOW_MS // 1000),
        (None, NOW_MS // 1000),
        (True, NOW_MS // 1000),
        (-5, NOW_MS // 1000),
        (1e300, NOW_MS // 1000),
        ("9" * 5000, NOW_MS // 1000),
    ],
)
def test_timestamp(value: Any, expected: int) -> None:
    assert timestamp(value, NOW_MS) == expected


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"not json", "body is not JSON"),
        (b"[1, 2]", "body is not an object"),
        (b'"x"', "body is not an object"),
        (b"{}", "body.entry is not a list"),
        (b'{"object": "page", "entry": []}', "object is not whatsapp_business_account"),
        (b'{"entry": [3]}', "entry is not an object"),
        (b'{"entry": [{"changes": {}}]}', "entry.changes is not a list"),
        (b'{"entry": [{"changes": [{"field": "messages"}]}]}', "change.value is not an object"),
    ],
)
def test_malformed_bodies_are_problems(body: bytes, problem: str) -> None:
    parsed = parse_body(body, NOW_MS)
    assert parsed.problems == [problem]
    assert parsed.events == {}


@pytest.mark.parametrize(
    ("tenant", "messages", "statuses", "problem"),
    [
        ("{evil}", [text_message("m")], [], "tenant id missing or unusable in a Redis key"),
        ("", [text_message("m")], [], "tenant id missing or unusable in a Redis key"),
        (TENANT, [{"from": ANA, "type": "text"}], [], "message without id"),
        (TENANT, [{"id": "m", "type": "text"}], [], "message without from"),
        (TENANT, [text_message("m", person="a{b}")], [], "message without from"),
        (TENANT, ["text"], [], "message is not an object"),
        (TENANT, {"not": "a list"}, [], "messages is not a list"),
        (TENANT, [], [{"id": "o", "status": "read"}], "status without recipient"),
        (TENANT, [], [{"status": "read", "recipient_id": ANA}], "status without id"),
        (TENANT, [], [{"id": "o", "recipient_id": ANA}], "status without status"),
    ],
)
def test_malformed_items_are_problems(
    tenant: str, messages: Any, statuses: Any, problem: str
) -> None:
    parsed = parse_payload(payload((tenant, messages, statuses)), NOW_MS)
    assert parsed.problems == [problem]
    assert parsed.count == 0


def test_partially_valid_body_keeps_the_good_items_and_reports_the_bad() -> None:
    doc = payload(
        (TENANT, [text_message("good1"), {"type": "text"}, text_message("good2")], []),
        ("{bad}", [text_message("lost")], []),
    )
    parsed = parse_payload(doc, NOW_MS)
    assert [e["id"] for e in parsed.events[TENANT]] == ["good1", "good2"]
    assert sorted(parsed.problems) == [
        "message without id",
        "tenant id missing or unusable in a Redis key",
    ]


def test_other_fields_are_ignored_not_problems() -> None:
    doc = payload((TENANT, [text_message("m")], []))
    doc["entry"][0]["changes"].append({"field": "account_update", "value": {"x": 1}})
    parsed = parse_payload(doc, NOW_MS)
    assert parsed.problems == []
    assert parsed.ignored_fields == ["account_update"]
    assert parsed.count == 1


def test_unencodable_item_is_a_problem_not_a_crash() -> None:
    deep: Any = "x"
    for _ in range(300):  # orjson reads 1024 levels but writes only 255
        deep = [deep]
    doc = payload((TENANT, [text_message("ok"), {**text_message("deep"), "extra": deep}], []))
    parsed = parse_body(json.dumps(doc).encode(), NOW_MS)  # orjson itself cannot write it
    assert parsed.problems == ["item cannot be encoded"]
    assert [item_id for item_id, _ in parsed.items[TENANT]] == ["whatsapp:ok"]


def test_items_are_the_encoded_events() -> None:
    parsed = parse_body(fixture_bytes("whatsapp/messages_and_statuses.json"), NOW_MS)
    assert [item_id for item_id, _ in parsed.items[TENANT]] == [
        "whatsapp:wamid.FIXTURE0014",
        "whatsapp:wamid.OUTBOUND0001:read",
    ]
    assert [orjson.loads(data) for _, data in parsed.items[TENANT]] == parsed.events[TENANT]


def test_problem_texts_never_contain_body_content() -> None:
    secret = "SECRET-CONTENT"
    doc = payload((f"{{{secret}}}", [], []), (TENANT, [{"from": secret, "text": secret}], []))
    doc["entry"].append(secret)
    assert secret not in " ".join(parse_payload(doc, NOW_MS).problems)
