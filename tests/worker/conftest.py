"""Fixtures of the worker tests: a key prefix of their own (used by `fleet`) and `records`."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from tests.worker.support import Records


@pytest.fixture
def prefix() -> str:
    return f"wt{uuid.uuid4().hex[:8]}"


@pytest.fixture
def records(redis: Redis, prefix: str) -> Records:
    return Records(redis, prefix)
