"""A worker started while Redis is down waits for it: one log line per attempt, capped
backoff, no traceback; it runs normally once Redis answers, and SIGTERM still stops it."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer, free_port
from tests.worker.support import WorkerFleet, outbox, push_message, wait_exit, wait_for

pytestmark = pytest.mark.slow

WAITING = "redis not reachable at start-up"


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
async def late_redis(port: int) -> AsyncIterator[Redis]:
    """A client of the Redis the test starts later on `port` (nothing listens there yet)."""
    client = Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def late_fleet(late_redis: Redis, port: int, prefix: str, tmp_path: Path) -> Iterator[WorkerFleet]:
    workers = WorkerFleet(late_redis, f"redis://127.0.0.1:{port}/0", prefix, tmp_path)
    try:
        yield workers
    finally:
        workers.close()
        print(workers.dump())  # shown by pytest only when the test failed


def _attempts(fleet: WorkerFleet) -> int:
    return sum(WAITING in line for line in fleet.dump().splitlines())


async def _logged_attempts(fleet: WorkerFleet, count: int) -> None:
    async def logged() -> bool:
        for proc in fleet.procs:
            assert proc.poll() is None, f"worker exited with {proc.returncode}: {fleet.dump()}"
        return _attempts(fleet) >= count

    await wait_for(logged, f"{count} logged attempt(s) to reach Redis", timeout_s=20)


async def test_a_worker_waits_for_redis_then_answers(
    late_redis: Redis, late_fleet: WorkerFleet, port: int, prefix: str, tmp_path: Path
) -> None:
    proc = late_fleet.launch()
    await _logged_attempts(late_fleet, 3)
    assert proc.poll() is None
    assert "Traceback" not in late_fleet.dump()

    with RedisServer(port=port, directory=tmp_path / "redis"):
        await late_fleet.wait_listening(1)
        person = "5491100000041"
        await push_message(late_redis, prefix, person, "wamid.late", "hola")
        (reply,) = await wait_for(lambda: outbox(late_redis, prefix), "the reply", timeout_s=15)
        assert reply["message_ids"] == ["wamid.late"]
        assert "redis answered" in late_fleet.dump()
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc, 10) == 0
    assert "Traceback" not in late_fleet.dump()


async def test_sigterm_while_waiting_for_redis_exits_0_at_once(late_fleet: WorkerFleet) -> None:
    proc = late_fleet.launch()
    await _logged_attempts(late_fleet, 2)
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert await wait_exit(proc, 10) == 0
    assert time.monotonic() - signalled < 3, "the wait must not outlast the signal"
    await asyncio.sleep(0)
    assert "Traceback" not in late_fleet.dump()


def test_the_worker_process_tunes_its_collector_and_a_host_program_keeps_its_own() -> None:
    """`python -m worker` freezes what its imports made and collects young objects every
    GC_YOUNG_THRESHOLD allocations (docs/benchmarks/worker.md: 7 % fewer instructions a
    turn); importing the worker, as the tests do, changes nothing."""
    import gc
    import subprocess
    import sys

    from worker.__main__ import GC_YOUNG_THRESHOLD

    before = gc.get_threshold()
    code = (
        "import gc; from worker.__main__ import tune_gc; tune_gc(); "
        "print(gc.get_threshold()[0], gc.get_freeze_count() > 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(GC_YOUNG_THRESHOLD), "True"]
    assert gc.get_threshold() == before
