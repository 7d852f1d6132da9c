"""Test senders, loaded by worker processes through `SENDER=tests.worker.senders:<name>`.

Plain objects, as a user's own sender may be: neither subclasses `shared.senders.base.Sender`
nor has any of its optional methods, so the worker adapts them where it loads them. Each part
they are given is recorded as JSON (RPUSH) on `sent_key(prefix)`, with the kind of `delivery`
it came with ("" when none).
"""

from __future__ import annotations

import json
from typing import Any

from shared.conversation.batch import Batch
from shared.settings import Settings
from shared.storage.redis_client import make_redis


def sent_key(prefix: str) -> str:
    """Where the test senders record; outside `<prefix>:*` so keyspace scans ignore it."""
    return f"test:{prefix}:sent"


class _Recorder:
    def __init__(self, settings: Settings) -> None:
        self._redis = make_redis(settings)
        self._key = sent_key(settings.key_prefix)

    async def record(self, batch: Batch, text: str, part: int, delivery: Any) -> str:
        """Record the part; the "provider id" the worker stores for it."""
        kind = type(delivery).__name__ if delivery is not None else ""
        entry = {"batch": batch.id, "text": text, "part": part, "delivery": kind}
        await self._redis.rpush(self._key, json.dumps(entry))
        return f"custom.{batch.id}.{part}"


class PlainSender:
    """Only `send`, which takes the turn's `delivery`."""

    def __init__(self, settings: Settings) -> None:
        self._recorder = _Recorder(settings)

    async def send(self, batch: Batch, text: str, part: int, *, delivery: Any = None) -> str:
        return await self._recorder.record(batch, text, part, delivery)


class LegacySender:
    """Only `send`, written before senders were given the turn's `delivery`."""

    def __init__(self, settings: Settings) -> None:
        self._recorder = _Recorder(settings)

    async def send(self, batch: Batch, text: str, part: int) -> str:
        return await self._recorder.record(batch, text, part, None)
