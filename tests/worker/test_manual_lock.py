"""The lock of a reply by hand, script by script on the real Redis (shared/lua/manual_begin.lua,
manual_end.lua): refused beside a turn or a batch, released only by its own token, and a reply
whose lease ended records what went out without touching what a worker may hold now."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from shared.keys import Keys
from shared.ops import outbound
from shared.storage.scripts import Scripts

SCRIPTS = Scripts()
K = Keys("mr").tenant("106540352242922")
PERSON = "5491155550090"
EVENT = orjson.dumps({"v": 1, "kind": "message", "person": PERSON, "id": "wamid.1", "text": "x"})


async def begin(redis: Redis, token: str) -> list[Any]:
    row = await SCRIPTS.manual_begin(
        redis, K, person=PERSON, token=token, lease_ms=5000, service_window_s=86400
    )
    return [x.decode() if isinstance(x, bytes) else x for x in row]


async def end(redis: Redis, token: str, outcome: str, ids: list[str] | None = None) -> list[int]:
    row = await SCRIPTS.manual_end(
        redis,
        K,
        person=PERSON,
        token=token,
        outcome=outcome,
        reply_id="manual-1",
        remember=b'{"user":"x","assistant":"y","by":"human"}' if outcome == "sent" else b"",
        memory_turns=10,
        memory_ttl_ms=60_000,
        outbound_ttl_s=60,
        window_ms=1000,
        max_wait_ms=5000,
        since_ms=0,
        answered=orjson.dumps(["wamid.1"]),
        pause_ms=0,
        by="",
        provider_ids=ids or [],
    )
    return [int(x) for x in row]


async def test_the_lock_is_refused_beside_a_turn_or_a_batch_and_for_no_conversation(
    redis: Redis,
) -> None:
    assert await begin(redis, "manual:a") == ["none"], "no conversation at all"
    await redis.rpush(K.pending(PERSON), EVENT)
    await redis.set(K.lock(PERSON), "worker:1", px=5000)
    assert await begin(redis, "manual:a") == ["busy", "worker:1"]
    await redis.delete(K.lock(PERSON))
    await redis.hset(K.batch(PERSON), mapping={"id": "b1", "attempt": 1})  # a retry waiting
    assert await begin(redis, "manual:a") == ["busy", ""]
    await redis.delete(K.batch(PERSON))
    await redis.zadd(K.running, {PERSON: 1})
    assert await begin(redis, "manual:a") == ["busy", ""]
    await redis.delete(K.running)

    row = await begin(redis, "manual:a")
    assert row[0] == "ok" and row[2:] == ["0", "[]", EVENT.decode()]
    assert await redis.get(K.lock(PERSON)) == b"manual:a"
    assert 0 < await redis.pttl(K.lock(PERSON)) <= 5000


async def test_only_the_replys_own_token_releases_the_lock(redis: Redis) -> None:
    await redis.rpush(K.pending(PERSON), EVENT)
    assert (await begin(redis, "manual:a"))[0] == "ok"
    assert await end(redis, "manual:other", "release") == [0, 0]
    assert await redis.get(K.lock(PERSON)) == b"manual:a"
    assert await end(redis, "manual:a", "release") == [1, 0]
    assert await redis.exists(K.lock(PERSON)) == 0
    assert await redis.lrange(K.pending(PERSON), 0, -1) == [EVENT]


async def test_a_reply_that_lost_its_lock_records_what_went_out_and_leaves_pending(
    redis: Redis,
) -> None:
    await redis.rpush(K.pending(PERSON), EVENT)
    assert (await begin(redis, "manual:a"))[0] == "ok"
    await redis.set(K.lock(PERSON), "worker:2", px=5000)  # the lease ended, a turn took over

    assert await end(redis, "manual:a", "sent", ["wamid.OUT"]) == [0, 0]
    assert await redis.get(K.lock(PERSON)) == b"worker:2", "the turn keeps its lock"
    assert await redis.lrange(K.pending(PERSON), 0, -1) == [EVENT], "the turn's to answer"
    assert (await outbound.records(redis, K, ["wamid.OUT"]))[0]["batch"] == "manual-1"
    assert await redis.llen(K.memory(PERSON)) == 1, "it did reach the person"


async def test_a_batch_requeued_during_the_reply_is_due_when_it_ends(redis: Redis) -> None:
    """A requeue (review_act.lua) may make a batch while the reply holds the person; a claim
    then put it off to the lock's end. The reply's end makes it due now, and leaves the batch
    alone."""
    await redis.rpush(K.pending(PERSON), EVENT)
    assert (await begin(redis, "manual:a"))[0] == "ok"
    await redis.hset(K.batch(PERSON), mapping={"id": "item-r1", "requeued": 1})
    far = 10**13
    await redis.zadd(K.due, {PERSON: far})

    assert await end(redis, "manual:a", "sent", ["wamid.OUT"]) == [1, 1]
    assert (await redis.zscore(K.due, PERSON) or far) < far
    assert await redis.hget(K.batch(PERSON), "id") == b"item-r1"
    assert await redis.exists(K.pending(PERSON), K.lock(PERSON)) == 0
