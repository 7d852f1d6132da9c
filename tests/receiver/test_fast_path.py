"""The one-message fast path of the WhatsApp parser agrees with the general walk, always.

`parse_body` tries `_one_message` first and falls back to `parse_payload`. The fast path must
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

from receiver.parsing import Parsed
from receiver.whatsapp import _one_message, parse_body, parse_payload
from tests.conftest import FIXTURES, fixture_json

NOW_MS = 1_764_500_000_000


def _same(fast: Parsed, general: Parsed) -> None:
    assert fast.events == general.events
    assert [list(e) for es in fast.events.values() for e in es] == [
        list(e) for es in general.events.values() for e in es
    ], "key order differs"
    assert fast.items == general.items
    assert fast.problems == general.problems == []
    assert fast.ignored_fields == general.ignored_fields == []


ONE_MESSAGE_FIXTURES = [
    "text.json",
    "image.json",
    "interactive_button_reply.json",
    "location.json",
    "reaction.json",
    "reply_with_context.json",
    "unsupported.json",
]


@pytest.mark.parametrize("name", ONE_MESSAGE_FIXTURES)
def test_one_message_fixtures_take_the_fast_path_and_agree(name: str) -> None:
    payload = fixture_json(f"whatsapp/{name}")
    fast = _one_message(payload, NOW_MS)
    assert fast is not None, "a one-message body should take the fast path"
    _same(fast, parse_payload(copy.deepcopy(payload), NOW_MS))


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
    assert _one_message(fixture_json(f"whatsapp/{name}"), NOW_MS) is None


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


@hypothesis_settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PATHS), ODD_VALUES), max_size=3))
def test_fast_path_declines_or_agrees_on_mutated_bodies(
    changes: list[tuple[tuple[Any, ...], Any]],
) -> None:
    payload = fixture_json("whatsapp/text.json")
    for path, value in changes:
        payload = _replace(payload, path, value)
    try:
        body = orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return  # not a body Meta could send (e.g. NaN becomes null only via dumps options)
    decoded = orjson.loads(body)  # what the receiver sees: orjson's own types
    fast = _one_message(decoded, NOW_MS)
    general = parse_payload(orjson.loads(body), NOW_MS)
    if fast is not None:
        _same(fast, general)
    assert parse_body(body, NOW_MS).items == general.items


def test_mutation_helper_changes_what_it_names() -> None:
    """Guard for the property test above: a replacement really lands where its path says."""
    payload = _replace(fixture_json("whatsapp/text.json"), PATHS[18], "changed")
    assert payload["entry"][0]["changes"][0]["value"]["messages"][0]["from"] == "changed"
    assert _one_message(payload, NOW_MS) is not None
    removed = _replace(fixture_json("whatsapp/text.json"), PATHS[15], [])
    assert _one_message(removed, NOW_MS) is None
