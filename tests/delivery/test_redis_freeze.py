"""A Redis that freezes for longer than the renewal interval costs seconds, not a lease.

Redis is frozen with SIGSTOP (a stalled host, a long fork): it answers nothing, its clock runs
on, and when it continues it runs every command its clients sent meanwhile, those they gave up
on included. A turn that was running keeps its lease (far longer than the freeze), retrying
its writes, and goes on at once: the reply goes out once, the batch is finished within seconds.
A batch that became due during the freeze was locked, on the old code, by a claim the worker
had given up on (it timed out) but Redis ran when it thawed: no turn held that token, so the
batch waited out the whole lease (answered 12.1 s after the freeze here, LEASE_S). Now such a
claim claims nothing, and what one locked before its answer time is handed back
(tests/worker/test_unanswered_claims.py). Real `python -m worker` process, real SDK and httpx.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer
from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.fleet.turn_figures import AI_CALL, SEND
from shared.keys import Keys
from tests.delivery.support import TENANT
from tests.support.answer_dropping_proxy import AnswerDroppingProxy
from tests.worker.support import WorkerFleet, push_message, stats, wait_for

pytestmark = pytest.mark.slow
PERSON = "5491155550041"
# Leases scaled down from the defaults (120 s, renewed every 30 s): a freeze longer than four
# renewal intervals, two thirds of the lease.
LEASE_S = 12.0
FREEZE_S = 8.0
SHORT = {"LEASE_S": str(LEASE_S), "LEASE_RENEW_S": "2", "REDIS_TIMEOUT_S": "1"}
# "Within seconds" of Redis answering again, with room for a loaded machine; the old code
# waited out the lease (LEASE_S after the claim, past the freeze).
BACK_WITHIN_S = LEASE_S / 2


@contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """The Redis server stopped by SIGSTOP for the block; always continued after it."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def text_send_arrived(graph: GraphApiStandIn) -> bool:
    return any(isinstance(r.body, dict) and r.body.get("type") == "text" for r in graph.requests)


async def finished_after(redis: Redis, prefix: str, since: float) -> float:
    """Seconds from `since` until the turn was counted finished."""

    async def finished() -> bool:
        return (await stats(redis, prefix)).get("turns") == 1

    await wait_for(finished, "the turn finished", timeout_s=LEASE_S * 3)
    return time.monotonic() - since


