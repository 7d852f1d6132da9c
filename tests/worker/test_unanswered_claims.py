"""Claims whose answer never reached the worker (Redis froze or answered too late).

Redis runs a command it read even when the client gave up on it: a claim run after its worker
stopped waiting would lock batches for tokens no turn holds, until their lease ended. So a claim
says by when its answer is awaited (`answer_by_ms`, on Redis's clock) and claims nothing after
it, and `unclaim` hands back what a claim whose answer was lost did lock, once that time has
passed: due again at once, the same batch, its attempts unchanged. The worker side is
tests/delivery/test_redis_freeze.py.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.worker.support import TENANT, push_message
from worker.conversation_store import ConversationStore
from worker.fleet.unanswered_claims import UnansweredClaims

ALICE, BOB = "5491155550051", "5491155550052"


@pytest.fixture
def store(redis: Redis, settings: Settings, prefix: str) -> ConversationStore:
    s = settings.with_overrides(key_prefix=prefix, lease_s=60, lease_renew_s=15)
    scripts = Scripts()
    return ConversationStore(s, scripts, GroupCommitter(redis, scripts))


async def redis_ms(redis: Redis) -> int:
    sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def due_now(redis: Redis, store: ConversationStore, prefix: str, *people: str) -> None:
    """A message of each person taken in, their batches due now."""
    for i, person in enumerate(people):
        await push_message(redis, prefix, person, f"wamid.u.{i}", "hola")
    await store.claim(TENANT, 0, "intake")
    await redis.zadd(Keys(prefix).tenant(TENANT).due, dict.fromkeys(people, 0))


async def test_a_claim_run_after_its_answer_time_claims_nothing(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await due_now(redis, store, prefix, ALICE)
    late = await store.claim(TENANT, 5, "w:1", answer_by_ms=await redis_ms(redis) - 1)
    assert late.batches == [] and 0 <= late.next_ms <= late.now_ms, "still due, not claimed"
    assert not await redis.exists(k.lock(ALICE))
    in_time = await store.claim(TENANT, 5, "w:2", answer_by_ms=await redis_ms(redis) + 60_000)
    assert [b.token for b in in_time.batches] == ["w:2:1"]


async def test_unclaim_hands_back_only_the_batches_of_the_lost_claims(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await due_now(redis, store, prefix, ALICE, BOB)
    (lost,) = (await store.claim(TENANT, 1, "w:1")).batches  # its answer "never came"
    (kept,) = (await store.claim(TENANT, 1, "w:10")).batches  # "w:1" is not its prefix
    assert {lost.person, kept.person} == {ALICE, BOB}
    assert await store.unclaim(TENANT, ["w:1"], await redis_ms(redis) - 1) == 1
    assert not await redis.exists(k.lock(lost.person))
    assert await redis.get(k.lock(kept.person)) == kept.token.encode()
    assert await redis.zscore(k.running, lost.person) is None
    assert await redis.zscore(k.running, kept.person) is not None
    # Due at once, the same batch with the same attempts, for the next claim.
    (again,) = (await store.claim(TENANT, 5, "w:2")).batches
    assert (again.person, again.id, again.attempt) == (lost.person, lost.id, lost.attempt)
    assert again.token == "w:2:1"
    stats = await redis.hgetall(k.stats)
    assert stats[b"unclaimed"] == b"1" and b"leases_expired" not in stats
    assert await store.unclaim(TENANT, ["w:1"], 0) == 0, "nothing left of that claim"


async def test_unclaim_waits_until_no_lost_claim_can_run_any_more(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await due_now(redis, store, prefix, ALICE)
    (lost,) = (await store.claim(TENANT, 1, "w:1")).batches
    # A claim with this answer time might still be run after the unclaim: nothing is done.
    assert await store.unclaim(TENANT, ["w:1"], await redis_ms(redis) + 60_000) == -1
    assert await redis.get(k.lock(ALICE)) == lost.token.encode()


async def test_the_answer_time_follows_redis_clock_and_ignores_a_late_read(
    redis: Redis, settings: Settings
) -> None:
    claims = UnansweredClaims(settings.with_overrides(redis_timeout_s=2))
    assert claims.answer_by_ms() == 0, "no limit before Redis's clock is known"
    redis_now = await redis_ms(redis)
    claims.answered(redis_now)
    timeout_ms = 2000
    assert abs(claims.answer_by_ms() - (redis_now + timeout_ms)) < 500
    claims.answered(redis_now - 800)  # an answer read late: Redis's clock looks behind
    assert abs(claims.answer_by_ms() - (redis_now + timeout_ms)) < 500, "the truest kept"
    claims.answered(redis_now - 60_000)  # a clock that was set: taken as it comes
    assert abs(claims.answer_by_ms() - (redis_now - 60_000 + timeout_ms)) < 500


async def test_lost_claims_are_handed_back_once_their_answer_time_passed(
    redis: Redis, store: ConversationStore, settings: Settings, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await due_now(redis, store, prefix, ALICE)
    (lost,) = (await store.claim(TENANT, 1, "w:1")).batches
    claims = UnansweredClaims(settings)
    claims.lost(TENANT, "w:0", 0)  # no answer time: it could run after a hand-back
    assert not claims
    claims.lost(TENANT, "w:1", await redis_ms(redis) + 400)
    assert await claims.hand_back(store) == set(), "it might still run: not yet"
    assert await redis.get(k.lock(ALICE)) == lost.token.encode() and claims
    await asyncio.sleep(0.5)
    assert await claims.hand_back(store) == {TENANT}
    assert not await redis.exists(k.lock(ALICE)) and not claims
