"""One burst, one AI turn, one reply: the real receiver takes the webhooks in, an in-process
worker asks the Messages API stand-in through the anthropic SDK and answers through the Graph
API stand-in with httpx. Then memory: later turns carry the earlier exchanges."""

from __future__ import annotations

import gc
import logging
import time
import warnings

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn, last_user_block
from scripts.webhooks import text_message
from shared.keys import Keys
from tests.delivery.support import (
    DEFAULT_PROMPT,
    MODEL,
    PLAIN_TENANT,
    TENANT,
    TENANT_PROMPT,
    TENANT_TOKEN,
    TOKEN,
    InProcessWorkers,
    ai_requests,
    image,
    inbound,
    post_webhook,
    said,
)
from tests.worker.support import in_review, push_message, stats, wait_for

PERSON = "5491155550001"


@pytest.mark.cluster
async def test_a_burst_is_one_ai_request_and_one_reply_after_read_and_typing(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start()
    ai.queue_reply("¡Hola Ana! Sí, el sábado a la tarde tenemos turno a las 16.")
    # Two webhook POSTs within the debounce window, one of them with an image and a caption.
    await post_webhook(
        receiver_url,
        inbound(
            TENANT,
            PERSON,
            text_message("wamid.t1", "hola", PERSON),
            text_message("wamid.t2", "una consulta", PERSON),
            image("wamid.t3", "así está la canilla", PERSON),
        ),
    )
    await post_webhook(
        receiver_url,
        inbound(TENANT, PERSON, text_message("wamid.t4", "¿tienen turno el sábado?", PERSON)),
    )

    (reply,) = await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=10)
    (request,) = ai_requests(ai)
    body = request.body
    assert body["model"] == MODEL
    # A prompt this short cannot be cached (under 1 024 tokens): no cache mark.
    assert body["system"] == [{"type": "text", "text": TENANT_PROMPT}]
    assert [m["role"] for m in body["messages"]] == ["user"]
    # The header, the burst's messages, then what became of its media, once: this image was
    # never registered at the Graph API stand-in, so the AI is told it could not be
    # downloaded, with its caption, and what to do.
    texts = [b["text"] for b in body["messages"][0]["content"] if b["type"] == "text"]
    assert texts[1].splitlines() == ["hola", "una consulta", "¿tienen turno el sábado?"]
    assert texts[2:] == [
        '[the customer sent an image ("así está la canilla") that could not be downloaded;'
        " ask them to send it again or to describe it]"
    ]

    assert reply.body == "¡Hola Ana! Sí, el sábado a la tarde tenemos turno a las 16."
    assert reply.to == PERSON and reply.phone_number_id == TENANT
    (receipt,) = graph.read_receipts()
    assert receipt.message_id == "wamid.t4", "the burst's last message is marked read"
    assert receipt.typing_indicator == "text"
    assert receipt.phone_number_id == TENANT
    assert receipt.time < request.time < reply.time, "read + typing, then the AI, then the reply"
    graph_calls = [r for r in graph.requests if r.path.endswith("/messages")]
    assert {r.headers["authorization"] for r in graph_calls} == {f"Bearer {TENANT_TOKEN}"}

    # One turn, no second AI call or reply for the same burst.
    async def turn_ended() -> dict[str, int] | None:
        counts = await stats(redis, prefix)
        return counts if counts.get("turns") == 1 else None

    counts = await wait_for(turn_ended, "the turn finished")
    assert counts["messages"] == 4 and counts["parts_out"] == 1
    assert len(ai_requests(ai)) == 1 and len(graph.sent_messages()) == 1


async def test_a_tenant_without_overrides_uses_the_global_prompt_and_token(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start()
    await push_message(redis, prefix, PERSON, "wamid.p1", "hola", tenant=PLAIN_TENANT)

    (reply,) = await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=10)
    (request,) = ai_requests(ai)
    assert request.body["system"][0]["text"] == DEFAULT_PROMPT
    assert reply.phone_number_id == PLAIN_TENANT
    assert reply.body == "stand-in reply to: hola"
    assert {r.headers["authorization"] for r in graph.requests} == {f"Bearer {TOKEN}"}


async def test_a_batch_too_old_for_a_reply_gets_no_read_typing_ai_or_send(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="worker.turn.turn")
    await workers.start(REVIEW_AFTER_S=600)
    late, fresh = "5491155550002", "5491155550003"
    await push_message(redis, prefix, late, "wamid.old", "hola", ts=int(time.time()) - 3600)
    await push_message(redis, prefix, fresh, "wamid.new", "hola")

    (item,) = await in_review(redis, prefix, what="the old batch in review")
    assert item["person"] == late and item["reason"] == "too_old"
    await graph.await_for(lambda: graph.sent_texts(to=fresh), timeout=10)
    assert [r.message_id for r in graph.read_receipts()] == ["wamid.new"]
    assert graph.sent_texts(to=late) == []
    assert [last_user_block(r.body) for r in ai_requests(ai)] == ["hola"]  # only the fresh one
    # An operator reading the logs at INFO learns of it too, as of every other review.
    (line,) = [r for r in caplog.records if "reason=too_old" in r.getMessage()]
    assert line.levelno == logging.INFO and getattr(line, "outcome", None) == "review"


async def test_memory_carries_earlier_exchanges_capped_and_expiring(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start(MEMORY_TURNS=2, MEMORY_TTL_S=30)
    ai.queue_reply("R1", "R2", "R3", "R4")
    bursts = [["hola", "una consulta"], ["quiero turno"], ["el sábado"], ["gracias"]]
    for n, burst in enumerate(bursts, start=1):
        for i, line in enumerate(burst):
            await push_message(redis, prefix, PERSON, f"wamid.m{n}.{i}", line)
        await graph.await_for(lambda n=n: len(graph.sent_texts(to=PERSON)) == n, timeout=10)

    requests = [said(r.body["messages"]) for r in ai_requests(ai)]
    assert len(requests) == 4
    assert requests[0] == [("user", "hola\nuna consulta")]
    assert requests[1] == [
        ("user", "hola\nuna consulta"),
        ("assistant", "R1"),
        ("user", "quiero turno"),
    ]
    # MEMORY_TURNS=2: the fourth turn sees the second and third exchanges, not the first.
    assert requests[3] == [
        ("user", "quiero turno"),
        ("assistant", "R2"),
        ("user", "el sábado"),
        ("assistant", "R3"),
        ("user", "gracias"),
    ]
    assert [m.body for m in graph.sent_texts(to=PERSON)] == ["R1", "R2", "R3", "R4"]

    memory = Keys(prefix).tenant(TENANT).memory(PERSON)

    async def remembered() -> bool:
        return await redis.llen(memory) == 2 and b"R4" in (await redis.lindex(memory, -1) or b"")

    await wait_for(remembered, "the last exchange remembered")
    assert 0 < await redis.pttl(memory) <= 30_000, "memory expires MEMORY_TTL_S after the last turn"


async def test_a_stopped_worker_closes_the_connections_of_its_brain_and_sender(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    worker = await workers.start()
    await push_message(redis, prefix, PERSON, "wamid.c1", "hola")
    await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=10)
    await workers.stop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del worker
        gc.collect()
    unclosed = [str(w.message) for w in caught if "unclosed" in str(w.message)]
    assert unclosed == [], "the SDK's and httpx's pooled connections are closed at shutdown"
