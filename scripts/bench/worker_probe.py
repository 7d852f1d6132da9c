"""Brains and senders for `scripts/bench_worker`, loaded by the worker as BRAIN/SENDER.

The worker subprocess imports this module with `BRAIN=scripts.bench.worker_probe:TimingBrain`
(the benchmark puts this checkout on its PYTHONPATH). Each turn's start is recorded in memory as
one row `start_ms due_ms claimed_ms first_received_ms size`, and the rows are written once, when
the worker process exits, to `$BENCH_OUT/turns-<pid>.tsv`, so recording costs a list append.

`start_ms` is time.time() at the start of `reply()`: the worker calls the brain first thing in a
turn, so this is the turn start. `due_ms` / `claimed_ms` come from Redis's clock (TIME in
claim.lua); Redis and the worker run on the same machine, so both clocks are the same clock.

Environment:
    BENCH_OUT        directory for the rows (required)
    BENCH_BRAIN_S    seconds the brain sleeps (default 0: zero-latency brain)
    BENCH_E2E        "1": also decode the batch's events to record the oldest received_ms
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from pathlib import Path
from typing import Any

import orjson

_rows: list[tuple[float, int, int, int, int]] = []
_registered = False


def received_ms(event: dict[str, Any]) -> int:
    """The event's `received_ms`, or `ts` * 1000 + `rd` where the claim stored it so
    (shared/events.py `received_ms`; spelled here: the probe runs with any revision's code)."""
    if "received_ms" not in event and "rd" in event:
        return int(event.get("ts") or 0) * 1000 + int(event["rd"])
    return int(event.get("received_ms", 0))


def _dump() -> None:
    out = os.environ.get("BENCH_OUT")
    if not out:
        return
    path = Path(out) / f"turns-{os.getpid()}.tsv"
    with path.open("w") as f:
        for row in _rows:
            f.write("\t".join(str(x) for x in row) + "\n")


def _register() -> None:
    global _registered
    if not _registered:
        atexit.register(_dump)
        _registered = True


class TimingBrain:
    """Records the turn start, then answers at once (or after BENCH_BRAIN_S seconds)."""

    def __init__(self, settings: Any = None) -> None:
        self._sleep = float(os.environ.get("BENCH_BRAIN_S", "0") or 0)
        self._e2e = os.environ.get("BENCH_E2E") == "1"
        _register()

    async def reply(self, batch: Any) -> str:
        start_ms = time.time() * 1000
        received = 0
        if self._e2e:
            events = orjson.loads(batch.messages_json)
            received = min(received_ms(e) for e in events) if events else 0
        _rows.append((start_ms, batch.due_ms, batch.claimed_ms, received, len(batch.messages)))
        if self._sleep > 0:
            await asyncio.sleep(self._sleep)
        return "ok"


class NullSender:
    """The zero-latency sender: accepts every part at once and, like the provider, answers
    with a new message id (so the worker records the part as it would in production)."""

    def __init__(self, settings: Any = None) -> None:
        self.sent = 0
        self._prefix = f"wamid.BENCH{os.getpid()}x"

    async def send(self, batch: Any, text: str, part: int = 0) -> str:
        self.sent += 1
        return f"{self._prefix}{self.sent}"
