"""The ops audit log (shared/ops/audit.py): entries newest first, trimmed after the retention,
and a forgotten person's entries keep only that something happened."""

from __future__ import annotations

from fakeredis.aioredis import FakeRedis

from shared.keys import Keys
from shared.ops import audit

KEYS = Keys()
DAY_MS = 86_400_000


async def add(fake: FakeRedis, at_ms: int, **fields: str) -> audit.Entry:
    base = {"who": "ana", "action": "requeue", "tenant": "t1", "person": "5491100000001"}
    return await audit.record(
        fake, KEYS, **{**base, **fields}, retention_s=30 * 86400, now_ms=at_ms
    )


async def test_entries_come_newest_first_and_filter_by_tenant_and_person(fake: FakeRedis) -> None:
    await add(fake, 1_000, detail="first")
    await add(fake, 2_000, person="5491100000002", detail="other person")
    await add(fake, 3_000, tenant="t2", detail="other tenant")
    await add(fake, 4_000, detail="last")

    assert [e.detail for e in await audit.entries(fake, KEYS)] == [
        "last",
        "other tenant",
        "other person",
        "first",
    ]
    mine = await audit.entries(fake, KEYS, tenant="t1", person="5491100000001")
    assert [e.detail for e in mine] == ["last", "first"]
    assert [e.detail for e in await audit.entries(fake, KEYS, limit=1)] == ["last"]


async def test_adding_an_entry_trims_those_older_than_the_retention(fake: FakeRedis) -> None:
    await add(fake, 0, detail="old")
    await add(fake, DAY_MS, detail="recent")
    await add(fake, 30 * DAY_MS + 1, detail="now")  # "old" is now 30 days + 1 ms old

    assert [e.detail for e in await audit.entries(fake, KEYS)] == ["now", "recent"]


async def test_forgetting_a_person_keeps_only_that_something_happened(fake: FakeRedis) -> None:
    first = await add(fake, 1_000, detail="replied: my address is Calle 1")
    await add(fake, 2_000, person="5491100000002", detail="someone else")
    await add(fake, 3_000, tenant="t2", detail="same number, other tenant")

    assert await audit.forget_person(fake, KEYS, "t1", "5491100000001") == 1

    entries = await audit.entries(fake, KEYS)
    assert [e.detail for e in entries] == ["same number, other tenant", "someone else", ""]
    forgotten = entries[-1]
    assert (forgotten.id, forgotten.at_ms, forgotten.who, forgotten.action) == (
        first.id,
        1_000,
        "ana",
        "requeue",
    )
    assert forgotten.person == audit.FORGOTTEN
    assert await audit.forget_person(fake, KEYS, "t1", "5491100000001") == 0


async def test_a_member_that_is_not_an_entry_is_skipped_not_fatal(fake: FakeRedis) -> None:
    await fake.zadd(KEYS.audit, {b"written by hand": 5})
    await add(fake, 1_000, detail="real")

    assert [e.detail for e in await audit.entries(fake, KEYS)] == ["real"]
    assert await fake.zcard(KEYS.audit) == 2


async def test_a_filtered_read_looks_only_through_the_newest_it_is_told_to(
    fake: FakeRedis,
) -> None:
    """A conversation's view reads the newest entries only (receiver/ops/queries.py): a bulk
    action of many items must not make every view read them all."""
    await add(fake, 1_000, detail="mine, old")
    wanted = [
        {"who": "ana", "action": "drop", "tenant": "t1", "person": f"p{i}"} for i in range(400)
    ]
    await audit.record_many(fake, KEYS, wanted, retention_s=30 * 86400, now_ms=2_000)
    mine = {"tenant": "t1", "person": "5491100000001"}
    assert [e.detail for e in await audit.entries(fake, KEYS, **mine)] == ["mine, old"]
    assert await audit.entries(fake, KEYS, **mine, scan=200) == []
    assert len(await audit.entries(fake, KEYS, limit=1000)) == 401
