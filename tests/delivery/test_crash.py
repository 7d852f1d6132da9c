"""A reply is sent once: a worker process killed (SIGKILL) between parts leaves the stored reply
and the accepted parts on the batch; after its lease another worker sends only the rest, and
never asks the AI again. Real `python -m worker` processes, the real SDK and httpx."""

from __future__ import annotations

import signal

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, GraphFault, MessagesApiStandIn
from tests.delivery.support import ai_requests, batch_hash
from tests.worker.support import WorkerFleet, push_message, review_items, stats, wait_exit, wait_for

pytestmark = pytest.mark.slow
PERSON = "5491155550021"
LEASE = {"LEASE_S": "1.5", "LEASE_RENEW_S": "0.3"}


async def test_parts_after_a_crash_are_sent_once_and_the_ai_is_not_asked_again(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    parts = [" ".join(f"Parte {p}, frase {i}." for i in range(200)) for p in (1, 2, 3)]
    assert all(3000 < len(p) <= 4096 for p in parts)
    ai.queue_reply("\n\n".join(parts))
    # Every Graph request waits a while: enough to see part 1 recorded and to add the fault
    # below while part 2 still waits, even on a loaded machine (the fault is looked up after
    # the latency).
    graph.set_latency(2.0)
    (victim,) = await fleet.start(1, **{**env, **LEASE})
    await push_message(redis, prefix, PERSON, "wamid.c1", "contame todo")

    async def part_one_recorded() -> bool:
        return "part:0" in await batch_hash(redis, prefix, PERSON)

    await wait_for(part_one_recorded, "part 1 recorded on the batch", timeout_s=20, every_s=0.01)
    # Part 2 is now waiting in the stand-in: make it fail, so Meta never accepts it, and kill
    # the worker while it waits for the answer.
    graph.add_fault(GraphFault(code=131000, delay=30, count=1))
    await graph.await_for(lambda: any(r.fault for r in graph.requests), timeout=10)
    victim.send_signal(signal.SIGKILL)
    await wait_exit(victim, 5)
    graph.set_latency(0)
    assert [m.body for m in graph.sent_texts(PERSON)] == [parts[0]]
    stored = await batch_hash(redis, prefix, PERSON)
    assert stored["reply"] == "\n\n".join(parts) and set(stored) >= {"part:0"}
    assert "part:1" not in stored

    await fleet.start(1, **{**env, **LEASE})

    async def finished() -> bool:
        return (await stats(redis, prefix)).get("turns") == 1

    await wait_for(finished, "the resumed turn finished", timeout_s=10)
    assert [m.body for m in graph.sent_texts(PERSON)] == parts, "parts 2 and 3 once, 1 never again"
    assert len(ai_requests(ai)) == 1, "the stored reply is sent; the AI is not asked again"
    assert len(graph.read_receipts()) == 1
    counts = await stats(redis, prefix)
    assert counts["leases_expired"] == 1 and counts["parts_out"] == 3
    assert await review_items(redis, prefix) == []
