"""Human takeover across the processes: an echo of what the business wrote from the WhatsApp
Business app, POSTed to the real receiver, silences the bot for that person (real `python -m
worker` processes, the real brain and sender against the stand-ins) until `python -m
worker.takeover resume` lifts the pause; then the bot answers what waited, with the human's
words in the memory it shows the AI, marked as a person's. And the AI's hand-over pauses the
person: their next message waits for the human instead of reaching the AI."""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import time

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from scripts.webhooks import text_message
from shared.conversation.presentation import HUMAN_REPLY_NOTE, NO_NEW_MESSAGE
from shared.keys import Keys
from shared.ops import takeover
from tests.delivery.support import TENANT, inbound, post_webhook, said
from tests.support.helpers import fixture_json
from tests.worker.support import (
    WorkerFleet,
    in_review,
    push_message,
    run_module,
    wait_for,
)
from worker.brains.tools import HAND_OVER_TOOL

pytestmark = pytest.mark.slow
QUIET_S = 1.5  # how long "nothing happens" is watched: six debounce windows of the workers


def echo(person: str, wamid: str, text: str) -> bytes:
    """Meta's `smb_message_echoes` body (the fixture's shape) for TENANT, `to` with its "+"."""
    doc = copy.deepcopy(fixture_json("whatsapp/echo_text.json"))
    change = doc["entry"][0]["changes"][0]
    change["value"]["metadata"]["phone_number_id"] = TENANT
    (item,) = change["value"]["message_echoes"]
    item.update(to=f"+{person}", id=wamid, timestamp=str(int(time.time())), text={"body": text})
    return orjson.dumps(doc)


def takeover_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_module("worker.takeover", *args, env={**os.environ, **env})


async def test_an_echo_silences_the_bot_for_the_person_until_resumed(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person, other = "5491155550401", "5491155550402"
    await fleet.start(1, **env)
    owner = "Hola, soy Marta de la tienda: ¿te llegó el pedido?"
    await post_webhook(receiver_url, echo(person, "wamid.ECHO.t1", owner))
    await post_webhook(receiver_url, echo(person, "wamid.ECHO.t1", owner))  # Meta retries
    await post_webhook(
        receiver_url, inbound(TENANT, person, text_message("wamid.t1", "no, todavía no", person))
    )
    await post_webhook(
        receiver_url, inbound(TENANT, other, text_message("wamid.t2", "hola", other))
    )

    await wait_for(lambda: asyncio.sleep(0, graph.sent_texts(other)), "the other person answered")
    await asyncio.sleep(QUIET_S)
    assert graph.sent_texts(person) == [], "the bot says nothing to a paused person"
    assert len(ai.bodies()) == 1, "and does not even ask the AI"
    k = Keys(prefix).tenant(TENANT)
    assert await redis.llen(k.pending(person)) == 1, "her message waits for the human"
    pause = await takeover.pause_state(redis, Keys(prefix), TENANT, person)
    assert pause is not None and pause["by"] == "business_app"

    resumed = takeover_cli(env, "resume", "--tenant", TENANT, "--person", person, "--by", "ops")
    assert resumed.returncode == 0, resumed.stderr
    (reply,) = await wait_for(lambda: asyncio.sleep(0, graph.sent_texts(person)), "the answer")
    assert reply.body == "stand-in reply to: no, todavía no"
    last = ai.bodies()[-1]["messages"]
    assert said(last) == [
        ("user", NO_NEW_MESSAGE),
        ("assistant", f"{HUMAN_REPLY_NOTE}\n{owner}"),
        ("user", "no, todavía no"),
    ], "the AI sees what the human wrote, marked as a person's"
    again = takeover_cli(env, "resume", "--tenant", TENANT, "--person", person)
    assert again.returncode == 1 and "was not paused" in again.stderr


async def test_the_ai_hand_over_pauses_the_person_and_their_next_message_waits(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550403"
    ai.queue_reply(
        [{"type": "tool_use", "id": "toolu_t1", "name": HAND_OVER_TOOL, "input": {"reason": "x"}}]
    )
    await fleet.start(
        1, **{**env, "AI_HAND_OVER_TEXT": "Te escribe una persona.", "HUMAN_PAUSE_S": "30"}
    )
    await push_message(redis, prefix, person, "wamid.h1", "quiero hablar con alguien")

    (item,) = await in_review(redis, prefix, what="the hand-over in review")
    assert item["reason"] == "ai_hand_over" and item["human_pause_ms"] == 30_000
    assert item["hand_over"].startswith("bot paused for this person for 30 s")
    pause = await takeover.pause_state(redis, Keys(prefix), TENANT, person)
    assert pause is not None and pause["by"] == "review:ai_hand_over"

    await push_message(redis, prefix, person, "wamid.h2", "¿hola?")
    await asyncio.sleep(QUIET_S)
    assert [m.body for m in graph.sent_texts(person)] == ["Te escribe una persona."]
    assert len(ai.bodies()) == 1, "the next message is not answered by the AI"
    assert await redis.llen(Keys(prefix).tenant(TENANT).pending(person)) == 1
