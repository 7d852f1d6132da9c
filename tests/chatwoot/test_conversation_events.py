"""What Chatwoot tells us about people taking a conversation over, as the receiver takes it in:
conversation events that start or end the bot's silence (kind "conversation") and agents'
messages (kind "human"), from bodies shaped as Chatwoot's own code builds them
(tests/fixtures/chatwoot/: `Conversations::EventDataPresenter#push_data` + `event` +
`changed_attributes`, `Message#webhook_data`). Parsing is pure; the route is the real receiver
app on a real Redis: signed, deduplicated, bad input dead-lettered, the rest ignored."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from receiver.providers.chatwoot import parse_body
from receiver.providers.chatwoot_conversations import effect_of
from scripts.standins import chatwoot_headers, message_created
from scripts.webhooks import agent_user, conversation_webhook
from shared.events import decode
from shared.keys import Keys
from shared.settings import Settings
from tests.chatwoot.test_webhook import SECRET, TENANT, cw_settings, inbox, post, stored
from tests.receiver.support import running
from tests.support.helpers import fixture_bytes, fixture_json

__all__ = ["cw_settings"]  # the fixture, shared with test_webhook.py
NOW_MS = 1_764_500_000_123


def only_event(body: bytes) -> dict[str, Any]:
    parsed = parse_body(body, NOW_MS)
    assert parsed.problems == [] and parsed.ignored_fields == []
    ((tenant, [event]),) = parsed.events.items()
    assert tenant == TENANT
    return event


def test_an_assignment_is_a_conversation_event_that_silences_the_bot() -> None:
    body = fixture_bytes("chatwoot/conversation_updated_assignee.json")
    event = only_event(body)
    assert (event["kind"], event["person"]) == ("conversation", "42")  # of TENANT: only_event
    assert (event["effect"], event["why"], event["name"]) == ("silence", "assignee", "Laura Gómez")
    assert event["type"] == "conversation_updated"
    assert event["ts"] == 1795964460  # the conversation's updated_at
    assert event["raw"]["assignee"] == {"id": 12, "name": "Laura Gómez", "type": "user"}
    ((dedupe, encoded),) = parse_body(body, NOW_MS).items[TENANT]
    assert dedupe.startswith("chatwoot:conversation_updated:42:")
    assert encoded.startswith(b'{"v":1,"kind":"conversation","person":"42"')
    assert decode(encoded) == event


def test_back_to_pending_and_an_agent_bots_opened_event() -> None:
    pending = only_event(fixture_bytes("chatwoot/conversation_status_changed.json"))
    assert (pending["effect"], pending["why"]) == ("speak", "pending")
    opened = only_event(fixture_bytes("chatwoot/conversation_opened.json"))
    assert (opened["effect"], opened["why"], opened["name"]) == ("silence", "opened", "")


def _event(name: str, **changes: tuple[Any, Any]) -> dict[str, Any]:
    return conversation_webhook(name, conversation=42, changed_attributes=changes or None)


@pytest.mark.parametrize(
    ("payload", "effect"),
    [
        (_event("conversation_status_changed", status=("pending", "open")), ("silence", "opened")),
        (_event("conversation_status_changed", status=("open", "pending")), ("speak", "pending")),
        (_event("conversation_status_changed", status=("open", "resolved")), ("speak", "resolved")),
        (_event("conversation_status_changed", status=("resolved", "open")), ("speak", "reopened")),
        (
            _event("conversation_status_changed", status=("resolved", "pending")),
            ("speak", "pending"),
        ),
        (_event("conversation_status_changed", status=("snoozed", "open")), None),
        (_event("conversation_updated", assignee_id=(None, 12)), ("silence", "assignee")),
        (_event("conversation_updated", assignee_id=(12, 15)), ("silence", "assignee")),
        (_event("conversation_updated", assignee_id=(12, None)), None),  # unassigned: no change
        (_event("conversation_updated", label_list=([], ["vip"])), None),
        (_event("conversation_updated"), None),
        (_event("conversation_opened"), ("silence", "opened")),
        (_event("conversation_resolved"), ("speak", "resolved")),
        (_event("conversation_created"), None),
        # Without changed_attributes only a status that says it all counts.
        ({"event": "conversation_status_changed", "status": "pending"}, ("speak", "pending")),
        ({"event": "conversation_status_changed", "status": "open"}, None),
        # changed_attributes as one object, as some versions write it.
        (
            {
                "event": "conversation_updated",
                "changed_attributes": {"assignee_id": {"previous_value": None, "current_value": 3}},
            },
            ("silence", "assignee"),
        ),
    ],
)
def test_which_changes_start_or_end_the_silence(
    payload: dict[str, Any], effect: tuple[str, str] | None
) -> None:
    assert effect_of(payload) == effect


def test_the_account_id_comes_from_the_last_message_or_the_payload() -> None:
    payload = _event("conversation_updated", assignee_id=(None, 12))
    assert only_event(orjson.dumps(payload))["kind"] == "conversation"  # of TENANT
    payload["messages"] = []
    payload["account"] = {"id": 2}
    assert parse_body(orjson.dumps(payload), NOW_MS).events.keys() == {"cw-2-3"}


def test_an_agents_message_is_a_human_event_the_bots_own_and_notes_are_not() -> None:
    event = only_event(fixture_bytes("chatwoot/message_created_agent.json"))
    assert (event["kind"], event["person"], event["id"]) == ("human", "42", "9010")
    assert event["name"] == "Laura Gómez" and event["text"].startswith("Hola Ana, soy Laura.")
    for name, why in [
        ("message_created_outgoing.json", "message_type outgoing"),  # the agent bot's reply
        ("message_created_private_note.json", "message_type outgoing"),
    ]:
        parsed = parse_body(fixture_bytes(f"chatwoot/{name}"), NOW_MS)
        assert (parsed.events, parsed.ignored_fields) == ({}, [why])
    note = fixture_json("chatwoot/message_created_agent.json")
    note["private"] = True
    automation = {**fixture_json("chatwoot/message_created_agent.json"), "sender": None}
    for payload in (note, automation):
        assert parse_body(orjson.dumps(payload), NOW_MS).ignored_fields == ["message_type outgoing"]


def test_a_customers_message_keeps_the_conversations_status() -> None:
    event = only_event(fixture_bytes("chatwoot/message_created_incoming.json"))
    assert event["kind"] == "message" and event["raw"]["conversation_status"] == "pending"


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"id": None}, "conversation event without conversation id"),
        ({"id": "{42}"}, "conversation event without conversation id"),
        ({"messages": [], "account": None}, "conversation event without account id"),
        ({"messages": "x"}, "conversation event without account id"),
        ({"inbox_id": None}, "conversation event without inbox id"),
    ],
)
def test_a_conversation_event_that_cannot_be_routed_is_a_problem(
    changes: dict[str, Any], problem: str
) -> None:
    payload = {**_event("conversation_updated", assignee_id=(None, 12)), **changes}
    parsed = parse_body(orjson.dumps(payload), NOW_MS)
    assert parsed.events == {} and parsed.problems == [problem]


async def test_the_route_stores_conversation_and_agent_events_once_and_ignores_the_rest(
    cw_settings: Settings, redis: Redis
) -> None:
    assigned = fixture_bytes("chatwoot/conversation_updated_assignee.json")
    agent = fixture_bytes("chatwoot/message_created_agent.json")
    labels = orjson.dumps(_event("conversation_updated", label_list=([], ["vip"])))
    async with running(cw_settings) as client:
        first = [await post(client, b, chatwoot_headers(b, SECRET)) for b in (assigned, agent)]
        # Chatwoot's retry and its duplicate-event bug: the same body again.
        again = [await post(client, b, chatwoot_headers(b, SECRET)) for b in (assigned, agent)]
        ignored = await post(client, labels, chatwoot_headers(labels, SECRET))
    assert [stored(r) for r in first] == [(1, 0), (1, 0)]
    assert [stored(r) for r in again] == [(0, 1), (0, 1)]
    assert stored(ignored) == (0, 0)
    assert [(e["kind"], e["person"]) for e in await inbox(redis)] == [
        ("conversation", "42"),
        ("human", "42"),
    ]


async def test_an_unroutable_conversation_event_is_dead_lettered_whole(
    cw_settings: Settings, redis: Redis
) -> None:
    payload = {**_event("conversation_status_changed", status=("open", "pending")), "messages": []}
    body = orjson.dumps(payload)
    async with running(cw_settings) as client:
        response = await post(client, body, chatwoot_headers(body, SECRET))
        unsigned = await post(client, body, chatwoot_headers(body))
    assert stored(response) == (0, 0) and response.headers["x-deadlettered"] == "1"
    assert unsigned.status_code == 401
    assert await redis.lrange(Keys().deadletter, 0, -1) == [body]
    assert await redis.keys(f"{Keys().prefix}:{{*") == [], "no tenant key was written"


def test_the_stand_ins_bodies_are_shaped_like_the_fixtures() -> None:
    """scripts/webhooks.py builds what the e2e tests post: the fields the parser reads sit
    where Chatwoot's own bodies (the fixtures) have them."""
    ours = conversation_webhook(
        "conversation_updated",
        conversation=42,
        assignee=agent_user(12, "Laura Gómez"),
        changed_attributes={"assignee_id": (None, 12)},
    )
    fixture = fixture_json("chatwoot/conversation_updated_assignee.json")
    for key in ("id", "inbox_id", "status", "event"):
        assert type(ours[key]) is type(fixture[key])
    assert ours["meta"]["assignee"].keys() == fixture["meta"]["assignee"].keys()
    assert ours["changed_attributes"][0] == fixture["changed_attributes"][0]
    assert ours["messages"][0]["account_id"] == fixture["messages"][0]["account_id"]
    message = message_created(
        message_id=1,
        content="x",
        conversation=42,
        message_type="outgoing",
        sender=agent_user(12, "Laura Gómez"),
    )
    assert only_event(orjson.dumps(message))["kind"] == "human"


def test_only_pending_still_drops_customers_messages_but_not_agents_or_events() -> None:
    """CHATWOOT_ONLY_PENDING filters the customer's messages of conversations not `pending`,
    as before; an agent's message and a conversation event are taken in either way."""
    agent = fixture_bytes("chatwoot/message_created_agent.json")  # in an `open` conversation
    assigned = fixture_bytes("chatwoot/conversation_updated_assignee.json")
    assert [parse_body(b, NOW_MS, only_pending=True).count for b in (agent, assigned)] == [1, 1]
    customer = fixture_json("chatwoot/message_created_incoming.json")
    customer["conversation"]["status"] = "open"
    parsed = parse_body(orjson.dumps(customer), NOW_MS, only_pending=True)
    assert parsed.count == 0 and parsed.ignored_fields == ["conversation status open"]
