"""`smb_message_echoes`: what the business wrote from the WhatsApp Business app (coexistence).

The receiver takes the field like `messages`: the signature checked, each echo an inbox event of
kind "echo" (shared/events.py), deduplicated on its wamid, stored with its marker in one step;
bad items are problems (the body dead-lettered, the good items kept). The fixture follows the
example of Meta's `smb_message_echoes` webhook reference.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
from redis.asyncio import Redis

from receiver.providers.whatsapp import parse_body, parse_payload
from tests.receiver.support import TENANT, counts, deadletters, dumps, inbox, post, text_message
from tests.support.helpers import fixture_bytes, fixture_json

ECHO = fixture_bytes("whatsapp/echo_text.json")
ANA = "5491155550001"
NOW_MS = 1_764_500_000_123


def echo_body(*echoes: dict[str, Any], messages: list[dict[str, Any]] | None = None) -> Any:
    """The fixture's body with `echoes` as its `message_echoes`; `messages` adds a `messages`
    change after it, in the same entry."""
    doc = copy.deepcopy(fixture_json("whatsapp/echo_text.json"))
    change = doc["entry"][0]["changes"][0]
    change["value"]["message_echoes"] = list(echoes)
    if messages is not None:
        doc["entry"][0]["changes"].append(
            {
                "field": "messages",
                "value": {"metadata": {"phone_number_id": TENANT}, "messages": messages},
            }
        )
    return doc


def an_echo(**changes: Any) -> dict[str, Any]:
    echo = copy.deepcopy(fixture_json("whatsapp/echo_text.json"))
    item: dict[str, Any] = echo["entry"][0]["changes"][0]["value"]["message_echoes"][0]
    item.update(changes)
    return {k: v for k, v in item.items() if v is not None}


def test_an_echo_is_an_echo_event_of_the_person_without_the_plus() -> None:
    parsed = parse_body(ECHO, NOW_MS)
    assert parsed.problems == [] and parsed.ignored_fields == []
    (event,) = parsed.events[TENANT]
    assert event["kind"] == "echo" and event["person"] == ANA
    assert event["type"] == "text" and event["raw"]["from"] == "15550001001"


def test_a_username_person_is_taken_from_to_user_id_and_a_number_without_plus_as_is() -> None:
    parsed = parse_payload(
        echo_body(
            an_echo(id="wamid.E2", to=None, to_user_id="AR.4410001"),
            an_echo(id="wamid.E3", to="5491155550002"),
        ),
        NOW_MS,
    )
    assert parsed.problems == []
    assert [e["person"] for e in parsed.events[TENANT]] == ["AR.4410001", "5491155550002"]


def test_each_bad_echo_is_a_problem_and_the_good_ones_are_kept() -> None:
    """Bad input: an echo without `to`, without `id`, with a `to` that would break the hash
    tag, or not an object, is a problem each (the body is dead-lettered by the app); the good
    echo beside them and the message after them are events."""
    parsed = parse_payload(
        echo_body(
            an_echo(id="wamid.E4", to=None),
            an_echo(id=None),
            an_echo(id="wamid.E5", to="{x}"),
            "not an echo",
            an_echo(id="wamid.E6"),
            messages=[text_message("wamid.M1")],
        ),
        NOW_MS,
    )
    assert parsed.problems == [
        "message echo without to",
        "message echo without id",
        "message echo without to",
        "message echo is not an object",
    ]
    assert [(e["kind"], e["id"]) for e in parsed.events[TENANT]] == [
        ("echo", "wamid.E6"),
        ("message", "wamid.M1"),
    ]


def test_echoes_that_are_not_a_list_are_a_problem() -> None:
    doc = echo_body()
    doc["entry"][0]["changes"][0]["value"]["message_echoes"] = {"id": "x"}
    parsed = parse_payload(doc, NOW_MS)
    assert parsed.problems == ["message_echoes is not a list"] and parsed.count == 0


async def test_the_receiver_stores_an_echo_once_and_dead_letters_a_bad_one(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    first, again = await post(client, ECHO), await post(client, ECHO)
    assert (first.status_code, again.status_code) == (200, 200)
    assert counts(first) == {"stored": 1, "duplicates": 0}
    assert counts(again) == {"stored": 0, "duplicates": 1}
    (stored,) = await inbox(redis)
    assert stored["kind"] == "echo" and stored["id"] == "wamid.ECHO0001"

    bad = dumps(echo_body(an_echo(id="wamid.E7", to=None)))
    response = await post(client, bad)
    assert response.status_code == 200 and counts(response)["stored"] == 0
    assert await deadletters(redis) == [bad]


async def test_an_unsigned_echo_stores_nothing(client: httpx.AsyncClient, redis: Redis) -> None:
    response = await post(client, ECHO, signature=None)
    assert response.status_code in (401, 403)
    assert await inbox(redis) == [] and await deadletters(redis) == []
