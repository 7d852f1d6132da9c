"""Retries with backoff, review after max attempts or on request, too-old batches: processes."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from tests.worker.support import (
    TENANT,
    Records,
    WorkerFleet,
    in_review,
    outbox,
    push_message,
    stats,
    wait_for,
)

pytestmark = pytest.mark.slow


async def test_retry_backoff_then_review_after_max_attempts(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    # A 1 s base: gaps of 1, 2, 4 s, each with 0.9 s of room for a loaded machine, and still
    # apart from a backoff that does not double (1, 1, 1) or starts one step late (2, 4, 8).
    await fleet.start(1, RETRY_BASE_S="1", MAX_ATTEMPTS="4")
    doomed, flaky, human = "5491100000011", "5491100000012", "5491100000013"
    await push_message(redis, prefix, doomed, "wamid.doomed", "nunca !fail=99")
    await push_message(redis, prefix, flaky, "wamid.flaky", "a veces !fail=2")
    await push_message(redis, prefix, human, "wamid.human", "quiero hablar !review=asks_for_human")

    turns = await records.wait_turns(doomed, 4, outcome="error", timeout_s=30)

    reviewed = await in_review(redis, prefix, count=2, what="two review items")
    items = {str(i["person"]): i for i in reviewed}
    assert [t.start["attempt"] for t in turns] == [0, 1, 2, 3]
    assert len({t.batch for t in turns}) == 1, "a retry is the same batch"
    gaps = [
        nxt.start["ms"] - prev.last["ms"]
        for prev, nxt in itertools.pairwise(turns)
        if prev.last is not None
    ]
    for gap, expected in zip(gaps, [1000, 2000, 4000], strict=True):
        assert expected - 20 <= gap <= expected + 900, f"retry gaps {gaps}"

    item = items[doomed]
    assert item["reason"] == "max_attempts"
    assert item["error"] == "RuntimeError: boom on attempt 3"
    assert item["attempts"] == 4 and item["id"] == turns[0].batch and item["tenant"] == TENANT
    assert [m["id"] for m in item["messages"]] == ["wamid.doomed"]  # type: ignore[attr-defined]
    await asyncio.sleep(1.0)
    assert len(await records.turns(doomed)) == 4, "never tried again after review"

    # NeedsReview: to review at once, one brain call, its reason and detail kept.
    (asked,) = await records.turns(human)
    assert asked.outcome == "review"
    assert items[human]["reason"] == "asks_for_human"
    assert items[human]["error"] == "the brain wants a human"
    assert items[human]["attempts"] == 0

    # A batch that fails twice and then succeeds is answered once, as the same batch.
    flaky_turns = await records.wait_turns(flaky, 1, timeout_s=30)
    assert [t.outcome for t in flaky_turns] == ["error", "error", "end"]
    assert [t.start["attempt"] for t in flaky_turns] == [0, 1, 2]
    assert len({t.batch for t in flaky_turns}) == 1
    # The brain's "end" record comes before the sender's reply: wait for the reply itself.
    replies = await wait_for(lambda: outbox(redis, prefix), "the flaky person's reply")
    assert [r["person"] for r in replies] == [flaky]
    counts = await stats(redis, prefix)
    assert counts["retries"] == 3 + 2
    assert counts["review:max_attempts"] == 1 and counts["review:asks_for_human"] == 1
    k = Keys(prefix).tenant(TENANT)
    for person in (doomed, flaky, human):
        assert not await redis.exists(k.batch(person), k.lock(person))


async def test_too_old_batches_go_to_review_without_calling_the_brain(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(1, REVIEW_AFTER_S="60")
    old, fresh = "5491100000014", "5491100000015"
    an_hour_ago = int(time.time()) - 3600
    await push_message(redis, prefix, old, "wamid.old.1", "hola", ts=an_hour_ago)
    await push_message(redis, prefix, old, "wamid.old.2", "sigo acá")  # fresh, same batch
    await push_message(redis, prefix, fresh, "wamid.fresh", "hola")

    (item,) = await in_review(redis, prefix, what="the old batch in review")
    await records.wait_turns(fresh, 1)
    assert item["person"] == old and item["reason"] == "too_old"
    assert "old" in str(item["error"]) and item["attempts"] == 0
    assert [m["id"] for m in item["messages"]] == ["wamid.old.1", "wamid.old.2"]  # type: ignore[attr-defined]
    assert await records.turns(old) == [], "the brain never saw the old batch"

    async def replied() -> list[str]:
        # The brain's record is written before the sender runs: wait for the reply itself.
        return [r["person"] for r in await outbox(redis, prefix)]

    assert await wait_for(replied, "the fresh person's reply") == [fresh]
    assert (await stats(redis, prefix))["review:too_old"] == 1
    assert not await redis.exists(Keys(prefix).tenant(TENANT).batch(old))
