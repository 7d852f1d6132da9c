"""Fixtures of the worker tests: a key prefix of their own and a fleet that is always killed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.conftest import RedisTarget
from tests.worker.support import Records, WorkerFleet


@pytest.fixture
def prefix() -> str:
    return f"wt{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fleet(
    redis: Redis, redis_target: RedisTarget, prefix: str, tmp_path: Path
) -> Iterator[WorkerFleet]:
    workers = WorkerFleet(redis, redis_target.url, prefix, tmp_path, redis_target.cluster)
    try:
        yield workers
    finally:
        workers.close()
        # Shown by pytest only when the test failed.
        print(workers.dump())


@pytest.fixture
def records(redis: Redis, prefix: str) -> Records:
    return Records(redis, prefix)
