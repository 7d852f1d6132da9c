"""shared/fleet/wake.py's queue helpers: a tenant waits once, the longest waiting is taken first."""

from __future__ import annotations

from fakeredis.aioredis import FakeRedis

from shared.fleet import wake
from shared.keys import Keys

KEYS = Keys("wq")
QUEUE = KEYS.wake_queue


async def test_many_tenants_at_once_are_added_in_chunks_each_once(fake: FakeRedis) -> None:
    tenants = [f"t{i:04d}" for i in range(2 * wake.CHUNK + 7)]
    await wake.add(fake, QUEUE, [*reversed(tenants), *tenants[:10]])
    queued = await fake.zrange(QUEUE, 0, -1, withscores=True)
    assert [member.decode() for member, _ in queued] == tenants
    assert len({score for _, score in queued}) == 1, "one call, one stamp: ties go by id"


async def test_a_waiting_tenant_keeps_its_place(fake: FakeRedis) -> None:
    await fake.zadd(QUEUE, {"early": 1})
    await wake.add(fake, QUEUE, ["later", "early"])
    assert await fake.zscore(QUEUE, "early") == 1
    assert await wake.take(fake, QUEUE, 10, 1.0) == ["early", "later"]
    assert await fake.zcard(QUEUE) == 0


async def test_a_take_gives_at_most_what_it_asks_and_leaves_the_rest(fake: FakeRedis) -> None:
    await fake.zadd(QUEUE, {"a": 1, "b": 2, "c": 3})
    assert await wake.take(fake, QUEUE, 1, 1.0) == ["a"]
    assert await wake.take(fake, QUEUE, 5, 1.0) == ["b", "c"]


async def test_the_receivers_wake_command_adds_a_tenant_once(fake: FakeRedis) -> None:
    await fake.execute_command(*wake.wake_command(KEYS, ["t1", "t2"], 5))
    await fake.execute_command(*wake.wake_command(KEYS, ["t2", "t3"], 9))
    queued = await fake.zrange(QUEUE, 0, -1, withscores=True)
    assert queued == [(b"t1", 5.0), (b"t2", 5.0), (b"t3", 9.0)]
