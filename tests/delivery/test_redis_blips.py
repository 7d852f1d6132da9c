"""A reply is sent once even when Redis stalls right after the send.

The last part of a reply is recorded by the finish script. When Redis does not answer that
call (stalled, restarting), the worker must keep trying while its turn still holds the lease;
giving up at the first error leaves the batch to be resumed after the lease, and the resumed
turn re-sends the part the provider already accepted. Found by the chaos suite (scenarios
redis_stall and redis_restart). Real `python -m worker` process, real SDK and httpx.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from tests.worker.support import WorkerFleet, push_message, stats, wait_for

pytestmark = pytest.mark.slow
PERSON = "5491155550031"


def text_send_arrived(graph: GraphApiStandIn) -> bool:
    return any(isinstance(r.body, dict) and r.body.get("type") == "text" for r in graph.requests)


async def test_a_finish_during_a_redis_stall_is_retried_and_nothing_is_sent_twice(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    # The send waits 1 s in the stand-in: time to stall Redis before its answer comes back, even
    # on a loaded machine, so the finish that records it meets a Redis that does not answer
    # for the rest of the 2.5 s pause (three times the worker's Redis timeout or more, well
    # within its lease).
    graph.set_latency(1.0)
    overrides = {"REDIS_TIMEOUT_S": "0.5", "LEASE_S": "4", "LEASE_RENEW_S": "0.5"}
    await fleet.start(1, **{**env, **overrides})
    await push_message(redis, prefix, PERSON, "wamid.blip1", "hola")
    await graph.await_for(lambda: text_send_arrived(graph), timeout=10)
    await redis.execute_command("CLIENT", "PAUSE", "2500", "ALL")

    async def finished() -> bool:
        return (await stats(redis, prefix)).get("turns") == 1

    await wait_for(finished, "the turn finished", timeout_s=15)
    assert len(graph.sent_texts(PERSON)) == 1, "the reply was sent again after the stall"
    counts = await stats(redis, prefix)
    assert counts.get("leases_expired", 0) == 0, "the turn was abandoned and resumed"
    assert counts["parts_out"] == 1
