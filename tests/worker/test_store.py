"""The conversation scripts (claim, renew, finish) through ConversationStore, on real Redis,
without worker processes: exact due times, lock and lease bookkeeping, lost leases."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared.conversation.batch import Batch
from shared.conversation.burst_shards import burst_shard_of
from shared.fleet.stats_hash import LAYOUT, LAYOUT_FIELD
from shared.keys import Keys
from shared.ops import live_state, outbound
from shared.settings import Settings
from tests.support.helpers import counters
from tests.worker.support import (
    TENANT,
    claim_due_now,
    push_message,
    push_status,
    quick_store,
    redis_ms,
    windowed_store,
)
from worker.conversation_store import ConversationStore

PERSON = "5491155550001"
# Window and cap a few seconds long: a loaded machine's stalls between two steps of a test
# must not make a batch due (or a cap pass) that the test expects still waiting.
WINDOW_MS, MAX_WAIT_MS = 3000, 3500


@pytest.fixture
def store(redis: Redis, settings: Settings, prefix: str) -> ConversationStore:
    return windowed_store(redis, settings, prefix, WINDOW_MS, MAX_WAIT_MS)


async def test_due_is_last_plus_window_capped_at_first_plus_max_wait(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    first = await store.claim(TENANT, 0, "t")
    assert await redis.zscore(k.due, PERSON) == first.now_ms + WINDOW_MS
    assert first.next_ms == first.now_ms + WINDOW_MS and first.batches == []

    await asyncio.sleep(0.3)
    await push_message(redis, prefix, PERSON, "m2", "sigo")
    second = await store.claim(TENANT, 5, "t")
    assert await redis.zscore(k.due, PERSON) == second.now_ms + WINDOW_MS, "window from the last"
    assert second.batches == [], "not due yet"

    await asyncio.sleep(0.5)
    await push_message(redis, prefix, PERSON, "m3", "y algo más")
    third = await store.claim(TENANT, 5, "t")
    assert third.now_ms + WINDOW_MS > first.now_ms + MAX_WAIT_MS
    assert await redis.zscore(k.due, PERSON) == first.now_ms + MAX_WAIT_MS, "capped by max wait"
    assert (
        await redis.hget(k.burst_shard(burst_shard_of(PERSON)), PERSON)
        == f"{first.now_ms},{third.now_ms}".encode()
    )


async def test_claim_takes_the_pending_messages_under_a_lock_with_a_lease(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    for i in range(3):
        await push_message(redis, prefix, PERSON, f"m{i}", f"texto {i}")
    await store.claim(TENANT, 0, "t")
    await redis.zadd(k.due, {PERSON: 0})  # due now
    claim = await store.claim(TENANT, 5, "tok")
    (batch,) = claim.batches
    assert batch.token == "tok:1" and batch.attempt == 0 and batch.person == PERSON
    assert [m.id for m in batch.messages] == ["m0", "m1", "m2"]
    assert batch.claimed_ms == claim.now_ms and batch.due_ms == 0
    assert await redis.get(k.lock(PERSON)) == b"tok:1"
    # The 10 s lease, less what a loaded machine spent since the claim (not 0.5 s, not 120 s).
    assert 5000 < await redis.pttl(k.lock(PERSON)) <= 10000
    assert await redis.zscore(k.running, PERSON) == claim.now_ms + 10000
    assert claim.next_ms == claim.now_ms + 10000
    assert not await redis.exists(
        k.pending(PERSON), k.due, k.burst, k.burst_shard(burst_shard_of(PERSON))
    )

    # While the batch runs, new messages wait and are not scheduled...
    await push_message(redis, prefix, PERSON, "m3", "durante")
    again = await store.claim(TENANT, 5, "other")
    assert again.batches == [] and not await redis.exists(k.due)
    # ...until the turn is done: then they are due as their burst says.
    assert not await store.finish_done(replace(batch, token="wrong"))
    assert await redis.get(k.lock(PERSON)) == b"tok:1", "a stale token changes nothing"
    assert await store.finish_done(batch)
    assert await redis.zscore(k.due, PERSON) == again.now_ms + WINDOW_MS
    assert not await redis.exists(k.lock(PERSON), k.batch(PERSON), k.running)


async def test_the_first_batch_makes_the_stats_a_hash_table_its_readers_skip(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """A turn's counters are HINCRBYs on the stats hash: in a listpack each scans every field
    twice, so the claim that makes a tenant's first batch writes the long `layout` field; the
    ops pages' counters leave it out (it is no number)."""
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m0", "hola")
    await store.claim(TENANT, 0, "t")
    assert await redis.object("encoding", k.stats) == b"listpack", "intake alone: no layout"
    await redis.zadd(k.due, {PERSON: 0})
    (batch,) = (await store.claim(TENANT, 5, "tok")).batches
    assert await redis.hget(k.stats, LAYOUT_FIELD) == LAYOUT.encode()
    assert await redis.object("encoding", k.stats) == b"hashtable"
    assert await store.finish_done(batch)
    assert await redis.object("encoding", k.stats) == b"hashtable", "it stays one"
    shown = await live_state.tenant(redis, Keys(prefix), TENANT)
    assert shown["counters"]["turns"] == 1 and LAYOUT_FIELD not in shown["counters"]


