"""How the model is shown a reply a person of the business wrote by hand (an exchange with
`"by": "human"`, worker/manual_reply.py): marked as not its own in the request, the same bytes
every turn, and named as theirs when the customer quotes it. Pure functions: no Redis."""

from __future__ import annotations

from typing import Any

from shared.conversation.batch import Batch, Message
from shared.conversation.presentation import HUMAN_REPLY_NOTE, NO_NEW_MESSAGE, present
from shared.settings import Settings
from tests.worker.support import batch_of
from worker.brains.prompt import build_request

TENANT = "106500000000001"
BOT = {"header": "Date and time: a", "user": "hola", "assistant": "¿En qué le ayudo?"}
HUMAN_ANSWER = {
    "header": "Date and time: b",
    "user": "¿tienen turno?",
    "assistant": "Sí, el jueves a las 10.",
    "ids": ["wamid.IN2"],
    "out": ["wamid.OUT2"],
    "by": "human",
    "who": "ana",
}
HUMAN_ALONE = {**HUMAN_ANSWER, "user": "", "ids": [], "assistant": "¿Le sirve?"}


def batch(*messages: Message, history: list[dict[str, Any]]) -> Batch:
    return batch_of(list(messages), tenant=TENANT, claimed_ms=1_764_500_000_000, history=history)


def message(text: str, quoting: str = "") -> Message:
    raw: dict[str, Any] = {"id": "wamid.IN3", "type": "text", "text": {"body": text}}
    if quoting:
        raw["context"] = {"id": quoting}
    return Message(id="wamid.IN3", type="text", text=text, ts=1_764_500_000, raw=raw)


def test_a_reply_by_hand_is_shown_as_written_by_a_person_of_the_business() -> None:
    settings = Settings()
    shown = batch(message("gracias"), history=[BOT, HUMAN_ANSWER, HUMAN_ALONE])
    request = build_request(settings, settings.tenant(TENANT), shown, cache=False)
    texts = [[b["text"] for b in m["content"]] for m in request["messages"]]
    assert texts[:2] == [["Date and time: a", "hola"], ["¿En qué le ayudo?"]], "the bot's own"
    assert texts[2:6] == [
        ["Date and time: b", "¿tienen turno?"],
        [f"{HUMAN_REPLY_NOTE}\nSí, el jueves a las 10."],
        ["Date and time: b", NO_NEW_MESSAGE],  # nothing came before the second one
        [f"{HUMAN_REPLY_NOTE}\n¿Le sirve?"],
    ]
    again = build_request(settings, settings.tenant(TENANT), shown, cache=False)
    assert again["messages"][:6] == request["messages"][:6], "same bytes: the cache holds"


def test_a_quoted_reply_by_hand_is_named_as_the_persons() -> None:
    settings = Settings()
    quoting = batch(message("perfecto", quoting="wamid.OUT2"), history=[HUMAN_ANSWER])
    body = present(quoting, settings.tenant(TENANT), settings).body
    assert body == (
        '(replying to the message "Sí, el jueves a las 10." a person of the business wrote)\n'
        "perfecto"
    )
