"""The sender of `scripts/bench_fleet`, loaded by the worker as
`SENDER=scripts.bench.fleet_probe:ClockSender`.

A zero-latency provider: it accepts every part at once and answers with a new message id (so
the worker records the part as it does in production). Each send is kept in memory as one row
`send_ms oldest_received_ms messages` and written when the worker exits, to
`$BENCH_OUT/sends-<pid>.tsv`: `received_ms` is the receiver's clock when the webhook arrived,
so a row spans the whole path, webhook in to reply sent, on one machine's clock.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path
from typing import Any

import orjson

_rows: list[tuple[float, int, int]] = []


def received_ms(event: dict[str, Any]) -> int:
    """The event's `received_ms`, or `ts` * 1000 + `rd` where the claim stored it so
    (shared/events.py `received_ms`; spelled here: the probe runs with any revision's code)."""
    if "received_ms" not in event and "rd" in event:
        return int(event.get("ts") or 0) * 1000 + int(event["rd"])
    return int(event.get("received_ms", 0))


def _dump() -> None:
    out = os.environ.get("BENCH_OUT")
    if out:
        with (Path(out) / f"sends-{os.getpid()}.tsv").open("w") as f:
            f.writelines(f"{s:.1f}\t{r}\t{n}\n" for s, r, n in _rows)


class ClockSender:
    def __init__(self, settings: Any = None) -> None:
        self._prefix = f"wamid.FLEET{os.getpid()}x"
        self._sent = 0
        atexit.register(_dump)

    async def send(self, batch: Any, text: str, part: int = 0) -> str:
        events = orjson.loads(batch.messages_json)
        received = min(received_ms(e) for e in events) if events else 0
        _rows.append((time.time() * 1000, received, len(events)))
        self._sent += 1
        return f"{self._prefix}{self._sent}"
