"""Where a waiting conversation's burst lives (shared/lua/lib/burst.lua): a field of one of the
tenant's shards of bursts, spelled alike by the scripts and by Python (shared/conversation/
burst_shards.py); and the upgrade: a burst the release before wrote into the one `burst` hash
is honoured by the intake, the finish and a reply by hand, exactly as if it were in its shard,
then moved or deleted. The due times themselves: tests/worker/test_store.py and
tests/worker/test_debounce.py, unchanged."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from redis.asyncio import Redis

from shared.conversation.burst_shards import BURST_SHARDS, burst_shard_of
from shared.keys import Keys
from shared.ops import live_state
from shared.ops.manual_reply import OUTBOUND_TTL_S
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.worker.support import TENANT, claim_due_now, push_message, redis_ms, windowed_store
from worker.conversation_store import ConversationStore

PERSON = "5491155550042"
WINDOW_MS, MAX_WAIT_MS = 3000, 3500


@pytest.fixture
def store(redis: Redis, settings: Settings, prefix: str) -> ConversationStore:
    return windowed_store(redis, settings, prefix, WINDOW_MS, MAX_WAIT_MS)


def test_a_phone_number_is_sharded_by_its_last_three_digits_any_other_person_by_sha1() -> None:
    k = Keys("wa").tenant("106540352242922")

    def sha1_shard(person: str) -> str:
        return f"{int(hashlib.sha1(person.encode()).hexdigest()[:8], 16) % BURST_SHARDS:03d}"

    assert k.burst_shard(burst_shard_of("5491155550042")) == f"{k.burst}:042"
    assert burst_shard_of("AR.4410abc123") == "123", "whatever comes before its digits"
    for person in ("AR.4410abc", "42", "12a", "1٢3", "cw-7:é"):  # no three ASCII digits last
        assert burst_shard_of(person) == sha1_shard(person)
        assert len(sha1_shard(person)) == 3
    assert len({burst_shard_of(str(5491155550000 + i)) for i in range(BURST_SHARDS)}) == (
        BURST_SHARDS
    ), "consecutive numbers spread over every shard"


@pytest.mark.parametrize(
    "person", ["5491155550042", "AR.4410abc", "AR.4410abc123", "0001", "42", "1٢3", "cw-7:é"]
)
async def test_the_scripts_and_python_find_a_burst_in_the_same_shard(
    redis: Redis, store: ConversationStore, prefix: str, person: str
) -> None:
    keys = Keys(prefix)
    k = keys.tenant(TENANT)
    await push_message(redis, prefix, person, "m1", "hola")
    claim = await store.claim(TENANT, 0, "intake")
    assert (
        await redis.hget(k.burst_shard(burst_shard_of(person)), person)
        == f"{claim.now_ms},{claim.now_ms}".encode()
    )
    assert not await redis.exists(k.burst), "nothing in the one hash of the release before"
    state = await live_state.person(redis, keys, TENANT, person)
    assert state["burst"] == {"first_ms": claim.now_ms, "last_ms": claim.now_ms}
    # Claimed: the field goes, and the shard with its last field.
    await redis.zadd(k.due, {person: 0})
    (batch,) = (await store.claim(TENANT, 5, "t")).batches
    assert batch.person == person
    assert not await redis.exists(k.burst_shard(burst_shard_of(person)))


async def test_the_intake_honours_a_burst_of_the_release_before_and_moves_it(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    await store.claim(TENANT, 0, "intake")
    # As the release before left it: the burst in the one hash, its first 2.5 s ago.
    first = await redis_ms(redis) - 2500
    await redis.delete(k.burst_shard(burst_shard_of(PERSON)))
    await redis.hset(k.burst, PERSON, f"{first},{first}")
    await push_message(redis, prefix, PERSON, "m2", "sigo")
    claim = await store.claim(TENANT, 0, "intake")
    assert claim.now_ms + WINDOW_MS > first + MAX_WAIT_MS
    assert await redis.zscore(k.due, PERSON) == first + MAX_WAIT_MS, "capped from its first"
    assert (
        await redis.hget(k.burst_shard(burst_shard_of(PERSON)), PERSON)
        == f"{first},{claim.now_ms}".encode()
    )
    assert not await redis.exists(k.burst), "moved to its shard"
    # A live state of the release before's burst reads it there too.
    await redis.delete(k.burst_shard(burst_shard_of(PERSON)))
    await redis.hset(k.burst, PERSON, f"{first},{first + 7}")
    state = await live_state.person(redis, Keys(prefix), TENANT, PERSON)
    assert state["burst"] == {"first_ms": first, "last_ms": first + 7}
    # A new batch takes the messages: the old field goes with them.
    await redis.zadd(k.due, {PERSON: 0})
    (batch,) = (await store.claim(TENANT, 5, "t")).batches
    assert [m.id for m in batch.messages] == ["m1", "m2"]
    assert not await redis.exists(k.burst, k.burst_shard(burst_shard_of(PERSON)))


async def test_the_finish_schedules_what_waits_by_a_burst_of_the_release_before(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """Messages an old worker took in during a new worker's turn: their burst is in the one
    hash, and the finish makes them due as it says (a window after the last, capped)."""
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    batch = await claim_due_now(redis, store, prefix, PERSON, "a")
    now = await redis_ms(redis)
    await redis.rpush(k.pending(PERSON), b'{"id":"m2","text":"durante","ts":1,"rd":0}')
    await redis.hset(k.burst, PERSON, f"{now - 2000},{now - 1000}")
    assert await store.finish_done(batch)
    assert await redis.zscore(k.due, PERSON) == min(
        now - 1000 + WINDOW_MS, now - 2000 + MAX_WAIT_MS
    )
    # The same with the window deciding.
    batch = await claim_due_now(redis, store, prefix, PERSON, "m2")
    await redis.rpush(k.pending(PERSON), b'{"id":"m3","text":"otra","ts":1,"rd":0}')
    await redis.hset(k.burst, PERSON, f"{now - 100},{now - 50}")
    assert await store.finish_done(replace(batch))
    assert await redis.zscore(k.due, PERSON) == now - 50 + WINDOW_MS


async def test_a_reply_by_hand_reschedules_by_a_burst_of_the_release_before(
    redis: Redis, prefix: str
) -> None:
    scripts = Scripts()
    await scripts.load(redis)
    k = Keys(prefix).tenant(TENANT)
    now = await redis_ms(redis)
    await redis.set(k.lock(PERSON), "manual:x", px=10_000)
    await redis.rpush(k.pending(PERSON), b'{"id":"m1","text":"hola","ts":1,"rd":0}')
    await redis.hset(k.burst, PERSON, f"{now - 2000},{now - 1000}")

    async def end(since_ms: int) -> object:
        return await scripts.manual_end(
            redis,
            k,
            person=PERSON,
            token="manual:x",
            outcome="release",
            reply_id="r1",
            outbound_ttl_s=OUTBOUND_TTL_S,
            window_ms=WINDOW_MS,
            max_wait_ms=MAX_WAIT_MS,
            since_ms=since_ms,
            remember=b"",
            memory_turns=0,
            memory_ttl_ms=0,
            answered=b"[]",
            pause_ms=0,
            by="",
            provider_ids=[],
        )

    assert list(await end(0)) == [1, 0]
    assert await redis.zscore(k.due, PERSON) == now - 2000 + MAX_WAIT_MS
    assert (
        await redis.hget(k.burst_shard(burst_shard_of(PERSON)), PERSON)
        == f"{now - 2000},{now - 1000}".encode()
    )
    assert not await redis.exists(k.burst), "written to its shard, gone from the one hash"
    # Nothing left waiting: no burst anywhere.
    await redis.delete(k.pending(PERSON))
    await redis.hset(k.burst, PERSON, f"{now},{now}")
    await redis.set(k.lock(PERSON), "manual:x", px=10_000)
    assert list(await end(0)) == [1, 0]
    assert not await redis.exists(k.burst, k.burst_shard(burst_shard_of(PERSON)))
    assert await redis.zscore(k.due, PERSON) is None
