"""Chatwoot across a crash. A reply is sent once: a worker process killed (SIGKILL) while the
second part of a reply is in flight leaves the first part recorded; after its lease another
worker process sends only the second. A hand-over happens at most once: a worker killed after
the private note, or while posting it, leaves a journal on the batch, and the worker that
resumes it finishes that review without a second note. Real `python -m worker` processes,
the real httpx."""

from __future__ import annotations

import signal
import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import ChatwootApiStandIn, ChatwootFault
from shared.conversation.review_journal import JOURNAL_FIELD
from shared.keys import Keys
from tests.chatwoot.brains import parts_of
from tests.chatwoot.support import ended, post_message
from tests.delivery.support import hash_of
from tests.worker.support import WorkerFleet, in_review, review_items, stats, wait_exit, wait_for

pytestmark = pytest.mark.slow
LEASE = {"LEASE_S": "1.5", "LEASE_RENEW_S": "0.3", "BRAIN": "tests.chatwoot.brains:TwoPartBrain"}
TOO_OLD = {**LEASE, "BRAIN": "echo", "REVIEW_AFTER_S": "600"}


async def _kill_while(fleet: WorkerFleet, chatwoot: ChatwootApiStandIn, kind: str) -> None:
    """Until a `kind` call hangs at the stand-in, then SIGKILL the one worker holding it."""
    (victim,) = fleet.procs
    await chatwoot.await_for(lambda: any(r.fault for r in chatwoot.calls(kind)), timeout=10)
    victim.send_signal(signal.SIGKILL)
    await wait_exit(victim, 5)


async def _hand_over_killed_at(
    fleet: WorkerFleet,
    env: dict[str, str],
    chatwoot: ChatwootApiStandIn,
    receiver_url: str,
    kind: str,
    message_id: int,
) -> None:
    """A message too old to answer is handed over; the worker is killed while its `kind`
    call ("note" or "status") hangs at the stand-in."""
    chatwoot.hang_next(1, 30.0, kinds=[kind])
    await fleet.start(1, **{**env, **TOO_OLD})
    await post_message(receiver_url, message_id, "hola", created_at=time.time() - 3600)
    await _kill_while(fleet, chatwoot, kind)


async def _resumed_item(
    redis: Redis, prefix: str, env: dict[str, str], fleet: WorkerFleet
) -> dict[str, Any]:
    """A second worker resumes the batch: the review item it stores."""
    await fleet.start(1, **{**env, **TOO_OLD})
    (item,) = await in_review(redis, prefix, "cw-1-3", what="the review item")
    return item


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
    await fleet.start(1, **{**env, **LEASE})
    await post_message(receiver_url, 1101, "contame todo")

    await _kill_while(fleet, chatwoot, "reply")
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


async def test_a_worker_killed_after_the_note_does_not_hand_over_twice(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    """The note is posted, the worker dies while setting the status, before the finish. The
    worker that resumes the batch finds the note done in the batch's journal: it sets the
    status (idempotent) and stores the review item, with no second note."""
    await _hand_over_killed_at(fleet, env, chatwoot, receiver_url, "status", 1401)
    journal = orjson.loads(
        (await hash_of(redis, Keys(prefix).tenant("cw-1-3").batch("42")))[JOURNAL_FIELD]
    )
    assert journal["reason"] == "too_old" and journal["steps"] == {"note": "done"}

    item = await _resumed_item(redis, prefix, env, fleet)
    assert item["reason"] == "too_old" and item["hand_over"] == "done"
    assert item["hand_over_steps"] == {"note": "done", "status": "open"}
    assert len(chatwoot.notes(42)) == 1, "one note, whatever the crashes"
    assert chatwoot.status_of(42) == "open"
    counts = await stats(redis, prefix, "cw-1-3")
    assert counts["leases_expired"] == 1 and counts["review:too_old"] == 1
    assert not any(k.startswith("unknown:") for k in counts)


async def test_a_worker_killed_while_posting_the_note_leaves_it_unknown_not_repeated(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    """The worker dies with the note's request in flight: it may be in the conversation or
    not. The resumed hand-over posts no note, opens the conversation, and the item says the
    note's outcome is unknown (counted as unknown:note)."""
    await _hand_over_killed_at(fleet, env, chatwoot, receiver_url, "note", 1501)

    item = await _resumed_item(redis, prefix, env, fleet)
    assert item["reason"] == "too_old"
    assert item["hand_over"] == (
        "unknown: the worker posting it stopped before Chatwoot answered; status set to open"
    )
    assert len(chatwoot.calls("note")) == 1, "the note was not posted a second time"
    assert chatwoot.status_of(42) == "open"
    counts = await stats(redis, prefix, "cw-1-3")
    assert counts["leases_expired"] == 1 and counts["unknown:note"] == 1
