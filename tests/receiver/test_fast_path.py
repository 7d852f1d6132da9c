"""The one-item fast path of the WhatsApp parser agrees with the general walk, always.

`parse_body` tries `_one_item` first and falls back to `parse_payload`. The fast path must
either decline (None) or produce exactly what the general walk produces: the same events (key
order included: the claim script matches the encoded prefix), the same encoded items and
dedupe ids, no problems, nothing ignored.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from receiver.providers.parsing import Parsed
from receiver.providers.whatsapp import _one_item, parse_body, parse_payload
from receiver.providers.whatsapp_plain import plain_text_event
from tests.support.helpers import FIXTURES, fixture_json

NOW_MS = 1_764_500_000_000


def _same(fast: Parsed, general: Parsed) -> None:
    assert fast.events == general.events
    assert [list(e) for es in fast.events.values() for e in es] == [
        list(e) for es in general.events.values() for e in es
    ], "key order differs"
    assert fast.items == general.items
    assert fast.problems == general.problems == []
    assert fast.ignored_fields == general.ignored_fields == []


ONE_ITEM_FIXTURES = [
    "text.json",
    "status_sent.json",
    "status_delivered.json",
    "status_read.json",
    "status_failed_window.json",
    "user_without_phone.json",
    "image.json",
    "interactive_button_reply.json",
    "location.json",
    "reaction.json",
    "reply_with_context.json",
    "unsupported.json",
    "reaction_removed.json",
    "revoke.json",
    "edit.json",
    "call_permission_reply.json",
    "request_welcome.json",
]


@pytest.mark.parametrize("name", ONE_ITEM_FIXTURES)
def test_one_item_fixtures_take_the_fast_path_and_agree(name: str) -> None:
    payload = fixture_json(f"whatsapp/{name}")
    fast = _one_item(payload, NOW_MS)
    assert fast is not None, "a one-message body should take the fast path"
    _same(fast, parse_payload(copy.deepcopy(payload), NOW_MS))


def _value(payload: Any) -> Any:
    return payload["entry"][0]["changes"][0]["value"]


def _status_by_user_id() -> Any:
    payload = fixture_json("whatsapp/status_read.json")
    status = _value(payload)["statuses"][0]
    status["recipient_user_id"] = status.pop("recipient_id").replace("549", "AR.")
    return payload


def _message_by_user_id_only() -> Any:
    payload = fixture_json("whatsapp/text.json")
    message = _value(payload)["messages"][0]
    message["from_user_id"] = "AR." + message.pop("from")
    return payload


def _message_by_lone_contact() -> Any:
    payload = fixture_json("whatsapp/user_without_phone.json")
    del _value(payload)["messages"][0]["from_user_id"]
    return payload


@pytest.mark.parametrize(
    "make", [_status_by_user_id, _message_by_user_id_only, _message_by_lone_contact]
)
def test_every_sender_rule_takes_the_fast_path(make: Any) -> None:
    """Each way the general walk finds the person is one the fast path knows too."""
    fast = _one_item(make(), NOW_MS)
    assert fast is not None
    _same(fast, parse_payload(make(), NOW_MS))
    (event,) = next(iter(fast.events.values()))
    assert event["person"].startswith("AR.")


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("whatsapp/*.json")), ids=lambda p: p.name)
def test_every_fixture_parses_the_same_either_way(path: Any) -> None:
    payload = orjson.loads(path.read_bytes())
    via_body = parse_body(path.read_bytes(), NOW_MS)
    general = parse_payload(payload, NOW_MS)
    assert via_body.events == general.events
    assert via_body.items == general.items
    assert via_body.problems == general.problems
    assert via_body.ignored_fields == general.ignored_fields


@pytest.mark.parametrize(
    "name", ["burst_one_post.json", "two_tenants_one_post.json", "messages_and_statuses.json"]
)
def test_bodies_with_several_items_decline(name: str) -> None:
    assert _one_item(fixture_json(f"whatsapp/{name}"), NOW_MS) is None


# --- generated bodies: the text fixture with one field replaced by an arbitrary value -------

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "x{y}", "{", "}", "16505551234", "text", "image", "messages", "1"]),
    st.text(max_size=8),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["id", "body", "name", "x"]), st.text(max_size=4), max_size=2),
)

# Where a value can be replaced, as a path into the text fixture's payload.
PATHS: list[tuple[Any, ...]] = [
    ("object",),
    ("entry",),
    ("entry", 0),
    ("entry", 0, "changes"),
    ("entry", 0, "changes", 0),
    ("entry", 0, "changes", 0, "field"),
    ("entry", 0, "changes", 0, "value"),
    ("entry", 0, "changes", 0, "value", "metadata"),
    ("entry", 0, "changes", 0, "value", "metadata", "phone_number_id"),
    ("entry", 0, "changes", 0, "value", "contacts"),
    ("entry", 0, "changes", 0, "value", "contacts", 0),
    ("entry", 0, "changes", 0, "value", "contacts", 0, "wa_id"),
    ("entry", 0, "changes", 0, "value", "contacts", 0, "user_id"),
    ("entry", 0, "changes", 0, "value", "contacts", 0, "profile"),
    ("entry", 0, "changes", 0, "value", "contacts", 0, "profile", "name"),
    ("entry", 0, "changes", 0, "value", "messages"),
    ("entry", 0, "changes", 0, "value", "messages", 0),
    ("entry", 0, "changes", 0, "value", "messages", 0, "id"),
    ("entry", 0, "changes", 0, "value", "messages", 0, "from"),
    ("entry", 0, "changes", 0, "value", "messages", 0, "from_user_id"),
    ("entry", 0, "changes", 0, "value", "messages", 0, "type"),
    ("entry", 0, "changes", 0, "value", "messages", 0, "timestamp"),
    ("entry", 0, "changes", 0, "value", "messages", 0, "text"),
    ("entry", 0, "changes", 0, "value", "messages", 0, "text", "body"),
    ("entry", 0, "changes", 0, "value", "messages", 0, "context"),
    ("entry", 0, "changes", 0, "value", "messages", 0, "context", "id"),
    ("entry", 0, "changes", 0, "value", "statuses"),
]

# The same for the delivered-status fixture.
STATUS_PATHS: list[tuple[Any, ...]] = [
    *PATHS[:9],
    ("entry", 0, "changes", 0, "value", "messages"),
    ("entry", 0, "changes", 0, "value", "contacts"),
    ("entry", 0, "changes", 0, "value", "statuses"),
    ("entry", 0, "changes", 0, "value", "statuses", 0),
    ("entry", 0, "changes", 0, "value", "statuses", 0, "id"),
    ("entry", 0, "changes", 0, "value", "statuses", 0, "status"),
    ("entry", 0, "changes", 0, "value", "statuses", 0, "recipient_id"),
    ("entry", 0, "changes", 0, "value", "statuses", 0, "recipient_user_id"),
    ("entry", 0, "changes", 0, "value", "statuses", 0, "timestamp"),
    ("entry", 0, "changes", 0, "value", "statuses", 0, "errors"),
]


def _replace(payload: Any, path: tuple[Any, ...], value: Any) -> Any:
    """`payload` with the value at `path` replaced (created when the parent is an object)."""
    parent = payload
    for step in path[:-1]:
        if isinstance(parent, dict) and step in parent:
            parent = parent[step]
        elif isinstance(parent, list) and isinstance(step, int) and step < len(parent):
            parent = parent[step]
        else:
            return payload  # an earlier replacement removed this branch
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
        parent[last] = value
    return payload


def _check_mutated(base: str, changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    payload = fixture_json(f"whatsapp/{base}")
    for path, value in changes:
        payload = _replace(payload, path, value)
    try:
        body = orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return  # not a body Meta could send (e.g. an integer wider than 64 bits)
    fast = _one_item(orjson.loads(body), NOW_MS)  # what the receiver sees: orjson's types
    general = parse_payload(orjson.loads(body), NOW_MS)
    if fast is not None:
        _same(fast, general)
    assert parse_body(body, NOW_MS).items == general.items


@hypothesis_settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PATHS), ODD_VALUES), max_size=3))
def test_fast_path_declines_or_agrees_on_mutated_messages(
    changes: list[tuple[tuple[Any, ...], Any]],
) -> None:
    _check_mutated("text.json", changes)


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(STATUS_PATHS), ODD_VALUES), max_size=3))
def test_fast_path_declines_or_agrees_on_mutated_statuses(
    changes: list[tuple[tuple[Any, ...], Any]],
) -> None:
    _check_mutated("status_failed_window.json", changes)


def test_mutation_helper_changes_what_it_names() -> None:
    """Guard for the property test above: a replacement really lands where its path says."""
    # Another number: a sender that is not one (e.g. "changed") is refused since ids are
    # checked (shared/ids.py), and the fast path declines it.
    payload = _replace(fixture_json("whatsapp/text.json"), PATHS[18], "16505550000")
    assert payload["entry"][0]["changes"][0]["value"]["messages"][0]["from"] == "16505550000"
    assert _one_item(payload, NOW_MS) is not None
    removed = _replace(fixture_json("whatsapp/text.json"), PATHS[15], [])
    assert _one_item(removed, NOW_MS) is None


# --- the plain text shortcut (receiver/providers/whatsapp_plain.py) ----------------------


def test_plain_text_shortcut_builds_the_general_event() -> None:
    """A text with only from, id, timestamp, type and text takes the shortcut, and its event is
    `message_event`'s, key order included (the claim script matches the encoded prefix)."""
    payload = fixture_json("whatsapp/text.json")
    value = _value(payload)
    event = plain_text_event(
        value["messages"][0], value["contacts"][0], "wamid.FIXTURE0001", NOW_MS
    )
    assert event is not None, "the text fixture should take the shortcut"
    (general,) = next(
        iter(parse_payload(fixture_json("whatsapp/text.json"), NOW_MS).events.values())
    )
    assert list(event.items()) == list(general.items())


