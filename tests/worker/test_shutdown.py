"""Graceful shutdown of a worker process: SIGTERM drains within the grace, never releases a
lease early; a second SIGTERM exits at once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from tests.worker.support import (
    TENANT,
    Records,
    WorkerFleet,
    now_ms,
    outbox,
    push_message,
    wait_exit,
    wait_for,
)

pytestmark = pytest.mark.slow


async def turn_running(
    fleet: WorkerFleet,
    records: Records,
    env: dict[str, str],
    person: str,
    message_id: str,
    text: str,
) -> tuple[subprocess.Popen[bytes], str]:
    """One worker started with `env`, running `person`'s turn on `text` (its brain directives
    say how long the turn lasts): the worker, and the key of the lock the turn holds."""
    (worker,) = await fleet.start(1, **env)
    await push_message(fleet.redis, fleet.prefix, person, message_id, text)
    await records.wait_turns(person, 1, outcome=None)
    return worker, Keys(fleet.prefix).tenant(TENANT).lock(person)


async def test_sigterm_lets_the_running_turn_finish_holding_its_lease(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    # Renewed every 0.4 s, the 2 s lease survives a loaded machine's stalls (up to 1.6 s).
    env = {"LEASE_S": "2", "LEASE_RENEW_S": "0.4", "SHUTDOWN_GRACE_S": "8"}
    person = "5491100000031"
    stopping, lock = await turn_running(fleet, records, env, person, "wamid.term", "hola !sleep=4")
    token = await redis.get(lock)
    assert token
    # Another worker is ready to take the person over the moment the lease lapses.
    await fleet.start(1, **env)
    stopping.send_signal(signal.SIGTERM)
    signalled = time.monotonic()

    # The turn runs 4 s, twice the lease: renewal must go on while the process drains.
    while stopping.poll() is None:
        held = await redis.get(lock)
        if held != token:
            assert held is None and await outbox(redis, prefix), "lock gone before the reply"
        await asyncio.sleep(0.02)
    assert stopping.returncode == 0
    assert time.monotonic() - signalled <= 8

    (turn,) = await records.turns(person)
    assert turn.outcome == "end" and turn.start["pid"] == stopping.pid
    (reply,) = await outbox(redis, prefix)
    assert reply["message_ids"] == ["wamid.term"]
    assert not await redis.exists(lock)
    await asyncio.sleep(0.5)
    assert len(await records.turns(person)) == 1, "the other worker never ran it again"


async def test_a_turn_outliving_the_grace_keeps_its_lock_and_resumes_after_the_lease(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    env = {"LEASE_S": "2", "LEASE_RENEW_S": "0.5", "SHUTDOWN_GRACE_S": "1"}
    person = "5491100000032"
    stopping, lock = await turn_running(
        fleet, records, env, person, "wamid.grace", "hola !sleeponce=30"
    )
    (rescuer,) = await fleet.start(1, **env)

    stopping.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert await wait_exit(stopping, 5) == 0
    assert time.monotonic() - signalled <= 1 + 3, "exits once the grace is over"
    exited_ms = now_ms()
    pttl = await redis.pttl(lock)
    assert 0 < pttl <= 2000, "the lock stays, with its TTL, for the lease to run out"

    turns = await records.wait_turns(person, 1, outcome="end")
    cut, resumed = turns
    assert cut.start["pid"] == stopping.pid and cut.outcome == "cancelled"
    assert resumed.start["pid"] == rescuer.pid
    assert resumed.batch == cut.batch and resumed.ids == ["wamid.grace"]
    assert resumed.start["attempt"] == cut.start["attempt"] == 0
    assert resumed.start["ms"] >= exited_ms + pttl - 100, "not before the lease ended"
    # The brain's "end" record comes before the sender's reply: wait for the reply itself.
    (reply,) = await wait_for(lambda: outbox(redis, prefix), "the resumed turn's reply")
    assert reply["batch_id"] == cut.batch


async def test_a_second_sigterm_exits_at_once(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    person = "5491100000033"
    env = {"SHUTDOWN_GRACE_S": "30"}
    stopping, lock = await turn_running(
        fleet, records, env, person, "wamid.twice", "hola !sleep=30"
    )

    stopping.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.5)
    assert stopping.poll() is None, "the first signal waits for the running turn"
    stopping.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    await wait_exit(stopping, 5)
    assert time.monotonic() - signalled <= 3, "the second signal does not wait for the turn"
    assert await redis.pttl(lock) > 0, "the lease is left to expire, not released"
    assert await outbox(redis, prefix) == []


async def test_a_task_that_goes_on_after_its_cancellation_cannot_hang_the_shutdown() -> None:
    """On Python 3.11 a loop can lose its cancellation (`wait_for` racing what it waits for; a
    caught `TimeoutError`) and go round again: the shutdown cancels it again rather than wait
    for it forever (the tests once saw the Chatwoot catch-up loop do that)."""
    from worker.process import CANCEL_AGAIN_S, _cancel_all

    rounds = 0

    async def swallows_one_cancellation() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if rounds > 1:
                    raise

    async def ends_at_once() -> None:
        await asyncio.sleep(3600)

    stubborn = asyncio.create_task(swallows_one_cancellation())
    polite = asyncio.create_task(ends_at_once())
    await asyncio.sleep(0)
    started = time.monotonic()
    await asyncio.wait_for(_cancel_all([stubborn, polite]), CANCEL_AGAIN_S * 5)
    assert stubborn.cancelled() and polite.cancelled() and rounds == 2
    assert time.monotonic() - started >= CANCEL_AGAIN_S * 0.9  # it had its chance to end
