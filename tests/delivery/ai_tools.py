"""Plugin tools for `AI_TOOLS=tests.delivery.ai_tools:tools`, a factory taking the settings.

- `check_calendar(day)`: answers "<day>: 16:00 libre"; records its input, the batch and who
  holds the person's lock while it runs.
- `broken_lookup()`: raises RuntimeError (the model must get it as an error result).
- `slow_lookup(seconds)`: sleeps that long, recording when it starts and whether it ended.

Records go to the Redis list `test:<prefix>:ai_tools` as JSON, with the worker's pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from shared.conversation.batch import Batch
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.redis_client import make_redis
from worker.brains.tools import Tool, ToolAnswer

CALENDAR_ANSWER = "16:00 libre"


def record_key(prefix: str) -> str:
    return f"test:{prefix}:ai_tools"


def tools(settings: Settings) -> list[Tool]:
    redis = make_redis(settings)
    keys = Keys(settings.key_prefix)

    async def record(event: str, batch: Batch, **extra: Any) -> None:
        entry = {"event": event, "pid": os.getpid(), "ms": int(time.time() * 1000), **extra}
        entry.update(batch=batch.id, token=batch.token)
        await redis.rpush(record_key(settings.key_prefix), json.dumps(entry))

    async def check_calendar(batch: Batch, args: dict[str, Any]) -> ToolAnswer:
        holder = await redis.get(keys.tenant(batch.tenant).lock(batch.person))
        await record("calendar", batch, input=args, holder=holder.decode() if holder else None)
        return f"{args.get('day')}: {CALENDAR_ANSWER}"

    async def broken_lookup(batch: Batch, args: dict[str, Any]) -> ToolAnswer:
        await record("broken", batch, input=args)
        raise RuntimeError("the lookup service is down")

    async def slow_lookup(batch: Batch, args: dict[str, Any]) -> ToolAnswer:
        await record("slow_start", batch, input=args)
        await asyncio.sleep(float(args.get("seconds", 30)))
        await record("slow_end", batch)
        return "found it"

    day = {"type": "object", "properties": {"day": {"type": "string"}}, "required": ["day"]}
    return [
        Tool("check_calendar", "Free appointment slots of a day.", day, check_calendar),
        Tool("broken_lookup", "Looks something up.", {"type": "object"}, broken_lookup),
        Tool("slow_lookup", "Looks something up, slowly.", {"type": "object"}, slow_lookup),
    ]


# For the loading tests (tests/delivery/test_ai_tool_loading.py).
async def _nothing(batch: Batch, args: dict[str, Any]) -> ToolAnswer:
    return ""


NOT_A_TOOL = 42
ONE_TOOL = Tool("one", "One tool.", {"type": "object"}, _nothing)
SAME_NAME_TWICE = [ONE_TOOL, ONE_TOOL]
