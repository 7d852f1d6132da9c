"""Wake-ups reach one worker, not all of them, and still start every turn on time.

Real worker processes with `POLL_INTERVAL_S` far beyond each test, so the safety sweep cannot
be what started a turn (each worker sweeps once, at start-up, before anything is pushed).
Which worker ran each claim is read from Redis itself: `MONITOR` on the node holding the
tenant shows every call (`FCALL`, or `EVALSHA`) of the claim script, whose token argument
names the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.redis_client import is_cluster
from shared.storage.scripts import Scripts
from tests.worker.support import (
    TENANT,
    Records,
    WorkerFleet,
    push_message,
    wait_exit,
    wait_for,
)
from worker.conversation_store import ConversationStore

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
NO_SWEEP = {"POLL_INTERVAL_S": "3600"}
OTHER_TENANT = "106540352242999"
THIRD_TENANT = "106540352242777"
SETTLE_S = 2.0  # start-up sweeps done, listeners blocked (with room for a loaded machine)


@dataclass
class Claims:
    """Claim script calls for one tenant seen by MONITOR: (worker pid, max batches) each."""

    calls: list[tuple[int, int]] = field(default_factory=list)

    @property
    def pids(self) -> set[int]:
        return {pid for pid, _ in self.calls}


@contextlib.asynccontextmanager
async def watching_claims(redis: Redis, prefix: str, tenant: str = TENANT) -> AsyncIterator[Claims]:
    inbox = Keys(prefix).tenant(tenant).inbox
    if is_cluster(redis):
        node = redis.get_node_from_key(inbox)  # type: ignore[attr-defined]
        monitor_client = Redis(host=node.host, port=node.port)
    else:
        where = redis.connection_pool.connection_kwargs
        monitor_client = Redis(host=where["host"], port=where["port"])
    claim = Scripts().claim
    heads = (["EVALSHA", claim.sha], ["FCALL", claim.function])
    seen = Claims()

    async def listen() -> None:
        async with monitor_client.monitor() as monitor:
            async for command in monitor.listen():
                args = command["command"].split(" ")
                if args[:2] not in heads or args[3] != inbox:
                    continue
                argv = args[3 + int(args[2]) :]
                # The token prefix is "<host>:<pid>:<hex>:<seq>" (Worker.worker_id + a count).
                seen.calls.append((int(argv[3].split(":")[-3]), int(argv[1])))

    task = asyncio.create_task(listen())
    await asyncio.sleep(0.2)  # MONITOR is on
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await monitor_client.aclose()


async def test_one_wake_up_reaches_one_worker_of_four(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    procs = await fleet.start(4, DEBOUNCE_WINDOW_S="0.2", **NO_SWEEP)
    await asyncio.sleep(SETTLE_S)
    async with watching_claims(redis, prefix) as claims:
        assert await push_message(redis, prefix, "5491155550001", "wamid.one.1", "hola")
        await records.wait_turns("5491155550001", 1)
        await asyncio.sleep(0.3)  # the finish's own look at the tenant
    # Pub/sub woke all four, and each ran the claim script at once and again at the due time.
    assert len(claims.pids) == 1, claims.calls
    (pid,) = claims.pids
    assert pid in {p.pid for p in procs}
    # Intake, the claim at the due time, the look after the finish: nothing more.
    assert len(claims.calls) <= 3, claims.calls


async def test_a_burst_is_answered_within_the_window_from_its_wake_ups_alone(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    # A 1.5 s window against lines 0.15 s apart: a loaded machine's stall does not split the
    # burst; the 10 s cap stays far from the bound below.
    await fleet.start(3, DEBOUNCE_WINDOW_S="1.5", MAX_WAIT_S="10", **NO_SWEEP)
    await asyncio.sleep(SETTLE_S)
    person = "5491155550002"
    for n, text in enumerate(["hola", "una consulta", "¿tienen turno el sábado?"]):
        assert await push_message(redis, prefix, person, f"wamid.burst.{n}", text)
        await asyncio.sleep(0.15)
    last_ms = time.time() * 1000
    (turn,) = await records.wait_turns(person, 1, timeout_s=20)
    assert turn.ids == [f"wamid.burst.{n}" for n in range(3)], "one turn for the burst"
    # Due 1.5 s after the last line (2.5 s of room for a loaded machine); a sweep would have
    # been an hour away, the cap ~9.7 s.
    assert turn.start["ms"] - last_ms < 1500 + 2500, turn.start["ms"] - last_ms


async def test_a_busy_worker_hands_new_work_to_one_with_a_free_slot(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    (busy,) = await fleet.start(1, WORKER_CONCURRENCY="1", DEBOUNCE_WINDOW_S="0.3", **NO_SWEEP)
    assert await push_message(redis, prefix, "5491155550003", "wamid.busy.0", "hola !sleep=20")
    await records.wait_turns("5491155550003", 1, outcome=None)
    (idle,) = await fleet.start(1, DEBOUNCE_WINDOW_S="0.3", **NO_SWEEP)
    await asyncio.sleep(SETTLE_S)
    # Two wake-ups a moment apart, while both workers wait on the new-work queue: each
    # worker takes one (or the first taker both), so the busy one takes some in.
    people = {TENANT: "5491155550004", OTHER_TENANT: "5491155550005"}
    async with (
        watching_claims(redis, prefix, TENANT) as first,
        watching_claims(redis, prefix, OTHER_TENANT) as second,
    ):
        pushed_ms = {}
        for tenant, person in people.items():
            assert await push_message(
                redis, prefix, person, f"wamid.busy.{person}", "hola", tenant=tenant
            )
            pushed_ms[person] = time.time() * 1000
            await asyncio.sleep(0.05)
        turns = {p: (await records.wait_turns(p, 1, timeout_s=20))[0] for p in people.values()}
    # The busy worker was woken (an intake-only claim) and gave the due conversation away.
    assert (busy.pid, 0) in first.calls + second.calls, (first.calls, second.calls)
    for person, turn in turns.items():
        assert turn.start["pid"] == idle.pid
        # Due 0.3 s after its message (3 s of room for a loaded machine), not after the busy
        # worker's 20 s turn nor an hour later from a sweep.
        assert turn.start["ms"] - pushed_ms[person] < 300 + 3000, person


async def test_a_stopping_worker_hands_the_due_times_it_holds_to_the_fleet(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    # A 4 s window: long enough that, on a loaded machine, the holder is stopped before the
    # due time it holds comes (else it would run the turn itself).
    procs = await fleet.start(2, DEBOUNCE_WINDOW_S="4", MAX_WAIT_S="10", **NO_SWEEP)
    await asyncio.sleep(SETTLE_S)
    people = {TENANT: "5491155550006", OTHER_TENANT: "5491155550007"}
    async with (
        watching_claims(redis, prefix, TENANT) as first,
        watching_claims(redis, prefix, OTHER_TENANT) as second,
    ):
        before_ms, pushed_ms = {}, {}
        for tenant, person in people.items():
            before_ms[person] = time.time() * 1000  # taken in after this
            assert await push_message(
                redis, prefix, person, f"wamid.stop.{person}", "hola", tenant=tenant
            )
            pushed_ms[person] = time.time() * 1000
            await asyncio.sleep(0.05)

        async def taken_in() -> bool:
            for tenant, person in people.items():
                if await redis.zscore(Keys(prefix).tenant(tenant).due, person) is None:
                    return False
            return True

        await wait_for(taken_in, "both messages taken in")
        # Stop the worker that took the first tenant in: it alone knows that due time.
        (holder,) = [p for p in procs if p.pid == first.calls[0][0]]
        (survivor,) = [p for p in procs if p is not holder]
        holder.send_signal(signal.SIGTERM)
        assert await wait_exit(holder, 10) == 0
        turns = {p: (await records.wait_turns(p, 1, timeout_s=20))[0] for p in people.values()}
    assert second.calls, "the second tenant was taken in too"
    for person, turn in turns.items():
        # Due 4 s after its message: from the relay, not an hour later from a sweep
        # (2.5 s of room for a loaded machine).
        assert turn.start["pid"] == survivor.pid
        assert turn.start["ms"] - before_ms[person] >= 4000 - 50, person
        assert turn.start["ms"] - pushed_ms[person] < 4000 + 2500, person


async def test_one_visit_shares_the_free_slots_among_its_tenants_and_never_overfills(
    redis: Redis, prefix: str, settings: Settings, fleet: WorkerFleet, records: Records
) -> None:
    tenants = [TENANT, OTHER_TENANT, THIRD_TENANT]
    people = {t: [f"54911{t[-3:]}{p:04d}" for p in range(3)] for t in tenants}
    for tenant, persons in people.items():
        for person in persons:
            await push_message(
                redis, prefix, person, f"wamid.{person}", "hola !sleep=0.5", tenant=tenant
            )
    # Taken in beforehand and due by the time the worker starts: its start-up sweep then
    # visits the three tenants at once, with 9 conversations due and 4 slots.
    s = settings.with_overrides(key_prefix=prefix, debounce_window_s=0.05)
    scripts = Scripts()
    await scripts.load(redis)
    store = ConversationStore(s, scripts, GroupCommitter(redis, scripts))
    for tenant in tenants:
        await store.claim(tenant, 0, "intake")
    await asyncio.sleep(0.2)
    await fleet.start(1, WORKER_CONCURRENCY="4", **NO_SWEEP)
    for persons in people.values():
        for person in persons:
            await records.wait_turns(person, 1, timeout_s=15)
    turns = await records.turns()
    assert len(turns) == 9
    spans = [(t.start["ms"], t.last["ms"]) for t in turns if t.last]
    most = max(sum(1 for s0, e0 in spans if s0 <= start < e0) for start, _ in spans)
    assert most == 4, "never more turns than WORKER_CONCURRENCY, and all four slots used"
    # The first four: a slot for each tenant, then the one left to the earliest due.
    assert {t.start["tenant"] for t in turns[:4]} == set(tenants)


async def test_a_tenant_an_old_worker_relayed_is_served_from_the_legacy_queue(
    redis: Redis, prefix: str, settings: Settings, fleet: WorkerFleet, records: Records
) -> None:
    """A rolling deploy of the relay queue's rename (shared/fleet/wake.py): a worker of the previous
    release took a message in and relayed the due tenant to the queue it knows, the legacy
    one. A new worker serves it from there: no wake-up for it, and no sweep for an hour."""
    (worker,) = await fleet.start(1, DEBOUNCE_WINDOW_S="0.2", **NO_SWEEP)
    await asyncio.sleep(SETTLE_S)  # its start-up sweep is over: it found nothing
    person = "5491155550008"
    assert await push_message(redis, prefix, person, "wamid.legacy", "hola", wake=False)
    # The old worker's intake (it sets the due time), then its relay: `ZADD NX`, score in ms.
    s = settings.with_overrides(key_prefix=prefix, debounce_window_s=0.2)
    scripts = Scripts()
    await scripts.load(redis)
    await ConversationStore(s, scripts, GroupCommitter(redis, scripts)).claim(TENANT, 0, "old")
    legacy = Keys(prefix).legacy_relay_queue
    relayed_ms = time.time() * 1000
    assert await redis.zadd(legacy, {TENANT: int(relayed_ms)}, nx=True) == 1
    (turn,) = await records.wait_turns(person, 1, timeout_s=20)
    assert turn.start["pid"] == worker.pid
    # Due 0.2 s after the intake (3 s of room for a loaded machine), not an hour later.
    assert turn.start["ms"] - relayed_ms < 200 + 3000
    assert await redis.zcard(legacy) == 0, "drained"
