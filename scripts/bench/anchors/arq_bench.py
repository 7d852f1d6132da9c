"""arq anchor for the worker's throughput scenario (scripts/bench/anchors.py runs it in its own
venv: arq is not a dependency of this project).

    python arq_bench.py REDIS_URL N CONCURRENCY [payload=BYTES] [retention=off|default]

Enqueues N jobs (ArqRedis.enqueue_job, 500 at a time; not timed), each carrying one
message-sized payload, then starts one Worker (its normal API: max_jobs=CONCURRENCY, a no-op
coroutine, every other setting arq's default, poll_delay 0.5 s included) and times from its
start until the N-th `after_job_end` hook (called once arq has recorded the job's end in Redis).
CPU: this process's user + system time (os.times) and Redis's INFO cpu over the same
interval. Prints one JSON line. retention=off: keep_result=0 (arq's default keeps each
result 3 600 s); default: arq's default.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from importlib import metadata
from typing import Any

from arq import create_pool  # type: ignore[import-not-found]
from arq.connections import RedisSettings  # type: ignore[import-not-found]
from arq.worker import Worker  # type: ignore[import-not-found]


async def noop(ctx: dict[str, Any], i: int, message: str) -> None:
    return None


def versions(*names: str) -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


async def redis_cpu_seconds(redis: Any) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


async def main(url: str, n: int, concurrency: int, payload: int, retention: str) -> dict[str, Any]:
    pool = await create_pool(RedisSettings.from_dsn(url))
    message = "x" * payload
    started = time.perf_counter()
    for start in range(0, n, 500):
        batch = range(start, min(n, start + 500))
        await asyncio.gather(*(pool.enqueue_job("noop", i, message) for i in batch))
    enqueue_s = time.perf_counter() - started

    done: set[str] = set()
    all_done = asyncio.Event()
    ended = 0.0

    async def after_job_end(ctx: dict[str, Any]) -> None:
        nonlocal ended
        done.add(ctx["job_id"])  # distinct jobs (a retried job ends twice; none expected)
        if len(done) == n and not all_done.is_set():
            ended = time.perf_counter()
            all_done.set()

    settings: dict[str, Any] = {"keep_result": 0} if retention == "off" else {}
    worker = Worker(
        functions=[noop],
        redis_pool=pool,
        max_jobs=concurrency,
        after_job_end=after_job_end,
        handle_signals=False,
        **settings,
    )
    redis0, cpu0, t0 = await redis_cpu_seconds(pool), cpu_seconds(), time.perf_counter()
    running = asyncio.create_task(worker.main())
    await all_done.wait()
    worker_s = cpu_seconds() - cpu0
    redis_s = await redis_cpu_seconds(pool) - redis0
    wall_s = ended - t0
    running.cancel()
    left = await pool.zcard(worker.queue_name)
    failed = worker.jobs_failed + worker.jobs_retried
    await pool.aclose()
    return {
        "anchor": "arq",
        "versions": versions("arq", "redis", "hiredis"),
        "n": n,
        "concurrency": concurrency,
        "retention": retention,
        "enqueue_s": enqueue_s,
        "wall_s": wall_s,
        "jobs_s": n / wall_s,
        "worker_cpu": worker_s / wall_s,
        "redis_cpu": redis_s / wall_s,
        "worker_us": worker_s / n * 1e6,
        "redis_us": redis_s / n * 1e6,
        "failed": failed,
        "left": left,
    }


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    options = dict(arg.split("=", 1) for arg in sys.argv[4:])
    result = asyncio.run(
        main(
            sys.argv[1],
            int(sys.argv[2]),
            int(sys.argv[3]),
            int(options.get("payload", "435")),
            options.get("retention", "off"),
        )
    )
    print(json.dumps(result), flush=True)
