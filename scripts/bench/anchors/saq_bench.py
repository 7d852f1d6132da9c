"""SAQ anchor for the worker's throughput scenario (scripts/bench/anchors.py runs it in its own
venv: SAQ is not a dependency of this project).

    python saq_bench.py REDIS_URL N CONCURRENCY [payload=BYTES] [retention=off|default]

Enqueues N jobs (Queue.enqueue, 500 at a time; not timed), each carrying one message-sized
payload, then starts one Worker (its normal API: concurrency=CONCURRENCY, a no-op coroutine,
every other setting SAQ's default) and times from its start until the N-th `after_process`
hook (called once SAQ has recorded the job's end in Redis). CPU: this process's user + system
time (os.times) and Redis's INFO cpu over the same interval. Prints one JSON line.
retention=off: ttl=-1 on each job (SAQ's default keeps a finished job 600 s); default: SAQ's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from importlib import metadata
from typing import Any

from saq import Queue, Status, Worker  # type: ignore[import-not-found]


async def noop(ctx: dict[str, Any], *, i: int, message: str) -> None:
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
    queue = Queue.from_url(url, name="anchor")
    await queue.connect()
    message = "x" * payload
    job: dict[str, Any] = {"ttl": -1} if retention == "off" else {}
    started = time.perf_counter()
    for start in range(0, n, 500):
        batch = range(start, min(n, start + 500))
        await asyncio.gather(*(queue.enqueue("noop", i=i, message=message, **job) for i in batch))
    enqueue_s = time.perf_counter() - started

    done: set[str] = set()
    all_done = asyncio.Event()
    ended = 0.0

    async def after_process(ctx: dict[str, Any]) -> None:
        # Distinct completed jobs: SAQ's start-up sweep may abort and retry a job it sees in
        # the active list before the worker has marked it active.
        nonlocal ended
        job = ctx["job"]
        if job.status == Status.COMPLETE:
            done.add(job.key)
            if len(done) == n and not all_done.is_set():
                ended = time.perf_counter()
                all_done.set()

    worker = Worker(queue, functions=[noop], concurrency=concurrency, after_process=after_process)
    redis = queue.redis
    redis0, cpu0, t0 = await redis_cpu_seconds(redis), cpu_seconds(), time.perf_counter()
    running = asyncio.create_task(worker.start())
    await all_done.wait()
    worker_s = cpu_seconds() - cpu0
    redis_s = await redis_cpu_seconds(redis) - redis0
    wall_s = ended - t0
    await worker.stop()
    running.cancel()
    left = await queue.count("incomplete")
    failed = queue.failed
    await queue.disconnect()
    return {
        "anchor": "saq",
        "versions": versions("saq", "redis", "hiredis"),
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
