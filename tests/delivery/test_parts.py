"""A reply longer than WhatsApp's 4096 characters goes out as ordered parts, each recorded with
its wamid on the batch and in an outbound record that delivery statuses update later."""

from __future__ import annotations

from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from tests.delivery.support import InProcessWorkers, ai_requests, outbound
from tests.worker.support import push_message, stats, wait_for

PERSON = "5491155550011"


def long_reply() -> tuple[str, list[str]]:
    """Three paragraphs: short, short, and one longer than a part (cut at a sentence)."""
    paragraphs = [
        " ".join(f"Párrafo {p}, frase {i}: el turno del sábado es a las 16." for i in range(n))
        for p, n in [(1, 50), (2, 40), (3, 90)]
    ]
    return "\n\n".join(paragraphs), paragraphs


async def test_a_long_reply_is_sent_as_ordered_parts_cut_at_paragraphs_and_sentences(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    reply, paragraphs = long_reply()
    assert len(paragraphs[0]) + len(paragraphs[1]) > 4096 > len(paragraphs[0])
    assert 4096 < len(paragraphs[2]) < 2 * 4096
    ai.queue_reply(reply)
    await workers.start()
    await push_message(redis, prefix, PERSON, "wamid.long", "contame todo")

    sent = await graph.await_for(
        lambda: len(graph.sent_texts(PERSON)) >= 4 and graph.sent_texts(PERSON), timeout=10
    )
    bodies = [m.body or "" for m in sent]
    assert all(len(b) <= 4096 for b in bodies)
    assert bodies[0] == paragraphs[0] and bodies[1] == paragraphs[1]
    assert bodies[2].endswith("16.") and f"{bodies[2]} {bodies[3]}" == paragraphs[2]
    assert len(ai_requests(ai)) == 1

    async def turn_done() -> bool:
        return (await stats(redis, prefix)).get("turns") == 1

    await wait_for(turn_done, "the turn finished")
    assert len(graph.sent_texts(PERSON)) == 4
    for index, message in enumerate(sent):
        record = await outbound(redis, prefix, message.wamid)
        assert record["part"] == str(index) and record["person"] == PERSON
        assert record["status"] == "accepted"
    assert (await stats(redis, prefix))["parts_out"] == 4
