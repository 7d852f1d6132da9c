"""shared/ops/live_state.py and worker/inspect.py's text: what operators see of a tenant, read from
plain keys against Redis's clock, with long lists cut at `limit` and their full size reported."""

from __future__ import annotations

import orjson
from fakeredis.aioredis import FakeRedis

from shared.keys import Keys
from shared.ops import live_state
from worker import inspect

KEYS = Keys("ls")
TENANT = "106540352242922"
K = KEYS.tenant(TENANT)


async def test_the_tenant_view_reads_every_queue_against_the_redis_clock(fake: FakeRedis) -> None:
    now = await live_state.redis_now_ms(fake)
    await fake.sadd(KEYS.tenants, TENANT)
    await fake.lpush(K.inbox, b"e1", b"e2")
    await fake.zadd(K.due, {"p1": now + 5_000, "p2": now - 1_000})
    await fake.zadd(K.running, {"p3": now + 60_000})
    await fake.set(K.lock("p3"), "tok:7")
    await fake.hset(K.batch("p3"), mapping={"id": "b-3", "attempt": 2, "size": 4})
    await fake.rpush(K.pending("p1"), b"m1", b"m2")
    await fake.rpush(K.pending("p3"), b"m3")
    await fake.set(K.lock("p1"), "not a pending list")  # another kind of conversation key

    state = await live_state.tenant(fake, KEYS, TENANT)

    assert state["registered"] and state["inbox"] == 2 and state["waiting_total"] == 2
    assert [w["person"] for w in state["waiting"]] == ["p2", "p1"], "soonest due first"
    assert all(w["due_in_ms"] == w["due_ms"] - state["now_ms"] for w in state["waiting"])
    (running,) = state["running"]
    assert running == {
        "person": "p3",
        "lease_ends_ms": now + 60_000,
        "lease_left_ms": now + 60_000 - state["now_ms"],
        "token": "tok:7",
        "batch": "b-3",
        "attempt": 2,
        "messages": 4,
    }
    assert state["pending"] == {
        "truncated": False,
        "conversations": [
            {"person": "p1", "messages": 2, "batch_in_flight": False},
            {"person": "p3", "messages": 1, "batch_in_flight": True},
        ],
    }
    text = "\n".join(inspect.render_tenant(state))
    assert "p2  due overdue by" in text and "p1  due in " in text
    assert "p3  batch b-3 attempt 2, 4 messages" in text and "(lock tok:7)" in text


async def test_long_lists_are_cut_at_the_limit_with_their_size_reported(fake: FakeRedis) -> None:
    now = await live_state.redis_now_ms(fake)
    people = [f"p{i}" for i in range(5)]
    await fake.zadd(K.due, {p: now + i for i, p in enumerate(people)})
    for p in people:
        await fake.rpush(K.pending(p), b"m")
        review_item = {"id": f"b-{p}", "person": p, "reason": "failed", "messages": [{}]}
        await fake.hset(K.review, f"b-{p}", orjson.dumps(review_item))

    state = await live_state.tenant(fake, KEYS, TENANT, limit=3)

    assert not state["registered"]
    assert state["waiting_total"] == 5 and [w["person"] for w in state["waiting"]] == people[:3]
    assert state["pending"]["truncated"] and len(state["pending"]["conversations"]) == 3
    assert state["review_total"] == 5 and len(state["review"]) == 3
    assert "messages" in state["review"][0] and state["review"][0]["messages"] == 1
    text = "\n".join(inspect.render_tenant(state))
    assert "pending     3+ conversations" in text and "not in the tenant registry" in text


async def test_counters_leave_out_the_fields_no_release_adds_to_any_more(fake: FakeRedis) -> None:
    """A stats hash written before 2026-12-05 keeps `ai_count` and `send_count`, frozen at the
    upgrade: shown, they would read as live counts (the buckets hold the count now)."""
    await fake.sadd(KEYS.tenants, TENANT)
    await fake.hset(K.stats, mapping={"turns": 7, "ai_count": 5, "send_count": 5, "ai_le:250": 9})
    counters = (await live_state.tenant(fake, KEYS, TENANT))["counters"]
    assert counters == {"ai_le:250": 9, "turns": 7}
