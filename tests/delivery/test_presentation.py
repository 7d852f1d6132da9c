"""What reaches the model, end to end: the real receiver app takes Meta-shaped webhooks, real
`python -m worker` processes run the anthropic brain against the Messages API stand-in and
answer through the Graph API stand-in. A burst with an order, a contact card and a reply
quoting our last answer reaches the model with the product ids, the phone and the quoted text,
under a header in the tenant's time zone; a person known only by a username is answered with
`recipient`; one seen with a number and a user id keeps one conversation."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from scripts.webhooks import text_message, whatsapp_webhook
from shared.conversation.batch import Batch
from shared.conversation.presentation import present
from shared.keys import Keys
from shared.settings import Settings
from tests.delivery.support import TENANT, ai_requests, inbound, post_webhook, said
from tests.support.helpers import fixture_json
from tests.worker.support import WorkerFleet, wait_for

pytestmark = pytest.mark.slow

PERSON = "5491155550071"
USER_ID = "AR.4410000000000000071"
ZONE = "America/Argentina/Buenos_Aires"


def like_fixture(name: str, message_id: str, person: str = PERSON) -> dict[str, Any]:
    """The message of a fixture, sent now by `person` under a fresh id."""
    (change,) = fixture_json(f"whatsapp/{name}")["entry"][0]["changes"]
    (message,) = change["value"]["messages"]
    return {**message, "from": person, "id": message_id, "timestamp": str(int(time.time()))}


async def test_a_burst_reaches_the_model_with_nothing_lost(
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await fleet.start(1, **{**env, "TIMEZONE": ZONE})
    ai.queue_reply("Sí: el sábado a las 10:00 o a las 11:30.")
    await post_webhook(
        receiver_url,
        inbound(TENANT, PERSON, text_message("wamid.p1", "¿tienen turno el sábado?", PERSON)),
    )
    (answer,) = await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=15)

    quoting = text_message("wamid.p2", "sí, ese horario me sirve", PERSON)
    quoting["context"] = {"from": "15550001001", "id": answer.wamid}
    burst = [
        quoting,
        like_fixture("order.json", "wamid.p3"),
        like_fixture("contacts.json", "wamid.p4"),
    ]
    await post_webhook(receiver_url, inbound(TENANT, PERSON, *burst))
    await graph.await_for(lambda: len(graph.sent_texts(to=PERSON)) == 2, timeout=15)

    second = ai_requests(ai)[1].body["messages"]
    header, body = (block["text"] for block in second[-1]["content"])
    assert header.startswith("Date and time: ") and f"({ZONE})\nFrom: Ana" in header
    assert body.splitlines() == [
        '(replying to your message "Sí: el sábado a las 10:00 o a las 11:30.")',
        "sí, ese horario me sirve",
        "[order from catalog 7310000000000001]",
        "- product pizza-muzza-grande: quantity 2, 12500 ARS each",
        "- product empanada-carne: quantity 12, 1500 ARS each",
        "note: sin aceitunas por favor",
        "[shared a contact: Juan García: +54 9 11 5555 0002 (cell), juan@example.com (work),"
        " Plomería García]",
    ]
    # The first exchange is remembered as it was sent: header and body, then the answer.
    first = ai_requests(ai)[0].body["messages"][-1]["content"]
    assert second[0]["content"] == first
    assert said(second)[:2] == [
        ("user", "¿tienen turno el sábado?"),
        ("assistant", "Sí: el sábado a las 10:00 o a las 11:30."),
    ]


def username_webhook(message_id: str, text: str, *, phone: str | None) -> bytes:
    """A message from a person with a username: `from_user_id` always, `from` only when the
    webhook shows their number (Meta's contacts carry `user_id`, and `wa_id` with a number)."""
    message: dict[str, Any] = {
        "from_user_id": USER_ID,
        "id": message_id,
        "timestamp": str(int(time.time())),
        "type": "text",
        "text": {"body": text},
    }
    contact: dict[str, Any] = {"profile": {"name": "Luz"}, "user_id": USER_ID}
    if phone:
        message["from"] = phone
        contact["wa_id"] = phone
    return orjson.dumps(
        whatsapp_webhook({"contacts": [contact], "messages": [message]}, phone_number_id=TENANT)
    )


async def test_a_person_known_only_by_a_user_id_is_answered_with_recipient(
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await fleet.start(1, **env)
    await post_webhook(receiver_url, username_webhook("wamid.u1", "hola", phone=None))
    (reply,) = await graph.await_for(lambda: graph.sent_texts(to=USER_ID), timeout=15)
    assert reply.payload["recipient"] == USER_ID and "to" not in reply.payload
    assert reply.body == "stand-in reply to: hola"
    assert ai_requests(ai)[0].body["messages"][-1]["content"][0]["text"].endswith("From: Luz")


async def test_a_person_seen_with_a_number_and_a_user_id_keeps_one_conversation(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """The number keys the conversation; a later message with only the user id joins it (same
    memory), and is answered at the number with `to`."""
    await fleet.start(1, **env)
    await post_webhook(receiver_url, username_webhook("wamid.u2", "soy Luz", phone=PERSON))
    await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=15)
    users = Keys(prefix).tenant(TENANT).users
    assert await redis.hget(users, USER_ID) in (PERSON, PERSON.encode())

    await post_webhook(receiver_url, username_webhook("wamid.u3", "¿y el sábado?", phone=None))
    await graph.await_for(lambda: len(graph.sent_texts(to=PERSON)) == 2, timeout=15)
    assert all(m.payload.get("to") == PERSON for m in graph.sent_texts(to=PERSON))
    assert "recipient" not in graph.sent_texts(to=PERSON)[1].payload
    second = ai_requests(ai)[1].body["messages"]
    assert said(second) == [
        ("user", "soy Luz"),
        ("assistant", "stand-in reply to: soy Luz"),
        ("user", "¿y el sábado?"),
    ]

    async def one_conversation() -> bool:
        keys = Keys(prefix).tenant(TENANT)
        return (
            await redis.exists(keys.memory(USER_ID)) == 0
            and await redis.llen(keys.memory(PERSON)) == 2
        )

    await wait_for(one_conversation, "both exchanges in the number's memory")


class PresentingBrain:
    """A custom brain (`BRAIN=tests.delivery.test_presentation:PresentingBrain`) that answers
    with what it was given: the presentation, then the old `batch.user_text`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def reply(self, batch: Batch) -> str | None:
        shown = present(batch, self.settings.tenant(batch.tenant), self.settings)
        return f"{shown.text}\nuser_text: {batch.user_text}"


async def test_a_custom_brain_gets_the_presentation_and_user_text_still_works(
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    graph: GraphApiStandIn,
) -> None:
    brain = "tests.delivery.test_presentation:PresentingBrain"
    await fleet.start(1, **{**env, "BRAIN": brain, "TIMEZONE": ZONE})
    order = like_fixture("order.json", "wamid.c1")
    await post_webhook(receiver_url, inbound(TENANT, PERSON, order))
    (reply,) = await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=15)
    shown, user_text = (reply.body or "").split("\nuser_text: ")
    header, body = shown.split("\n\n")
    assert header.startswith("Date and time: ") and header.endswith(f"({ZONE})\nFrom: Ana")
    assert "- product pizza-muzza-grande: quantity 2, 12500 ARS each" in body.splitlines()
    assert user_text == "[order: 2 items]"
