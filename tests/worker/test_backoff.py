"""Backoff arithmetic of an in-process Worker: delay = RETRY_BASE_S × 2^(attempt−1), then
review after MAX_ATTEMPTS. A big base keeps retries from happening on their own; the test
makes each retry due by hand and reads the schedule the worker wrote."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from shared.conversation.batch import Batch
from shared.keys import Keys
from shared.settings import Settings
from tests.worker.support import (
    TENANT,
    in_review,
    listening,
    push_message,
    wait_for,
    wake_up,
)
from worker.process import Worker

PERSON = "5491155550009"


class AlwaysFails:
    def __init__(self) -> None:
        self.attempts: list[int] = []

    async def reply(self, batch: Batch) -> str | None:
        self.attempts.append(batch.attempt)
        raise ConnectionError(f"provider down ({batch.attempt})")


@pytest.fixture
async def failing_worker(
    redis: Redis, settings: Settings, prefix: str
) -> AsyncIterator[tuple[Worker, AlwaysFails]]:
    brain = AlwaysFails()
    s = settings.with_overrides(
        key_prefix=prefix,
        debounce_window_s=0.05,
        max_wait_s=0.05,
        retry_base_s=5,
        max_attempts=4,
        poll_interval_s=60,
    )
    worker = Worker(s, brain=brain)
    task = asyncio.create_task(worker.run())
    try:
        yield worker, brain
    finally:
        worker.handle_exit()
        await asyncio.wait_for(task, 10)


async def test_delays_double_from_the_base_then_review(
    redis: Redis, prefix: str, failing_worker: tuple[Worker, AlwaysFails]
) -> None:
    _, brain = failing_worker
    k = Keys(prefix).tenant(TENANT)

    async def up() -> bool:
        return await listening(redis, prefix) == 1

    await wait_for(up, "the worker listening")
    await push_message(redis, prefix, PERSON, "wamid.b", "hola")

    for attempt, delay_ms in [(1, 5000), (2, 10000), (3, 20000)]:

        async def failed(attempt: int = attempt) -> bool:
            return await redis.hget(k.batch(PERSON), "attempt") == str(attempt).encode()

        await wait_for(failed, f"attempt {attempt} recorded")
        sec, usec = await redis.time()
        now = int(sec) * 1000 + int(usec) // 1000
        due = await redis.zscore(k.due, PERSON)
        assert due is not None
        # Read some time after the worker wrote it: 2 s of room for a loaded machine, still
        # short of the step below (a delay that did not double) or of half the base.
        assert delay_ms - 2000 <= due - now <= delay_ms, (attempt, due - now)
        error = await redis.hget(k.batch(PERSON), "last_error")
        assert error == f"ConnectionError: provider down ({attempt - 1})".encode()
        # Make the retry due now and tell the worker, instead of waiting the delay.
        await redis.zadd(k.due, {PERSON: 0})
        await wake_up(redis, prefix)

    (item,) = await in_review(redis, prefix, what="review after the fourth failure")
    assert item["reason"] == "max_attempts" and item["attempts"] == 4
    assert item["error"] == "ConnectionError: provider down (3)"
    assert brain.attempts == [0, 1, 2, 3]
    assert not await redis.exists(k.batch(PERSON), k.due, k.lock(PERSON))