async def test_a_freeze_during_the_ai_call_costs_seconds_not_the_lease(
    redis: Redis,
    redis_server: RedisServer,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    ai.set_latency(2.0)  # the AI answers while Redis is still frozen
    await fleet.start(1, **{**env, **SHORT})
    await push_message(redis, prefix, PERSON, "wamid.freeze1", "hola")
    await ai.await_for(lambda: ai.requests, timeout=10)
    with frozen(redis_server):
        await asyncio.sleep(FREEZE_S)
    thawed = time.monotonic()
    took = await finished_after(redis, prefix, thawed)
    print(f"freeze during the AI call: finished {took:.2f}s after Redis answered again")
    assert took < BACK_WITHIN_S, f"finished {took:.1f}s after the freeze ended"
    assert len(graph.sent_texts(PERSON)) == 1
    counts = await stats(redis, prefix)
    assert counts.get("leases_expired", 0) == 0, "the turn was abandoned and resumed"


async def test_a_freeze_at_the_finish_costs_seconds_not_the_lease(
    redis: Redis,
    redis_server: RedisServer,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    # The send waits in the stand-in: Redis freezes before its answer comes back, so the
    # finish that records it meets a frozen Redis.
    graph.set_latency(1.0)
    await fleet.start(1, **{**env, **SHORT})
    await push_message(redis, prefix, PERSON, "wamid.freeze2", "hola")
    await graph.await_for(lambda: text_send_arrived(graph), timeout=10)
    with frozen(redis_server):
        await asyncio.sleep(FREEZE_S)
    thawed = time.monotonic()
    took = await finished_after(redis, prefix, thawed)
    print(f"freeze at the finish: finished {took:.2f}s after Redis answered again")
    assert took < BACK_WITHIN_S, f"finished {took:.1f}s after the freeze ended"
    assert len(graph.sent_texts(PERSON)) == 1, "the reply was sent again after the freeze"
    counts = await stats(redis, prefix)
    assert counts.get("leases_expired", 0) == 0, "the turn was abandoned and resumed"
    # The finish's first try ran when Redis continued, its answer lost: the later try finds
    # the lock released by it, and the turn's figures are not added a second time.
    assert (AI_CALL.count_of(counts), SEND.count_of(counts)) == (1, 1)


async def test_a_batch_due_during_the_freeze_is_answered_within_seconds(
    redis: Redis,
    redis_server: RedisServer,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    # The batch becomes due while Redis is frozen: the worker's claims time out, but Redis
    # runs them when it answers again. A claim whose answer never came must not leave the
    # batch locked by a token no turn holds until the lease ends.
    window_s = 2.0
    await fleet.start(1, **{**env, **SHORT, "DEBOUNCE_WINDOW_S": str(window_s)})
    await push_message(redis, prefix, PERSON, "wamid.freeze3", "hola")
    due_key = Keys(prefix).tenant(TENANT).due

    async def taken_in() -> bool:
        return await redis.zscore(due_key, PERSON) is not None

    await wait_for(taken_in, "the message taken in, its batch due later")
    with frozen(redis_server):
        await asyncio.sleep(FREEZE_S)
    thawed = time.monotonic()
    await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=LEASE_S * 3)
    took = time.monotonic() - thawed
    print(f"batch due during the freeze: answered {took:.2f}s after Redis answered again")
    assert took < BACK_WITHIN_S, f"answered {took:.1f}s after the freeze ended"
    assert len(graph.sent_texts(PERSON)) == 1
    counts = await stats(redis, prefix)
    assert counts.get("leases_expired", 0) == 0, "the batch waited out an unheld lease"


async def test_a_claim_whose_answer_was_lost_is_handed_back_within_seconds(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    # Redis runs the claim at once but its answer never reaches the worker (a network that
    # lost one direction): the batch is locked for a token no turn holds. The worker hands it
    # back once Redis's clock is past the claim's answer time; the old code left it locked for
    # the whole lease (a long one here: 24 s, the loss 3 s).
    lease_s, window_s, dropped_s = 24.0, 2.0, 3.0
    proxy = AnswerDroppingProxy(env["REDIS_URL"])
    url = await proxy.start()
    try:
        overrides = {"LEASE_S": str(lease_s), "DEBOUNCE_WINDOW_S": str(window_s)}
        await fleet.start(1, **{**env, **SHORT, **overrides, "REDIS_URL": url})
        await push_message(redis, prefix, PERSON, "wamid.lost1", "hola")
        k = Keys(prefix).tenant(TENANT)

        async def taken_in() -> bool:
            return await redis.zscore(k.due, PERSON) is not None

        await wait_for(taken_in, "the message taken in, its batch due later")
        proxy.drop()

        async def locked() -> bool:
            return bool(await redis.exists(k.lock(PERSON)))

        await wait_for(locked, "the batch claimed, the answer lost", timeout_s=window_s + 5)
        await asyncio.sleep(dropped_s)
        proxy.resume()
        resumed = time.monotonic()
        await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=lease_s * 2)
        took = time.monotonic() - resumed
        print(f"claim answer lost: answered {took:.2f}s after the answers came back")
        assert took < lease_s / 4, f"answered {took:.1f}s after the answers came back"
        assert len(graph.sent_texts(PERSON)) == 1
        counts = await stats(redis, prefix)
        assert counts.get("unclaimed") == 1 and counts.get("leases_expired", 0) == 0
    finally:
        await proxy.close()