@pytest.mark.parametrize(
    "change",
    [
        ("timestamp", "01764421200"),  # str(ts) differs: the general event keeps it in raw
        ("timestamp", " 1764421200"),
        ("timestamp", "1_764_421_200"),
        ("timestamp", "soon"),
        ("timestamp", "-5"),
        ("text", {"body": "hi", "preview_url": False}),
        ("text", {"body": 5}),
        ("from", ""),
        ("from", "+5491155550001"),
    ],
)
def test_plain_text_shortcut_declines_or_agrees(change: tuple[str, Any]) -> None:
    """Whatever the shortcut leaves to the general way, the fast path still agrees with it."""

    def make() -> Any:
        payload = fixture_json("whatsapp/text.json")
        _value(payload)["messages"][0][change[0]] = change[1]
        return payload

    fast = _one_item(make(), NOW_MS)
    general = parse_payload(make(), NOW_MS)
    if fast is None:
        assert general.problems
    else:
        _same(fast, general)


def test_plain_text_shortcut_names_only_the_sender() -> None:
    payload = fixture_json("whatsapp/text.json")
    _value(payload)["contacts"][0]["wa_id"] = "5491100000000"  # a contact who is not the sender
    fast = _one_item(payload, NOW_MS)
    assert fast is not None
    (event,) = next(iter(fast.events.values()))
    assert "name" not in event
