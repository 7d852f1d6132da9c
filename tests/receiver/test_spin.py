"""The flusher keeps the loop awake while a large round is at Redis, and only then.

What each case pins down: a large round spins (the process burns CPU while Redis holds the
round) yet every other task keeps running; a small round sleeps; a spin ends after
`spin_max_s` even when Redis is still busy; a deadline that strikes mid-spin fails the
round's requests and leaves no write running. Redis is held with `CLIENT PAUSE`; CPU figures
are this process's own (`time.process_time`), bounds are loose for loaded machines.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from receiver.providers.parsing import Item
from receiver.providers.whatsapp import parse_body
from receiver.store import InboxWriter, StoreUnavailable, WriterTuning
from shared.keys import Keys
from shared.storage.scripts import Scripts
from tests.receiver.support import TENANT, dumps, inbox, payload, text_message

PAUSE_S = 0.6


def one_message(message_id: str) -> dict[str, list[Item]]:
    return parse_body(dumps(payload((TENANT, [text_message(message_id)], []))), 1).items


async def warm_writer(
    client: Redis, min_requests: int, max_s: float, timeout_s: float = 5.0
) -> InboxWriter:
    tuning = WriterTuning(spin_min_requests=min_requests, spin_max_s=max_s)
    w = InboxWriter(client, Scripts(), Keys(), 60, timeout_s, tuning)
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


async def test_a_large_round_spins_and_other_tasks_still_run(untimed: Redis, redis: Redis) -> None:
    w = await warm_writer(untimed, 4, 5.0)  # a spin longer than the pause
    cpu, ticks = await cpu_while_paused(redis, w, 4)
    # Spinning the whole pause would use about PAUSE_S of CPU; sleeping uses ~nothing.
    assert cpu > 0.3 * PAUSE_S, f"the round did not spin ({cpu:.3f}s of CPU)"
    assert ticks >= 10, f"the spin starved other tasks ({ticks} ticks of ~60)"
    assert len(await inbox(redis)) == 5


@pytest.mark.parametrize(
    ("min_requests", "max_s", "requests", "why"),
    [
        (4, 5.0, 3, "a small round spun"),
        (1, 0.05, 4, "the spin outlasted spin_max_s"),
        (1, 0, 4, "spin_max_s=0 still spun"),
    ],
    ids=["small-round-sleeps", "spin-ends-after-spin-max-s", "spin-max-s-0-is-off"],
)
async def test_the_loop_sleeps_while_paused(
    untimed: Redis,
    redis: Redis,
    min_requests: int,
    max_s: float,
    requests: int,
    why: str,
) -> None:
    """Redis holds the round for PAUSE_S; without a spin (or once it ended) the process sleeps."""
    w = await warm_writer(untimed, min_requests, max_s)
    cpu, _ = await cpu_while_paused(redis, w, requests)
    assert cpu < 0.2 * PAUSE_S, f"{why} ({cpu:.3f}s of CPU)"


async def test_a_deadline_mid_spin_fails_the_round_and_leaves_no_write_running(
    untimed: Redis, redis: Redis
) -> None:
    w = await warm_writer(untimed, 1, 10.0, timeout_s=0.3)  # the deadline strikes first
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
