"""The load generator behind `scripts/simulate --rate R --duration S`.

R messages per second for S seconds, as bursts of 2-4 lines with human gaps (0.3-1.5 s), each
burst from a person who has not written before in this run (so every burst should become its
own turn), spread over the simulated tenants; one delivery in twenty arrives twice. At most
`MAX_IN_FLIGHT` POSTs are outstanding: a slow receiver slows the generator instead of piling
up requests. One progress line a second, then the summary, and a wait (at most `--timeout` s)
until the fleet has finished a turn per burst. Exit 0 only if every delivery got a 200 and
every burst's turn finished.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import httpx
from redis.exceptions import RedisError

from scripts.traffic import (
    TENANT_IDS,
    TENANTS,
    Person,
    Tally,
    fleet_counters,
    post_webhook,
    summary_line,
    webhook_body,
)
from shared.keys import Keys

MAX_IN_FLIGHT = 64
BURST_LINES = (2, 4)
GAP_S = (0.3, 1.5)
DUPLICATE_EVERY = 20
LINES = ("hola", "una consulta", "¿tienen turno el sábado?", "a la tarde", "gracias!")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LoadGenerator:
    def __init__(
        self,
        http: httpx.AsyncClient,
        redis: Any,
        *,
        url: str,
        secret: str,
        key_prefix: str,
        rate: float,
        duration_s: float,
        timeout_s: float,
        seed: int | None,
        say: Callable[[str], None],
    ) -> None:
        self.http, self.redis = http, redis
        self.url, self.secret = url, secret
        self.keys = Keys(key_prefix)
        self.rate, self.duration_s, self.timeout_s = rate, duration_s, timeout_s
        self.rng = random.Random(seed)
        self.say = say
        self.tally = Tally()
        self.in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.bursts = 0
        self.run_tag = self.rng.randrange(100, 1000)  # people of this run: fresh ids
        self.counters_before: dict[str, int] = {}

    async def run(self) -> int:
        try:
            self.counters_before = await fleet_counters(self.redis, self.keys, TENANT_IDS)
        except RedisError as exc:
            self.say(f"cannot read the tenants' counters in Redis: {exc}")
            return 2
        self.say(
            f"load: {self.rate:g} messages/s for {self.duration_s:g}s to {self.url}, "
            f"bursts of {BURST_LINES[0]}-{BURST_LINES[1]} lines from fresh people"
        )
        progress = asyncio.create_task(self.report_progress())
        try:
            await self.send_for(self.duration_s)
        finally:
            progress.cancel()
        finished = await self.wait_for_turns()
        after = await fleet_counters(self.redis, self.keys, TENANT_IDS)
        self.say(summary_line(self.tally, self.counters_before, after, self.bursts))
        lat = self.tally.latencies_s
        self.say(
            f"POST latency p50 {percentile(lat, 0.5) * 1000:.1f} ms, "
            f"p99 {percentile(lat, 0.99) * 1000:.1f} ms, max {max(lat, default=0) * 1000:.1f} ms"
        )
        if self.tally.failed or not finished:
            turns = after["turns"] - self.counters_before["turns"]
            self.say(
                f"FAILED: {self.tally.failed} deliveries failed; "
                f"{turns} turns finished for {self.bursts} bursts"
            )
            return 1
        self.say(f"every one of the {self.bursts} bursts became a finished turn")
        return 0

    async def send_for(self, duration_s: float) -> None:
        """Start bursts at the pace that makes `rate` messages per second on average."""
        mean_lines = sum(BURST_LINES) / 2
        started = time.monotonic()
        next_at = started
        tasks: set[asyncio.Task[None]] = set()
        while time.monotonic() - started < duration_s:
            lines = self.rng.randint(*BURST_LINES)
            task = asyncio.create_task(self.send_burst(self.bursts, lines))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            self.bursts += 1
            next_at += self.rng.expovariate(self.rate / mean_lines)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        if tasks:
            await asyncio.gather(*tasks)

    async def send_burst(self, number: int, lines: int) -> None:
        tenant = TENANTS[number % len(TENANTS)]
        person = Person(f"54{self.run_tag}{number:08d}", f"Load {number}")
        for i in range(lines):
            if i:
                await asyncio.sleep(self.rng.uniform(*GAP_S))
            message_id = f"wamid.LOAD{self.run_tag}{number:08d}{i}"
            body = webhook_body(tenant, person, message_id, self.rng.choice(LINES))
            self.tally.messages += 1
            await self.post(body)
            if self.rng.randrange(DUPLICATE_EVERY) == 0:
                self.tally.duplicates_sent += 1
                await self.post(body)

    async def post(self, body: bytes) -> None:
        async with self.in_flight:
            detail = await post_webhook(self.http, self.url, self.secret, body, self.tally)
        if detail is not None and self.tally.failed <= 5:
            self.say(f"delivery failed: {detail}")

    async def report_progress(self) -> None:
        started = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            lat = self.tally.latencies_s[-1000:]
            try:
                now = await fleet_counters(self.redis, self.keys, TENANT_IDS)
                fleet = (
                    f"Redis: {now['messages'] - self.counters_before['messages']} in, "
                    f"{now['turns'] - self.counters_before['turns']} turns"
                )
            except RedisError as exc:
                fleet = f"Redis: {exc}"
            self.say(
                f"{time.monotonic() - started:4.0f}s  sent {self.tally.messages} "
                f"(+{self.tally.duplicates_sent} dup), stored {self.tally.stored}, "
                f"dropped {self.tally.dropped}, failed {self.tally.failed}, "
                f"POST p99 {percentile(lat, 0.99) * 1000:.1f} ms; {fleet}"
            )

    async def wait_for_turns(self) -> bool:
        """Until the fleet finished a turn per burst (each burst is its own person)."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            now = await fleet_counters(self.redis, self.keys, TENANT_IDS)
            if now["turns"] - self.counters_before["turns"] >= self.bursts:
                return True
            await asyncio.sleep(0.5)
        return False
