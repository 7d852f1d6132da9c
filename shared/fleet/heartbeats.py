"""Worker heartbeats: each worker's entry in `wa:workers`, and which workers are alive.

Every worker writes its entry every `HEARTBEAT_INTERVAL_S` (worker/fleet/heartbeat_loop.py): JSON
with `started_ms` and `seen_ms` (Redis's clock, `TIME`), `interval_ms` (its own interval),
`running` (turns running now), `concurrency`, `host` and `pid`. An entry not refreshed for
`DEAD_AFTER_INTERVALS` of its own intervals belongs to a dead worker (SIGKILLed, its machine
gone): readers leave it out and the live workers delete it. A worker that stops cleanly
deletes its own entry. `python -m worker.inspect` and `/metrics` read them here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

DEAD_AFTER_INTERVALS = 3


@dataclass(frozen=True)
class Beat:
    worker: str
    started_ms: int
    seen_ms: int
    interval_ms: int
    running: int
    concurrency: int
    host: str
    pid: int

    def alive(self, now_ms: int) -> bool:
        return now_ms - self.seen_ms <= DEAD_AFTER_INTERVALS * self.interval_ms

    def to_json(self) -> bytes:
        fields = asdict(self)
        del fields["worker"]  # the hash field
        return orjson.dumps(fields)

    @classmethod
    def parse(cls, worker: bytes | str, raw: bytes | str) -> Beat | None:
        """The entry of `worker`, or None if it cannot be read (it is then pruned as dead)."""
        try:
            fields = orjson.loads(raw)
            return cls(
                worker=_text(worker),
                started_ms=int(fields["started_ms"]),
                seen_ms=int(fields["seen_ms"]),
                interval_ms=int(fields["interval_ms"]),
                running=int(fields["running"]),
                concurrency=int(fields["concurrency"]),
                host=str(fields["host"]),
                pid=int(fields["pid"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Workers:
    """What `wa:workers` holds now: the live workers (oldest first) and the dead entries."""

    now_ms: int  # Redis's clock
    live: list[Beat]
    dead: list[str]  # worker ids of stale or unreadable entries

    @property
    def running(self) -> int:
        return sum(b.running for b in self.live)

    @property
    def slots(self) -> int:
        return sum(b.concurrency for b in self.live)


async def redis_now_ms(redis: Any) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def read(redis: Any, key: str) -> Workers:
    """The live and the dead workers of the heartbeat hash `key` (Keys.workers)."""
    now = await redis_now_ms(redis)
    live, dead = [], []
    for worker, raw in (await redis.hgetall(key)).items():
        beat = Beat.parse(worker, raw)
        if beat is not None and beat.alive(now):
            live.append(beat)
        else:
            dead.append(_text(worker))
    live.sort(key=lambda b: (b.started_ms, b.worker))
    return Workers(now, live, sorted(dead))


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
