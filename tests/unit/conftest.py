"""Unit tests of logic that only reads and writes plain Redis data: on fakeredis, in memory.

No Lua (fakeredis would need lupa, and the scripts belong on a real server), no concurrency, no
crashes, no timing: those tests run on the real server of tests/support/fixtures.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fakeredis import FakeServer
from fakeredis.aioredis import FakeRedis


@pytest.fixture
async def fake() -> AsyncIterator[FakeRedis]:
    """A client of a fresh in-memory server of its own."""
    client = FakeRedis(server=FakeServer())
    try:
        yield client
    finally:
        await client.aclose()