async def test_retry_keeps_the_batch_and_schedules_it_after_the_delay(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    batch = await claim_due_now(redis, store, prefix, PERSON, "a")
    before = await redis_ms(redis)
    assert await store.finish_retry(batch, 2.5, "RuntimeError: boom")
    after = await redis_ms(redis)
    due = await redis.zscore(k.due, PERSON)
    assert due is not None and before + 2500 <= due <= after + 2500
    assert await redis.hget(k.batch(PERSON), "attempt") == b"1"
    assert await redis.hget(k.batch(PERSON), "last_error") == b"RuntimeError: boom"
    assert not await redis.exists(k.lock(PERSON), k.running)

    await redis.zadd(k.due, {PERSON: 0})
    (retried,) = (await store.claim(TENANT, 5, "b")).batches
    assert retried.id == batch.id and retried.attempt == 1 and retried.token == "b:1"
    assert [m.id for m in retried.messages] == ["m1"]


async def test_a_wait_for_the_ai_keeps_the_batch_without_counting_the_attempt(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    batch = await claim_due_now(redis, store, prefix, PERSON, "a")
    before = await redis_ms(redis)
    assert await store.finish_retry(batch, 1.5, "waiting for the AI: 529", count_attempt=False)
    due = await redis.zscore(k.due, PERSON)
    assert due is not None and before + 1500 <= due <= await redis_ms(redis) + 1500
    assert await redis.hget(k.batch(PERSON), "attempt") == b"0"
    assert await redis.hget(k.batch(PERSON), "last_error") == b"waiting for the AI: 529"
    assert await redis.hmget(k.stats, ["ai_waits", "retries"]) == [b"1", None]
    assert not await redis.exists(k.lock(PERSON), k.running)

    await redis.zadd(k.due, {PERSON: 0})
    (waited,) = (await store.claim(TENANT, 5, "b")).batches
    assert waited.id == batch.id and waited.attempt == 0


async def test_renew_extends_only_the_holders_lease(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    batch = await claim_due_now(redis, store, prefix, PERSON, "a")
    await redis.pexpire(k.lock(PERSON), 500)
    assert await store.renew(TENANT, [(PERSON, "not-mine")]) == [False]
    assert await redis.pttl(k.lock(PERSON)) <= 500
    assert await store.renew(TENANT, [(PERSON, batch.token)]) == [True]
    assert await redis.pttl(k.lock(PERSON)) > 5000, "renewed to the 10 s lease"
    await redis.delete(k.lock(PERSON))
    assert await store.renew(TENANT, [(PERSON, batch.token)]) == [False]
    assert not await store.finish_done(batch), "a lost lease cannot finish"
    assert await redis.exists(k.batch(PERSON)), "the batch is kept for whoever resumes it"


async def test_an_expired_lease_makes_the_same_batch_claimable_again(
    redis: Redis, settings: Settings, prefix: str
) -> None:
    store = quick_store(redis, settings, key_prefix=prefix, lease_s=1.5, lease_renew_s=0.5)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    await store.claim(TENANT, 0, "t")
    await asyncio.sleep(0.05)
    (batch,) = (await store.claim(TENANT, 5, "dead")).batches
    assert (await store.claim(TENANT, 5, "early")).batches == [], "held while the lease runs"
    await asyncio.sleep(1.7)  # the 1.5 s lease ends (long enough that "early" came before)
    (resumed,) = (await store.claim(TENANT, 5, "alive")).batches
    assert resumed.id == batch.id and resumed.attempt == batch.attempt
    assert resumed.messages_json == batch.messages_json and resumed.token == "alive:1"
    assert await redis.hget(Keys(prefix).tenant(TENANT).stats, "leases_expired") == b"1"
    assert not await store.finish_done(batch), "the dead holder's token is void"
    assert await store.finish_done(resumed)


async def test_recording_a_part_again_counts_it_once(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """A worker repeats record_part when Redis did not answer; if the first call had run, the
    repeat must not count the part twice nor reset its outbound record."""
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    batch = await claim_due_now(redis, store, prefix, PERSON, "tok")
    assert await store.record_part(batch, 0, "wamid.P0")
    await push_status(redis, prefix, PERSON, "wamid.P0", "delivered")  # a status came meanwhile
    await store.claim(TENANT, 0, "intake")
    assert await store.record_part(batch, 0, "wamid.P0")
    assert await redis.hget(k.stats, "parts_out") == b"1"
    assert (await outbound.records(redis, k, ["wamid.P0"]))[0]["status"] == "delivered"
    assert not await store.record_part(replace(batch, token="wrong"), 0, "wamid.P0")


async def test_a_status_applied_again_changes_nothing(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """Statuses get no dedupe marker (ingest.lua): a redelivered one is taken in again and must
    neither move the record nor count its part again; only `status:<status>` counts it."""
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "m1", "hola")
    batch = await claim_due_now(redis, store, prefix, PERSON, "tok")
    assert await store.record_part(batch, 0, "wamid.P0")
    for status in ("sent", "delivered", "read", "delivered", "read", "sent", "read"):
        await push_status(redis, prefix, PERSON, "wamid.P0", status)
    await store.claim(TENANT, 0, "intake")
    [record] = await outbound.records(redis, k, ["wamid.P0"])
    assert record["status"] == "read" and record["person"] == PERSON and record["part"] == "0"
    counts = counters(await redis.hgetall(k.stats))
    assert counts["statuses"] == 7 and counts["status:read"] == 3
    assert counts["parts_sent"] == counts["parts_delivered"] == counts["parts_read"] == 1


async def test_one_claim_takes_the_free_people_off_due_and_keeps_the_held_ones_due(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """claim.lua takes every person it found due off `due` in one ZREM: one whose lock is still
    held, or whom a person of the business paused, is due again at that lock's or pause's end
    in the same call; the others are claimed and no longer due."""
    k = Keys(prefix).tenant(TENANT)
    free, locked, paused = PERSON, "5491155550002", "5491155550003"
    for person in (free, locked, paused):
        await push_message(redis, prefix, person, f"m-{person}", "hola")
    await store.claim(TENANT, 0, "intake")
    await redis.set(k.lock(locked), "someone", px=8000)
    await redis.set(k.human(paused), '{"by": "alice"}', px=6000)
    await redis.zadd(k.due, {free: 0, locked: 0, paused: 0})
    claim = await store.claim(TENANT, 5, "t")
    assert [b.person for b in claim.batches] == [free]
    assert await redis.zscore(k.due, free) is None
    locked_due, paused_due = await redis.zscore(k.due, locked), await redis.zscore(k.due, paused)
    assert locked_due is not None and claim.now_ms + 7000 < locked_due <= claim.now_ms + 8000
    assert paused_due is not None and claim.now_ms + 5000 < paused_due <= claim.now_ms + 6000
    assert await redis.llen(k.pending(locked)) == 1 and await redis.llen(k.pending(paused)) == 1


async def test_turns_ending_in_one_round_share_one_finish_each_ending_as_its_lock_says(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """Three turns of one tenant end in the same round: one finish call ends them all (one
    FCALL/EVALSHA), each as alone: a done turn, a retry, and one whose lease was lost, which
    changes nothing and whose figures are not added. The others' figures are summed, and so
    is the done turn's recorded part; the ended turns leave `running` and the done one's
    person is listed in `conversations` at the finish, all in the call's one ZREM and ZADD."""
    k = Keys(prefix).tenant(TENANT)
    done, retried, lost = await _three_claimed(redis, store, prefix, "54911555500", "t")
    await redis.set(k.lock(lost.person), "someone-else")
    listed = k.conversations
    listed_before = {x.person: await redis.zscore(listed, x.person) for x in (done, retried)}
    await asyncio.sleep(0.01)  # the finish's `now` after the intake's
    calls_before = _script_calls(await redis.info("commandstats"))
    figures = (("ai_le:250", 1), ("ai_sum_ms", 120))
    ended = await asyncio.gather(
        store.finish_done(done, last_part=(0, "wamid.done-0"), figures=figures),
        store.finish_retry(retried, 2.0, "boom", figures=figures),
        store.finish_done(lost, figures=(("ai_le:250", 1), ("ai_sum_ms", 1000))),
    )
    calls = _script_calls(await redis.info("commandstats"))
    assert ended == [True, True, False]
    assert calls - calls_before == 1, "one call for the three turns"
    stats = counters(await redis.hgetall(k.stats))
    assert stats["ai_le:250"] == 2 and stats["ai_sum_ms"] == 240, "the lost turn's not added"
    assert stats["turns"] == 1 and stats["retries"] == 1 and stats["parts_out"] == 1
    assert not await redis.exists(k.batch(done.person), k.lock(done.person))
    assert await redis.hget(k.batch(retried.person), "attempt") == b"1"
    assert await redis.get(k.lock(lost.person)) == b"someone-else"
    assert await redis.exists(k.batch(lost.person)), "the lost turn's batch is kept"
    running = {m.decode() for m in await redis.zrange(k.running, 0, -1)}
    assert running == {lost.person}, "the ended turns left running, the lost one did not"
    assert await redis.zscore(listed, done.person) > listed_before[done.person]
    assert await redis.zscore(listed, retried.person) == listed_before[retried.person]


async def test_turns_ending_in_one_call_each_leave_what_comes_next_as_alone(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """What comes after a turn is decided per person in a shared finish. In one call: one
    person wrote during the turn (due as the burst says), one has a late failure queued (its
    batch made, due now), one reply part's `delivered` came before its record (applied and
    counted), one had nothing; and the last one's finish sent twice: the second finds the lock
    released by the first and ends nothing."""
    k = Keys(prefix).tenant(TENANT)
    people = [f"5491155550{i}00" for i in range(4)]
    for person in people:
        await push_message(redis, prefix, person, f"m-{person}", "hola")
    waiting, late, early, plain = [
        await claim_due_now(redis, store, prefix, p, f"w{i}") for i, p in enumerate(people)
    ]
    await push_message(redis, prefix, waiting.person, "m-later", "otra cosa")
    await push_status(redis, prefix, early.person, "wamid.early-0", "delivered")
    await store.claim(TENANT, 0, "intake")
    job = {"batch": "b-before", "part": 0, "id": "wamid.gone", "code": 131026, "sent_ms": 1}
    await redis.hset(k.late(late.person), "job:wamid.gone", orjson.dumps(job))
    calls_before = _script_calls(await redis.info("commandstats"))
    ended = await asyncio.gather(
        store.finish_done(waiting),
        store.finish_done(late),
        store.finish_done(early, last_part=(0, "wamid.early-0")),
        store.finish_done(plain, last_part=(0, "wamid.plain-0")),
        store.finish_done(plain, last_part=(0, "wamid.plain-0")),
    )
    now = await redis_ms(redis)
    assert _script_calls(await redis.info("commandstats")) - calls_before == 1
    assert ended == [True, True, True, True, False]
    for turn in (waiting, plain, early):
        assert not await redis.exists(k.lock(turn.person), k.batch(turn.person))
    waiting_due = await redis.zscore(k.due, waiting.person)
    assert waiting_due is not None and now - 1000 < waiting_due <= now + WINDOW_MS
    assert await redis.hget(k.batch(late.person), "late_of") == b"b-before"
    late_due = await redis.zscore(k.due, late.person)
    assert late_due is not None and late_due <= now
    assert await redis.zscore(k.due, plain.person) is None
    assert await redis.zscore(k.due, early.person) is None
    early_record, plain_record = await outbound.records(
        redis, k, ["wamid.early-0", "wamid.plain-0"]
    )
    assert early_record["status"] == "delivered" and plain_record["status"] == "accepted"
    assert not await redis.exists(k.outbound("wamid.early-0")), "the parked status taken"
    stats = counters(await redis.hgetall(k.stats))
    assert stats["turns"] == 4 and stats["parts_out"] == 2 and stats["parts_delivered"] == 1


async def test_one_claim_of_hundreds_keeps_only_the_held_person_due(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """260 people due in one claim call (more than a worker's free slots ever ask for), the
    256th still locked: the other 259 are claimed, the held one stays due until its lock's end
    with its message waiting, and a context item of another is taken with that one's batch."""
    k = Keys(prefix).tenant(TENANT)
    people = [f"54911{i:08d}" for i in range(260)]
    for person in people:
        await push_message(redis, prefix, person, f"m-{person}", "hola", wake=False)
    await store.claim(TENANT, 0, "intake")
    held, with_context = people[255], people[257]
    await redis.set(k.lock(held), "someone", px=8000)
    await redis.rpush(k.context(with_context), b'{"kind":"note","text":"vip"}')
    await redis.zadd(k.due, dict.fromkeys(people, 0))
    claim = await store.claim(TENANT, 300, "big")
    claimed = {b.person: b for b in claim.batches}
    assert set(claimed) == set(people) - {held}
    assert "vip" in str(claimed[with_context].context)
    held_due = await redis.zscore(k.due, held)
    assert held_due is not None and claim.now_ms + 7000 < held_due <= claim.now_ms + 8000
    assert await redis.llen(k.pending(held)) == 1


async def test_replies_saved_in_one_round_share_one_call_an_earlier_reply_winning(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """save_reply for three turns in one round, one call: a new reply is stored and counted,
    a batch that holds one already (a resumed turn) keeps it and gets it back, a lost lease
    gets None and stores nothing."""
    k = Keys(prefix).tenant(TENANT)
    fresh, resumed, lost = await _three_claimed(redis, store, prefix, "54911555501", "s")
    await redis.hset(k.batch(resumed.person), "reply", "la de antes")
    await redis.set(k.lock(lost.person), "someone-else")
    before = _script_calls(await redis.info("commandstats"))
    saved = await asyncio.gather(
        store.save_reply(fresh, "nueva"),
        store.save_reply(resumed, "otra"),
        store.save_reply(lost, "perdida"),
    )
    assert _script_calls(await redis.info("commandstats")) - before == 1
    assert saved == ["nueva", "la de antes", None]
    assert await redis.hget(k.batch(fresh.person), "reply") == b"nueva"
    assert await redis.hget(k.batch(resumed.person), "reply") == b"la de antes"
    assert await redis.hget(k.batch(lost.person), "reply") is None
    assert await redis.hget(k.stats, "replies") == b"1"


async def _three_claimed(
    redis: Redis, store: ConversationStore, prefix: str, numbers: str, token: str
) -> list[Batch]:
    """Three people's one-message batches, each claimed (its own token)."""
    people = [f"{numbers}{i:02d}" for i in range(3)]
    for person in people:
        await push_message(redis, prefix, person, f"m-{person}", "hola")
    return [
        await claim_due_now(redis, store, prefix, p, f"{token}{i}") for i, p in enumerate(people)
    ]


def _script_calls(info: dict[str, Any]) -> int:
    return sum(v["calls"] for n, v in info.items() if n in ("cmdstat_evalsha", "cmdstat_fcall"))


async def test_a_turn_failing_on_its_values_fails_alone_in_a_shared_finish(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """A finish whose values make finish.lua fail (a retry delay that is not a number) gets
    that error; the turns ended in the same call end as alone, their figures added, the failed
    one's not."""
    k = Keys(prefix).tenant(TENANT)
    first, bad, last = await _three_claimed(redis, store, prefix, "54911555502", "e")
    bound = store._finishes.setdefault(TENANT, store._bind_finish(TENANT))
    bad_turn = (bad.person, bad.token, "retry", "soon", "boom", b"", "", "", "", 1, "ai_sum_ms 7")
    figures = (("ai_sum_ms", 100),)
    calls_before = _script_calls(await redis.info("commandstats"))
    ended = await asyncio.gather(
        store.finish_done(first, figures=figures),
        store._committer.submit_grouped(bound, bad_turn),
        store.finish_done(last, figures=figures),
        return_exceptions=True,
    )
    assert _script_calls(await redis.info("commandstats")) - calls_before == 1
    assert ended[0] is True and ended[2] is True
    assert isinstance(ended[1], ResponseError) and "arithmetic" in str(ended[1])
    assert not await redis.exists(k.lock(first.person), k.lock(last.person))
    stats = counters(await redis.hgetall(k.stats))
    assert stats["ai_sum_ms"] == 200 and stats["turns"] == 2
