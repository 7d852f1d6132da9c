"""Three worker processes, forty people writing in bursts at once: one turn at a time per
person, every message in exactly one turn, per-person order kept."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter

import pytest
from redis.asyncio import Redis

from tests.worker.support import Records, WorkerFleet, outbox, push_message, wait_for

pytestmark = pytest.mark.slow
PEOPLE = 40


async def _write_in_bursts(
    redis: Redis, prefix: str, person: str, rng: random.Random, sent: list[str]
) -> None:
    await asyncio.sleep(rng.uniform(0, 0.5))
    for burst in range(3):
        for n in range(rng.randint(1, 4)):
            message_id = f"wamid.{person}.{burst}.{n}"
            assert await push_message(redis, prefix, person, message_id, f"{n} !jitter=0.8")
            sent.append(message_id)
            await asyncio.sleep(rng.uniform(0, 0.15))
        # Sometimes shorter than the window, sometimes long enough to land during the turn.
        await asyncio.sleep(rng.uniform(0.1, 1.2))


async def test_forty_people_three_workers_no_overlap_no_loss_in_order(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    procs = await fleet.start(3, DEBOUNCE_WINDOW_S="0.3", MAX_WAIT_S="1", WORKER_CONCURRENCY="8")
    rng = random.Random(20240601)
    people = [f"54911{i:08d}" for i in range(PEOPLE)]
    sent: dict[str, list[str]] = {p: [] for p in people}
    await asyncio.gather(*(_write_in_bursts(redis, prefix, p, rng, sent[p]) for p in people))
    total = sum(len(ids) for ids in sent.values())

    async def all_answered() -> bool:
        return sum(len(r["message_ids"]) for r in await outbox(redis, prefix)) >= total

    await wait_for(all_answered, f"replies covering all {total} messages", timeout_s=30)
    await asyncio.sleep(0.5)  # anything wrongly still running would show up now
    sent_replies = await outbox(redis, prefix)
    replies = {r["batch_id"]: r for r in sent_replies}
    assert len(replies) == len(sent_replies), "one reply per batch"
    turns = await records.turns()

    assert all(t.outcome == "end" for t in turns), "no failed or cancelled turns"
    assert len(turns) == len(replies), "one reply per turn"
    answered = Counter(i for t in turns for i in t.ids)
    assert set(answered) == {i for ids in sent.values() for i in ids}
    assert set(answered.values()) == {1}, "every message in exactly one turn"
    assert any(len(t.ids) > 1 for t in turns), "bursts were grouped"
    assert len({t.start["pid"] for t in turns}) >= 2, "the fleet shared the work"
    assert {t.start["pid"] for t in turns} <= {p.pid for p in procs}

    for person in people:
        mine = [t for t in turns if t.person == person]
        assert [i for t in mine for i in t.ids] == sent[person], f"order of {person}"
        for prev, nxt in itertools.pairwise(mine):
            assert prev.last is not None
            ended = max(prev.last["ms"], replies[prev.batch]["sent_ms"])
            assert nxt.start["ms"] >= ended, f"{person}: turns overlap ({prev}, {nxt})"
