"""A Chatwoot reply is sent once across a crash: a worker process killed (SIGKILL) while the
second part of a reply is in flight leaves the first part recorded; after its lease another
worker process sends only the second. Real `python -m worker` processes, the real httpx."""

from __future__ import annotations

import signal

import pytest
from redis.asyncio import Redis

from scripts.standins import ChatwootApiStandIn, ChatwootFault
from shared.keys import Keys
from tests.chatwoot.brains import parts_of
from tests.chatwoot.test_delivery import ended, post_message
from tests.delivery.support import hash_of
from tests.worker.support import WorkerFleet, review_items, wait_exit, wait_for

pytestmark = pytest.mark.slow
LEASE = {"LEASE_S": "1.5", "LEASE_RENEW_S": "0.3", "BRAIN": "tests.chatwoot.brains:TwoPartBrain"}


async def test_after_a_crash_only_the_parts_chatwoot_did_not_accept_are_sent(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    # The second reply call waits, then fails: Chatwoot never creates it.
    chatwoot.add_fault(ChatwootFault(status=503, delay=30, count=1, after=1, kinds={"reply"}))
    (victim,) = await fleet.start(1, **{**env, **LEASE})
    await post_message(receiver_url, 1101, "contame todo")

    await chatwoot.await_for(lambda: any(r.fault for r in chatwoot.calls("reply")), timeout=10)
    victim.send_signal(signal.SIGKILL)
    await wait_exit(victim, 5)
    first, second = parts_of("contame todo")
    assert [m.content for m in chatwoot.replies()] == [first]
    batch = await hash_of(redis, Keys(prefix).tenant("cw-1-3").batch("42"))
    assert "part:0" in batch and "part:1" not in batch

    await fleet.start(1, **{**env, **LEASE})
    counts = await ended(redis, prefix)
    assert [m.content for m in chatwoot.replies()] == [first, second], "each part once"
    assert counts["leases_expired"] == 1 and counts["parts_out"] == 2
    assert await review_items(redis, prefix, "cw-1-3") == []

    async def quiet() -> bool:
        return chatwoot.pending_webhooks == 0

    await wait_for(quiet, "the stand-in's webhooks delivered")
