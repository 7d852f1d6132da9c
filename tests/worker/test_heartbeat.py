"""Worker liveness: real `python -m worker` processes write their heartbeats in `wa:workers`;
`python -m worker.inspect` and `/metrics` list the live ones; one killed with SIGKILL drops out
of the live list once three of its intervals passed, and its entry is deleted by the other;
one stopped with SIGTERM deletes its own at once."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer
from shared.fleet import heartbeats
from shared.fleet.heartbeats import Beat, Workers
from shared.keys import Keys
from shared.settings import Settings, env_names
from tests.receiver.support import running
from tests.support.helpers import RedisTarget
from tests.worker.support import WorkerFleet, run_module, wait_exit, wait_for

pytestmark = pytest.mark.slow
INTERVAL_S = 1.0
METRICS_TOKEN = "heartbeat-token"


def run_cli(redis_server: RedisServer, prefix: str) -> subprocess.CompletedProcess[str]:
    """`python -m worker.inspect` (the fleet view) against the test Redis."""
    env = {k: v for k, v in os.environ.items() if k not in env_names()}
    env.update(REDIS_URL=redis_server.url, KEY_PREFIX=prefix)
    return run_module("worker.inspect", env=env)


async def live_workers(redis: Redis, prefix: str) -> Workers:
    return await heartbeats.read(redis, Keys(prefix).workers)


async def workers_live_metric(redis_target: RedisTarget, prefix: str) -> float:
    settings = Settings.from_env(
        {**redis_target.env(), "KEY_PREFIX": prefix, "METRICS_TOKEN": METRICS_TOKEN}
    )
    async with running(settings) as client:
        page = await client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    (line,) = [x for x in page.text.splitlines() if x.startswith("wa_workers_live ")]
    return float(line.split()[1])


async def test_live_workers_are_listed_and_a_killed_one_drops_out(
    redis: Redis,
    redis_server: RedisServer,
    redis_target: RedisTarget,
    prefix: str,
    fleet: WorkerFleet,
) -> None:
    procs = await fleet.start(2, HEARTBEAT_INTERVAL_S=INTERVAL_S, WORKER_CONCURRENCY=3)

    async def both() -> Workers | None:
        state = await live_workers(redis, prefix)
        return state if len(state.live) == 2 else None

    state = await wait_for(both, "two heartbeats", timeout_s=15)
    assert {b.pid for b in state.live} == {p.pid for p in procs}
    for beat in state.live:
        assert beat.concurrency == 3 and beat.running == 0
        assert beat.interval_ms == 1000 and beat.started_ms <= beat.seen_ms <= state.now_ms
    assert await workers_live_metric(redis_target, prefix) == 2
    shown = run_cli(redis_server, prefix)
    assert shown.returncode == 0, shown.stderr
    assert "workers alive: 2" in shown.stdout
    for proc in procs:
        assert f":{proc.pid}:" in shown.stdout  # the worker id names host:pid:<random>
    assert "running 0/3" in shown.stdout

    victim, survivor = procs
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await wait_exit(victim, 5)
    # Its last beat was at most one interval ago: it stays listed for two more at least.
    assert victim.pid in {b.pid for b in (await live_workers(redis, prefix)).live}

    async def dropped_out() -> bool:
        state = await live_workers(redis, prefix)
        return [b.pid for b in state.live] == [survivor.pid] and not state.dead

    await wait_for(dropped_out, "the killed worker dropped and its entry deleted", timeout_s=15)
    assert time.monotonic() - killed_at >= 1.5  # three intervals after its last beat
    assert await workers_live_metric(redis_target, prefix) == 1
    assert "workers alive: 1" in run_cli(redis_server, prefix).stdout

    survivor.send_signal(signal.SIGTERM)
    assert await wait_exit(survivor, 15) == 0
    assert await redis.hlen(Keys(prefix).workers) == 0


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"{}", b'{"started_ms": "x"}', b"[]"],
)
def test_an_unreadable_entry_counts_as_dead(raw: bytes) -> None:
    assert Beat.parse(b"w1", raw) is None


def test_an_entry_is_dead_after_three_of_its_own_intervals() -> None:
    beat = Beat("w1", 0, seen_ms=10_000, interval_ms=500, running=1, concurrency=5, host="h", pid=1)
    assert beat.alive(11_500)
    assert not beat.alive(11_501)
    assert Beat.parse("w1", beat.to_json()) == beat
