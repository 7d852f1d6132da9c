"""The safety sweep: one worker of the fleet sweeps per `POLL_INTERVAL_S`, and it still
catches what wake-ups and held due times missed (lost wake-ups, a killed worker's lease and
retry); a starting worker learns the due times nobody holds. Real worker processes killed by
SIGKILL (one frozen by SIGSTOP so that it hears nothing); calls counted with INFO
commandstats."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisCluster
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.support.helpers import tenants_on_every_node
from tests.worker.support import (
    TENANT,
    Records,
    Turn,
    WorkerFleet,
    now_ms,
    push_message,
    stats,
    wait_exit,
    wait_for,
)
from worker.conversation_store import ConversationStore

pytestmark = pytest.mark.slow
INTERVAL_S = 0.5


async def calls(redis: Redis) -> dict[str, int]:
    info: dict[str, Any] = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in info.items()}


async def test_one_worker_sweeps_per_interval_and_another_takes_over_when_it_is_killed(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    keys = Keys(prefix)
    idle = [f"10654035220{i:04d}" for i in range(20)]
    # And a registry entry that cannot be part of a key: left out, it stops nothing.
    await redis.sadd(keys.tenants, *idle, "bad{id}")
    procs = await fleet.start(3, POLL_INTERVAL_S=str(INTERVAL_S))
    await asyncio.sleep(INTERVAL_S)  # start-up sweeps (each worker's own) are over
    before, t0 = await calls(redis), time.monotonic()
    await asyncio.sleep(4 * INTERVAL_S)
    after, elapsed = await calls(redis), time.monotonic() - t0

    sweeps = after.get("smembers", 0) - before.get("smembers", 0)
    # One sweep per interval for the fleet (the guard lives 0.9 of it), where each of the
    # three workers used to sweep every interval (12 here). Lower bound: the sweeping goes on.
    assert 2 <= sweeps <= elapsed / (0.9 * INTERVAL_S) + 2, sweeps
    assert after["exists"] - before["exists"] == sweeps * len(idle), "one probe per tenant"
    scripts_run = after.get("evalsha", 0) + after.get("fcall", 0)
    assert scripts_run == before.get("evalsha", 0) + before.get("fcall", 0), "no claim if idle"

    holder = (await redis.get(keys.sweep_guard) or b"").decode()
    (sweeper,) = [p for p in procs if f":{p.pid}:" in holder]
    sweeper.send_signal(signal.SIGKILL)
    await wait_exit(sweeper, 5)
    # Work whose wake-up is lost: only a sweep by one of the survivors can find it.
    person = "5491100000061"
    pushed_ms = now_ms()
    await push_message(redis, prefix, person, "wamid.sw.1", "hola", wake=False)
    (turn,) = await records.wait_turns(person, 1, timeout_s=15)
    assert turn.start["pid"] in {p.pid for p in procs if p is not sweeper}
    # Guard left by the dead sweeper (<= 0.45 s) + a survivor's next try (<= 0.5 s) + the
    # 0.3 s window; generous for a shared machine.
    assert turn.start["ms"] - pushed_ms < 5000
    new_holder = (await redis.get(keys.sweep_guard) or b"").decode()
    assert f":{sweeper.pid}:" not in new_holder


@pytest.mark.cluster(only=True)
async def test_lost_wake_ups_of_tenants_on_every_node_are_caught_by_the_sweep(
    redis: Redis, prefix: str, fleet: WorkerFleet, redis_cluster: RedisCluster
) -> None:
    await fleet.start(1, POLL_INTERVAL_S=str(INTERVAL_S))
    await asyncio.sleep(INTERVAL_S)
    tenants = tenants_on_every_node(redis_cluster)
    assert len(tenants) == 3
    for i, tenant in enumerate(tenants):
        await push_message(
            redis, prefix, f"54911000007{i}", f"wamid.swc.{i}", "hola", tenant=tenant, wake=False
        )

    async def all_answered() -> bool:
        counts = [(await stats(redis, prefix, t)).get("turns", 0) for t in tenants]
        return all(n == 1 for n in counts)

    await wait_for(all_answered, "one turn per tenant", timeout_s=15)


async def test_a_killed_workers_lease_and_retry_are_taken_over_by_the_sweep_alone(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    timing = {"LEASE_S": "2", "LEASE_RENEW_S": "0.5", "RETRY_BASE_S": "2"}
    (rescuer,) = await fleet.start(1, POLL_INTERVAL_S=str(INTERVAL_S), **timing)
    await asyncio.sleep(INTERVAL_S)  # its start-up sweep found nothing
    # Frozen while the victim takes the work: the rescuer never sees these conversations
    # except through a later sweep (no wake-ups; its own sweep at start-up is over).
    rescuer.send_signal(signal.SIGSTOP)
    flaky, slow = "5491100000081", "5491100000082"
    # Two tenants: a claim for one would also recover an expired lease of the other.
    other = "106540352200009"
    try:
        await push_message(redis, prefix, flaky, "wamid.sk.1", "uno !fail=1", wake=False)
        await push_message(
            redis, prefix, slow, "wamid.sk.2", "dos !sleeponce=30", tenant=other, wake=False
        )
        (victim,) = await fleet.start(1, **timing)  # finds them with its start-up sweep
        await records.wait_turns(flaky, 1, outcome="error")
        await records.wait_turns(slow, 1, outcome=None)
        victim.send_signal(signal.SIGKILL)
        await wait_exit(victim, 5)
        # Read while the rescuer is still frozen: once resumed it may claim the retry at once
        # (on a loaded machine the retry can be due already), and the due entry is gone.
        retry_due_ms = int(await redis.zscore(Keys(prefix).tenant(TENANT).due, flaky) or 0)
        lease_ends_ms = now_ms() + await redis.pttl(Keys(prefix).tenant(other).lock(slow))
    finally:
        rescuer.send_signal(signal.SIGCONT)
    assert retry_due_ms > 0, "the failed turn's retry is due"

    async def resumed(person: str) -> list[Turn]:
        turns = await records.turns(person)
        return [t for t in turns if t.start["pid"] == rescuer.pid and t.outcome == "end"]

    (retried,) = await wait_for(lambda: resumed(flaky), "the retry run by the rescuer", 20)
    (taken_over,) = await wait_for(lambda: resumed(slow), "the lease taken over", 20)
    assert retried.start["attempt"] == 1 and retried.start["ms"] >= retry_due_ms - 50
    assert taken_over.start["attempt"] == 0 and taken_over.ids == ["wamid.sk.2"]
    assert taken_over.start["ms"] >= lease_ends_ms - 50, "not before the lease ended"
    # Caught within about a sweep interval of coming due (generous for a shared machine).
    assert retried.start["ms"] - retry_due_ms < 4000
    assert taken_over.start["ms"] - lease_ends_ms < 4000
    assert (await stats(redis, prefix, other))["leases_expired"] == 1
    assert "leases_expired" not in await stats(redis, prefix)


async def test_a_starting_worker_learns_due_times_that_only_redis_still_holds(
    redis: Redis, settings: Settings, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    # A worker took this message in and died before it was due: no worker holds its due time.
    # Due in 6 s: a worker process starts well within that even on a loaded machine.
    s = settings.with_overrides(key_prefix=prefix, debounce_window_s=6, max_wait_s=12)
    scripts = Scripts()
    await scripts.load(redis)
    store = ConversationStore(s, scripts, GroupCommitter(redis, scripts))
    person = "5491100000091"
    await push_message(redis, prefix, person, "wamid.sj.1", "hola", wake=False)
    claim = await store.claim(TENANT, 0, "gone-worker")
    due_ms = claim.next_ms
    assert due_ms > claim.now_ms and not claim.batches

    await fleet.start(1)  # sweeps only at start-up (interval 60 s)
    assert now_ms() < due_ms, "the worker came up before the conversation was due"
    (turn,) = await records.wait_turns(person, 1, timeout_s=20)
    # On time: its start-up sweep claimed for the tenant and kept the due time it answered
    # (3 s of room for a loaded machine; the next sweep is 60 s away).
    assert due_ms - 50 <= turn.start["ms"] < due_ms + 3000
