"""Test brains, loaded by worker processes through `BRAIN=tests.worker.brains:<name>`.

`RecordingBrain` writes a JSON record to `test:<prefix>:turns` (RPUSH) when a turn starts and
when it ends (`end`, `error`, `review` or `cancelled`), with the wall clock in ms, the pid, the
batch id, attempt, message ids, types and texts. What it does is steered by words in the
message texts, so each test picks the behaviour per person:

    !fail=N        raise RuntimeError at once while the batch's attempt is below N
    !review=R      raise NeedsReview(R, "the brain wants a human") at once
    !sleep=S       sleep S seconds on every call
    !sleeponce=S   sleep S seconds the first time this batch reaches any brain at this
                   attempt (a turn taken over after a crash or a lost lease then runs fast)
    !jitter=S      sleep a random time up to S seconds
    !silent        return None (no reply)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import time
from typing import Any

from shared.conversation.batch import Batch
from shared.conversation.errors import NeedsReview
from shared.settings import Settings
from shared.storage.redis_client import make_redis
from tests.worker.support import record_key
from worker.brains.prompt import render_context


def directives(batch: Batch) -> dict[str, str]:
    found: dict[str, str] = {}
    for text in batch.texts:
        for word in text.split():
            if word.startswith("!"):
                name, _, value = word[1:].partition("=")
                found[name] = value
    return found


class RecordingBrain:
    def __init__(self, settings: Settings) -> None:
        self._redis = make_redis(settings)
        self._key = record_key(settings.key_prefix)
        self._once = f"test:{settings.key_prefix}:once:"
        self._calls = itertools.count(1)

    async def reply(self, batch: Batch) -> str | None:
        call = f"{os.getpid()}:{next(self._calls)}"
        await self._record("start", call, batch)
        try:
            reply = await self._behave(batch, directives(batch))
        except asyncio.CancelledError:
            await self._record("cancelled", call, batch)
            raise
        except NeedsReview as exc:
            await self._record("review", call, batch, error=str(exc))
            raise
        except Exception as exc:
            await self._record("error", call, batch, error=str(exc))
            raise
        await self._record("end", call, batch)
        return reply

    async def _behave(self, batch: Batch, todo: dict[str, str]) -> str | None:
        if "fail" in todo and batch.attempt < int(todo["fail"]):
            raise RuntimeError(f"boom on attempt {batch.attempt}")
        if "review" in todo:
            raise NeedsReview(todo["review"], "the brain wants a human")
        if "sleep" in todo:
            await asyncio.sleep(float(todo["sleep"]))
        once = f"{self._once}{batch.id}:{batch.attempt}"
        if "sleeponce" in todo and await self._redis.set(once, 1, nx=True, ex=600):
            await asyncio.sleep(float(todo["sleeponce"]))
        if "jitter" in todo:
            await asyncio.sleep(random.uniform(0, float(todo["jitter"])))
        if "silent" in todo:
            return None
        return f"reply to {batch.id}: " + " / ".join(batch.texts)

    async def _record(self, event: str, call: str, batch: Batch, **extra: Any) -> None:
        record = {
            "event": event,
            "call": call,
            "ms": int(time.time() * 1000),
            "pid": os.getpid(),
            "tenant": batch.tenant,
            "person": batch.person,
            "batch": batch.id,
            "attempt": batch.attempt,
            "ids": [m.id for m in batch.messages],
            "types": [m.type for m in batch.messages],
            "texts": batch.texts,
            "context": render_context(batch.context),
            **extra,
        }
        await self._redis.rpush(self._key, json.dumps(record))


class NotABrain:
    """Has no reply(): loading it as BRAIN must fail with a ConfigError."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings


class StaticBrain:
    """A brain given as an object (not a class): used as is."""

    async def reply(self, batch: Batch) -> str | None:
        return "static"


STATIC_BRAIN = StaticBrain()
NOT_CALLABLE = object()


class NoArgsBrain:
    """A class whose constructor takes no settings: not a valid BRAIN factory."""

    def __init__(self) -> None:
        pass
