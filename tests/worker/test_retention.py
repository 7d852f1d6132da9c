"""Retention of review items (worker/fleet/retention.py): the fleet's sweeper deletes those older
than `REVIEW_RETENTION_S`, a slice of the tenants per sweep."""

from __future__ import annotations

import time

import orjson
import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from tests.worker.support import TENANT, WorkerFleet, wait_for
from worker.fleet.retention import ReviewRetention, round_s, visiting

DAY_S = 86400.0


def item(item_id: str, person: str, reviewed_ms: int | None) -> bytes:
    fields = {"id": item_id, "person": person, "reason": "too_old", "messages": []}
    if reviewed_ms is not None:
        fields["reviewed_ms"] = reviewed_ms
    return orjson.dumps(fields)


async def test_only_items_older_than_the_retention_are_deleted(redis: Redis) -> None:
    keys = Keys("rt")
    now_ms = int(time.time() * 1000)
    old_ms, young_ms = now_ms - int(31 * DAY_S * 1000), now_ms - int(29 * DAY_S * 1000)
    review = keys.tenant(TENANT).review
    await redis.hset(
        review,
        mapping={
            "old": item("old", "1", old_ms),
            "young": item("young", "2", young_ms),
            f"{old_ms}-1": item(f"{old_ms}-1", "3", None),  # dated by its batch id only
            f"{young_ms}-2": item(f"{young_ms}-2", "4", None),
            "undated": item("undated", "5", None),  # kept: nothing says how old it is
            "not-json": b"{",
        },
    )
    retention = ReviewRetention(redis, keys, 30 * DAY_S, interval_s=DAY_S, timeout_s=5)

    assert await retention.prune([TENANT]) == 2

    assert sorted(await redis.hkeys(review)) == sorted(
        [b"young", f"{young_ms}-2".encode(), b"undated", b"not-json"]
    )
    assert await retention.prune([TENANT]) == 0


async def test_a_sweep_visits_only_its_slice_of_the_tenants(redis: Redis) -> None:
    keys = Keys("rt")
    tenants = [f"1065000000{i:05d}" for i in range(400)]
    old = item("old", "1", 0)
    for tenant in tenants:
        await redis.hset(keys.tenant(tenant).review, "old", old)
    retention = ReviewRetention(redis, keys, 30 * DAY_S, interval_s=60, timeout_s=5)
    now_s = 1_800_000_000.0
    chosen = retention.slice(tenants, now_s)
    assert 0 < len(chosen) < 40  # 400 x 2 x 60 s / 3600 s: about 13

    assert await retention.prune(tenants, now_s) == len(chosen)

    left = {t for t in tenants if await redis.exists(keys.tenant(t).review)}
    assert left == set(tenants) - set(chosen)


def test_every_tenant_is_visited_each_round_at_a_bounded_cost() -> None:
    # 2 000 tenants swept every 10 s: the load of 20 000 swept every second, in a tenth of
    # the test's time.
    tenants = [f"t{i}" for i in range(2_000)]
    interval, rnd = 10.0, round_s(30 * DAY_S)
    assert rnd == 3600
    visits = dict.fromkeys(tenants, 0)
    per_sweep = []
    t = 1_800_000_000.0
    while t < 1_800_000_000.0 + rnd:
        chosen = [x for x in tenants if visiting(x, t, rnd, 2 * interval)]
        per_sweep.append(len(chosen))
        for x in chosen:
            visits[x] += 1
        t += interval * 1.1  # sweeps come a little late: the window still covers each tenant
    assert min(visits.values()) >= 1
    assert max(per_sweep) <= 40  # about 11 on average
    # A short retention makes a short round; one shorter than the window visits everyone.
    assert round_s(20) == 2 and visiting("t1", 0, 2, 2)


@pytest.mark.slow
async def test_the_fleets_sweeper_deletes_old_items(
    redis: Redis, prefix: str, fleet: WorkerFleet
) -> None:
    k = Keys(prefix).tenant(TENANT)
    now_ms = int(time.time() * 1000)
    await redis.sadd(Keys(prefix).tenants, TENANT)
    await redis.hset(
        k.review,
        mapping={"old": item("old", "1", now_ms - 3_600_000), "new": item("new", "2", now_ms)},
    )
    # A retention of 20 s: a round of 2 s, so the item goes within a few sweeps.
    await fleet.start(1, POLL_INTERVAL_S="0.5", REVIEW_RETENTION_S="20")

    async def old_gone() -> bool:
        return not await redis.hexists(k.review, "old")

    await wait_for(old_gone, "the old review item deleted", timeout_s=15)
    assert await redis.hkeys(k.review) == [b"new"]
