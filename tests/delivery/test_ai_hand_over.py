"""The built-in `hand_over_to_human` tool: the person gets the tenant's hand-over text (else
`AI_HAND_OVER_TEXT`) once, the batch goes to review as `ai_hand_over` with the AI's reason, and
a worker SIGKILLed while the text is on its way leaves a batch the next worker parks without
sending the text again. Real `python -m worker` processes, the real SDK and httpx."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.keys import Keys
from tests.delivery.support import PLAIN_TENANT, TENANT, add_to_tenant, batch_hash
from tests.worker.support import (
    WorkerFleet,
    in_review,
    push_message,
    stats,
    wait_exit,
)
from worker.brains.tools import HAND_OVER_TOOL

pytestmark = pytest.mark.slow
TENANT_TEXT = "Te paso con una persona del equipo, ya te escribe."
GLOBAL_TEXT = "A person from our team will answer you here."
REASON = "pide hablar con una persona por un reclamo"
LEASE = {"LEASE_S": "1.5", "LEASE_RENEW_S": "0.3"}


def hand_over(tool_id: str = "toolu_h1") -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": "Entiendo."},
        {"type": "tool_use", "id": tool_id, "name": HAND_OVER_TOOL, "input": {"reason": REASON}},
    ]


def text_requests(graph: GraphApiStandIn, body: str) -> list[Any]:
    """Every send request of this text the Graph API received, answered or not."""
    return [
        r
        for r in graph.requests
        if isinstance(r.body, dict) and (r.body.get("text") or {}).get("body") == body
    ]


async def test_the_hand_over_sends_the_text_once_and_parks_the_batch_with_the_reason(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    own, plain = "5491155550301", "5491155550302"
    add_to_tenant(env, f'hand_over_text = "{TENANT_TEXT}"\n')
    ai.set_default_reply(lambda body: hand_over())
    await fleet.start(1, **{**env, "AI_HAND_OVER_TEXT": GLOBAL_TEXT})
    await push_message(redis, prefix, own, "wamid.h1", "quiero hablar con alguien")
    await push_message(
        redis, prefix, plain, "wamid.h2", "quiero hablar con alguien", tenant=PLAIN_TENANT
    )

    both = await in_review(redis, prefix, TENANT, PLAIN_TENANT, count=2, what="both batches")
    items = {item["person"]: item for item in both}
    assert [m.body for m in graph.sent_texts(own)] == [TENANT_TEXT], "not the preamble either"
    assert [m.body for m in graph.sent_texts(plain)] == [GLOBAL_TEXT]
    for person, item in items.items():
        (sent,) = graph.sent_texts(person)
        assert item["reason"] == "ai_hand_over"
        assert item["error"] == REASON, "the AI's reason is the item's detail"
        assert item["hand_over_steps"] == {"hand_over_text": "done"}
        assert item["parts_sent"] == {"0": sent.wamid}, "the text's part is recorded"
        tenant = TENANT if person == own else PLAIN_TENANT
        assert await redis.llen(Keys(prefix).tenant(tenant).memory(person)) == 0
    assert len(ai.bodies()) == 2, "the model is not asked again after the hand-over"
    assert (await stats(redis, prefix)).get("review:ai_hand_over") == 1


async def test_a_worker_killed_while_sending_the_hand_over_text_never_sends_it_twice(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550303"
    ai.queue_reply(hand_over())
    # The text's request waits in the stand-in: the worker dies before Meta's answer, so
    # nothing but the journal says whether the person has it (the stand-in does send it).
    graph.set_latency(3.0)
    (victim,) = await fleet.start(1, **{**env, **LEASE, "AI_HAND_OVER_TEXT": GLOBAL_TEXT})
    await push_message(redis, prefix, person, "wamid.h3", "quiero hablar con alguien")

    await graph.await_for(lambda: text_requests(graph, GLOBAL_TEXT), timeout=15)
    journal = (await batch_hash(redis, prefix, person))["handoff"]
    assert '"hand_over_text":"sending"' in journal, "journaled before the request went out"
    victim.send_signal(signal.SIGKILL)
    await wait_exit(victim, 5)
    graph.set_latency(0)

    await fleet.start(1, **{**env, **LEASE, "AI_HAND_OVER_TEXT": GLOBAL_TEXT})

    (item,) = await in_review(redis, prefix, what="the resumed batch in review", timeout_s=20)
    assert len(text_requests(graph, GLOBAL_TEXT)) == 1, "the text went out once, never again"
    assert item["reason"] == "ai_hand_over" and item["error"] == REASON
    assert item["hand_over_steps"]["hand_over_text"].startswith("unknown:")
    assert len(ai.bodies()) == 1, "the resumed turn does not ask the AI again"
    counts = await stats(redis, prefix)
    assert counts["leases_expired"] == 1 and counts["unknown:hand_over_text"] == 1
