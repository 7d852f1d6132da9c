"""What review retention adds to the fleet's sweep: `python -m scripts.bench.retention`.

Starts a private Redis, registers `--tenants` tenants (each with a stats hash, like idle
tenants, and a review hash of `--items` young items: the worst case, every tenant has a
review list), then times one sweep's probe (worker/fleet/sweep.py, what every sweep does) and one
sweep's retention pass (worker/fleet/retention.py) over `--sweeps` consecutive sweeps one
`--interval` apart, and counts the commands each sends. Prints one line per part.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer
from shared.keys import Keys
from worker.fleet.retention import ReviewRetention
from worker.fleet.sweep import Sweep


async def _commands(redis: Redis) -> int:
    info: dict[str, Any] = await redis.info("commandstats")
    return sum(int(row["calls"]) for name, row in info.items() if name != "cmdstat_info")


async def _fill(redis: Redis, keys: Keys, tenants: list[str], items: int) -> None:
    now_ms = int(time.time() * 1000)
    pipe = redis.pipeline(transaction=False)
    for n, tenant in enumerate(tenants):
        k = keys.tenant(tenant)
        pipe.sadd(keys.tenants, tenant)
        pipe.hset(k.stats, "messages", 1)
        for i in range(items):
            item = {"id": f"{now_ms}-{i}", "person": "5491100000000", "reviewed_ms": now_ms}
            pipe.hset(k.review, f"{now_ms}-{i}", orjson.dumps({**item, "messages": []}))
        if n % 500 == 499:
            await pipe.execute()
    await pipe.execute()


async def _measure(args: argparse.Namespace, url: str) -> None:
    redis = Redis.from_url(url)
    keys = Keys("bench")
    tenants = [f"1065{i:011d}" for i in range(args.tenants)]
    await _fill(redis, keys, tenants, args.items)
    sweep = Sweep(redis, keys, "bench", args.interval, 30)
    retention = ReviewRetention(redis, keys, 30 * 86400, args.interval, 30)

    async def probe() -> None:
        await sweep.needing_a_look(await sweep.live(await sweep.registered()))

    start = time.time()
    for name, part in (
        ("probe", lambda i: probe()),
        ("retention", lambda i: retention.prune(tenants, start + i * args.interval)),
    ):
        before, cpu, wall = await _commands(redis), time.process_time(), time.perf_counter()
        for i in range(args.sweeps):
            await part(i)
        took = (time.perf_counter() - wall) / args.sweeps * 1000
        used = (time.process_time() - cpu) / args.sweeps * 1000
        sent = (await _commands(redis) - before) / args.sweeps
        print(
            f"{name:9}  {args.tenants} tenants, {args.items} review items each: "
            f"{took:.2f} ms wall, {used:.2f} ms worker CPU, {sent:.1f} commands per sweep"
        )
    await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=20_000)
    parser.add_argument("--items", type=int, default=5)
    parser.add_argument("--sweeps", type=int, default=60)
    parser.add_argument("--interval", type=float, default=1.0, help="POLL_INTERVAL_S")
    args = parser.parse_args()
    server = RedisServer()
    server.start()
    try:
        asyncio.run(_measure(args, server.url))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
