"""The flusher keeps the loop awake while a large round is at Redis, and only then.

What each case pins down: a large round spins (the process burns CPU while Redis holds the
round) yet every other task keeps running; a small round sleeps; a spin ends after
`SPIN_MAX_S` even when Redis is still busy; a deadline that strikes mid-spin fails the
round's requests and leaves no write running. Redis is held with `CLIENT PAUSE`; CPU figures
are this process's own (`time.process_time`), bounds are loose for loaded machines.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

import receiver.store
from receiver.parsing import Item
from receiver.store import InboxWriter, StoreUnavailable
from receiver.whatsapp import parse_body
from shared.keys import Keys
from shared.scripts import Scripts
from tests.receiver.support import TENANT, dumps, inbox, payload, text_message

PAUSE_S = 0.6


def one_message(message_id: str) -> dict[str, list[Item]]:
    return parse_body(dumps(payload((TENANT, [text_message(message_id)], []))), 1).items


async def warm_writer(client: Redis, timeout_s: float = 5.0) -> InboxWriter:
    w = InboxWriter(client, Scripts(), Keys(), 60, timeout_s)
    await w.save(one_message("wamid.warm"))  # scripts loaded, the connection open
    return w


async def cpu_while_paused(redis: Redis, w: InboxWriter, requests: int) -> tuple[float, int]:
    """Send one round of `requests` into a paused Redis; (CPU seconds used, ticks seen) until
    all were answered. A ticker sleeping 10 ms at a time counts how often it got to run."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    await redis.execute_command("CLIENT", "PAUSE", str(int(PAUSE_S * 1000)), "WRITE")
    cpu = time.process_time()
    saved = await asyncio.gather(*(w.save(one_message(f"wamid.p{n}")) for n in range(requests)))
    cpu = time.process_time() - cpu
    ticking.cancel()
    assert [(s.stored, s.duplicates) for s in saved] == [(1, 0)] * requests
    return cpu, ticks


async def test_a_large_round_spins_and_other_tasks_still_run(
    untimed: Redis, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver.store, "SPIN_MIN_REQUESTS", 4)
    monkeypatch.setattr(receiver.store, "SPIN_MAX_S", 5.0)  # longer than the pause
    w = await warm_writer(untimed)
    cpu, ticks = await cpu_while_paused(redis, w, 4)
    # Spinning the whole pause would use about PAUSE_S of CPU; sleeping uses ~nothing.
    assert cpu > 0.3 * PAUSE_S, f"the round did not spin ({cpu:.3f}s of CPU)"
    assert ticks >= 10, f"the spin starved other tasks ({ticks} ticks of ~60)"
    assert len(await inbox(redis)) == 5


@pytest.mark.parametrize(
    ("min_requests", "max_s", "requests", "why"),
    [
        (4, 5.0, 3, "a small round spun"),
        (1, 0.05, 4, "the spin outlasted SPIN_MAX_S"),
        (1, 0, 4, "SPIN_MAX_S=0 still spun"),
    ],
    ids=["small-round-sleeps", "spin-ends-after-spin-max-s", "spin-max-s-0-is-off"],
)
async def test_the_loop_sleeps_while_paused(
    untimed: Redis,
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    min_requests: int,
    max_s: float,
    requests: int,
    why: str,
) -> None:
    """Redis holds the round for PAUSE_S; without a spin (or once it ended) the process sleeps."""
    monkeypatch.setattr(receiver.store, "SPIN_MIN_REQUESTS", min_requests)
    monkeypatch.setattr(receiver.store, "SPIN_MAX_S", max_s)
    w = await warm_writer(untimed)
    cpu, _ = await cpu_while_paused(redis, w, requests)
    assert cpu < 0.2 * PAUSE_S, f"{why} ({cpu:.3f}s of CPU)"


async def test_a_deadline_mid_spin_fails_the_round_and_leaves_no_write_running(
    untimed: Redis, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver.store, "SPIN_MIN_REQUESTS", 1)
    monkeypatch.setattr(receiver.store, "SPIN_MAX_S", 10.0)  # the deadline strikes first
    w = await warm_writer(untimed, timeout_s=0.3)
    await redis.execute_command("CLIENT", "PAUSE", "2000", "WRITE")
    try:
        started = time.monotonic()
        results = await asyncio.gather(
            *(w.save(one_message(f"wamid.d{n}")) for n in range(3)), return_exceptions=True
        )
        assert time.monotonic() - started < 1.8, "the deadline did not end the spin"
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        await asyncio.sleep(0)  # let the cancelled write unwind
        writes = [
            t
            for t in asyncio.all_tasks()
            if getattr(t.get_coro(), "__qualname__", "") == "InboxWriter._write"
        ]
        assert writes == [], "a cancelled round's write is still running"
    finally:
        await redis.execute_command("CLIENT", "UNPAUSE")
    saved = await w.save(one_message("wamid.after"))  # the writer still works
    assert (saved.stored, saved.duplicates) == (1, 0)
