"""The wake-up queues (shared/fleet/wake.py) on a real Redis and cluster: a tenant waits once, the
longest waiting goes first, a blocking take waits for the first and gives up at its timeout,
one entry goes to one of several waiting takers."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from shared.fleet import wake
from shared.keys import Keys

QUEUE = Keys("wq").wake_queue


@pytest.mark.cluster
async def test_a_tenant_waits_once_and_the_longest_waiting_is_taken_first(redis: Redis) -> None:
    await wake.add(redis, QUEUE, ["t2"])
    await asyncio.sleep(0.002)
    await wake.add(redis, QUEUE, ["t1", "t3"])
    await wake.add(redis, QUEUE, ["t2", "t1"])  # already waiting: they keep their places
    assert await redis.zcard(QUEUE) == 3
    assert await wake.take(redis, QUEUE, 2, 1.0) == ["t2", "t1"]  # oldest first, then by id
    assert await wake.take(redis, QUEUE, 5, 1.0) == ["t3"]
    started = time.monotonic()
    assert await wake.take(redis, QUEUE, 5, 0.2) == []
    assert 0.15 <= time.monotonic() - started < 2.0
    # A take that waits gets what is added meanwhile, at once.
    waiting = asyncio.create_task(wake.take(redis, QUEUE, 5, 5.0))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await redis.execute_command(*wake.wake_command(Keys("wq"), ["t9"], wake.now_ms()))
    assert await waiting == ["t9"]
    assert time.monotonic() - started < 3.0, "not at the take's 5 s timeout"


@pytest.mark.cluster
async def test_one_entry_goes_to_one_of_several_waiting_takers(redis: Redis) -> None:
    # 3 s: the entry added 0.2 s later reaches a taker still waiting, even on a loaded machine
    # (and the wait stays inside the test client's 5 s socket timeout, redis-py's default).
    waiting = [asyncio.create_task(wake.take(redis, QUEUE, 10, 3.0)) for _ in range(4)]
    await asyncio.sleep(0.2)
    await wake.add(redis, QUEUE, ["t1"])
    results = await asyncio.gather(*waiting)
    assert sorted(map(len, results)) == [0, 0, 0, 1], results
