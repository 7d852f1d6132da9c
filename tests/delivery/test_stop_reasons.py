"""The built-in brain reads every answer's stop_reason: a cut answer is asked again with a
larger limit, and if still cut ends at its last complete sentence (or goes to review when none
is); a refusal sends nothing and goes to review; an empty answer gets the tenant's fallback
text or goes to review; a paused turn is continued. The memory holds what was sent. Real
`python -m worker` processes (`BRAIN=anthropic`), the real SDK against the stand-ins."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn, last_user_text
from shared.keys import Keys
from tests.delivery.support import PLAIN_TENANT, TENANT, add_to_tenant, ai_requests
from tests.worker.support import WorkerFleet, push_message, review_items, stats, wait_for

pytestmark = pytest.mark.slow
FALLBACK = "Perdón, no entendí. ¿Podés repetirlo?"
# 5 sentences of 40 bytes: 200 bytes, 50 tokens at the stand-in's four bytes a token.
LONG = " ".join(f"Frase número {i} de la respuesta larga." for i in range(5))


async def remembered(
    redis: Redis, prefix: str, person: str, tenant: str = TENANT
) -> list[dict[str, Any]]:
    """What the person's memory keeps said: each exchange's user text and answer (its header,
    message ids and part ids: tests/delivery/test_presentation.py)."""
    raw = await redis.lrange(Keys(prefix).tenant(tenant).memory(person), 0, -1)
    return [{k: v for k, v in orjson.loads(r).items() if k in ("user", "assistant")} for r in raw]


async def turns_ended(redis: Redis, prefix: str, count: int, tenant: str = TENANT) -> None:
    async def ended() -> bool:
        counts = await stats(redis, prefix, tenant)
        return (
            counts.get("turns", 0) + sum(n for k, n in counts.items() if k.startswith("review:"))
            >= count
        )

    await wait_for(ended, f"{count} turn(s) ended", timeout_s=20)


async def test_a_cut_answer_is_asked_again_with_a_larger_limit_and_sent_whole(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550101"
    ai.configure(cut_at_max_tokens=True)
    ai.set_default_reply(LONG)
    # 20 tokens cut it (80 bytes), 40 too, 80 do not: asked three times.
    await fleet.start(1, **{**env, "AI_MAX_TOKENS": "20"})
    await push_message(redis, prefix, person, "wamid.s1", "contame todo")

    sent = await graph.await_for(lambda: graph.sent_texts(person), timeout=15)
    await turns_ended(redis, prefix, 1)
    assert [m.body for m in sent] == [LONG], "the whole answer, once"
    assert [b["max_tokens"] for b in ai.bodies()] == [20, 40, 80]
    assert [r.response["stop_reason"] for r in ai_requests(ai)] == [
        "max_tokens",
        "max_tokens",
        "end_turn",
    ]
    assert await remembered(redis, prefix, person) == [{"user": "contame todo", "assistant": LONG}]


async def test_still_cut_after_the_bound_it_ends_at_its_last_complete_sentence(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    whole, no_sentence = "5491155550102", "5491155550103"

    def reply(body: dict[str, Any]) -> str:
        # For the second person, an answer whose first sentence never ends within the limit.
        return "palabra " * 100 if "sin fin" in last_user_text(body) else LONG

    ai.configure(cut_at_max_tokens=True)
    ai.set_default_reply(reply)
    # 5 tokens, 10, then 20 (80 bytes): still cut, two sentences of 38 bytes into the answer.
    await fleet.start(1, **{**env, "AI_MAX_TOKENS": "5"})
    await push_message(redis, prefix, whole, "wamid.s2", "contame todo")
    await push_message(redis, prefix, no_sentence, "wamid.s3", "sin fin")

    await turns_ended(redis, prefix, 2)
    expected = "Frase número 0 de la respuesta larga. Frase número 1 de la respuesta larga."
    assert LONG.encode()[:80].decode() == expected + " Fr", "what the stand-in's cut leaves"
    assert [m.body for m in graph.sent_texts(whole)] == [expected], "never a cut sentence"
    assert await remembered(redis, prefix, whole) == [
        {"user": "contame todo", "assistant": expected}
    ], "the memory holds what was sent"
    assert graph.sent_texts(no_sentence) == [], "nothing complete: nothing sent"
    (item,) = await review_items(redis, prefix)
    assert item["person"] == no_sentence and item["reason"] == "max_tokens"
    assert await remembered(redis, prefix, no_sentence) == []
    log = fleet.logs[0].read_text()
    assert "sending it up to its last complete sentence" in log
    assert len(ai.bodies()) == 6, "each asked three times: once, then twice more"


async def test_a_refusal_sends_nothing_and_goes_to_review(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550104"
    # The partial text a refusal may carry is never sent.
    ai.queue_reply(
        {"content": [{"type": "text", "text": "Claro, te explico cómo"}], "stop_reason": "refusal"}
    )
    await fleet.start(1, **env)
    await push_message(redis, prefix, person, "wamid.s4", "algo que no corresponde")

    await turns_ended(redis, prefix, 1)
    (item,) = await review_items(redis, prefix)
    assert item["reason"] == "refusal" and item["person"] == person
    assert graph.sent_texts(person) == [], "the Graph API got nothing"
    assert len(graph.read_receipts()) == 1  # the typing indicator was shown, then review
    assert len(ai.bodies()) == 1, "a refusal is not asked again"
    assert await remembered(redis, prefix, person) == []


async def test_an_empty_answer_gets_the_tenants_fallback_text_or_goes_to_review(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    with_fallback, without = "5491155550105", "5491155550106"
    add_to_tenant(env, f'fallback_text = "{FALLBACK}"\n')
    ai.set_default_reply({"content": []})  # end_turn with no text at all
    await fleet.start(1, **env)  # AI_FALLBACK_TEXT unset: the plain tenant has none
    await push_message(redis, prefix, with_fallback, "wamid.s5", "hola")
    await push_message(redis, prefix, without, "wamid.s6", "hola", tenant=PLAIN_TENANT)

    await turns_ended(redis, prefix, 1)
    await turns_ended(redis, prefix, 1, PLAIN_TENANT)
    assert [m.body for m in graph.sent_texts(with_fallback)] == [FALLBACK]
    assert await remembered(redis, prefix, with_fallback) == [
        {"user": "hola", "assistant": FALLBACK}
    ]
    assert graph.sent_texts(without) == [], "never silence: review instead"
    (item,) = await review_items(redis, prefix, PLAIN_TENANT)
    assert item["reason"] == "empty_answer" and item["person"] == without
    assert await review_items(redis, prefix) == []


async def test_the_global_fallback_text_serves_a_tenant_without_its_own(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550107"
    # Only whitespace: as empty as no text.
    ai.set_default_reply({"content": [{"type": "text", "text": " \n "}]})
    await fleet.start(1, **{**env, "AI_FALLBACK_TEXT": FALLBACK})
    await push_message(redis, prefix, person, "wamid.s7", "hola", tenant=PLAIN_TENANT)

    sent = await graph.await_for(lambda: graph.sent_texts(person), timeout=15)
    assert [m.body for m in sent] == [FALLBACK]
    assert await review_items(redis, prefix, PLAIN_TENANT) == []


async def test_a_paused_turn_is_continued_with_its_content_sent_back_as_is(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550108"
    paused = [
        {"type": "text", "text": "Busco el horario."},
        {
            "type": "server_tool_use",
            "id": "srvtoolu_01",
            "name": "web_search",
            "input": {"query": "horario sábado"},
        },
    ]
    ai.queue_reply({"content": paused, "stop_reason": "pause_turn"}, "El sábado abrimos a las 9.")
    await fleet.start(1, **env)
    await push_message(redis, prefix, person, "wamid.s8", "¿a qué hora abren el sábado?")

    await turns_ended(redis, prefix, 1)
    assert [m.body for m in graph.sent_texts(person)] == ["El sábado abrimos a las 9."]
    first, second = ai.bodies()
    assert second["messages"][:-1] == first["messages"]
    assert second["messages"][-1] == {"role": "assistant", "content": paused}
    assert await remembered(redis, prefix, person) == [
        {"user": "¿a qué hora abren el sábado?", "assistant": "El sábado abrimos a las 9."}
    ]
