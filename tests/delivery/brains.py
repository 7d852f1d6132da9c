"""A custom brain for `BRAIN=tests.delivery.brains:ToolBrain`: Claude with one tool.

The model (the Messages API stand-in, through the real SDK) asks for `check_calendar`; the brain
runs the tool, a slow lookup whose duration the model's input sets (`seconds`), then asks again
with the result and returns the final text. While the tool runs it samples the person's lock
(holder and remaining lease) every 0.1 s. Everything goes to the Redis list
`test:<prefix>:tool` as JSON records: `start`, `tool` samples, `end`, with pid and wall clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import anthropic

from shared.conversation.batch import Batch
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.redis_client import make_redis

CALENDAR_TOOL = {
    "name": "check_calendar",
    "description": "Free appointment slots of a day.",
    "input_schema": {"type": "object", "properties": {"day": {"type": "string"}}},
}


def record_key(prefix: str) -> str:
    return f"test:{prefix}:tool"


class ToolBrain:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._keys = Keys(settings.key_prefix)
        self._client = anthropic.AsyncAnthropic(api_key=settings.anthropic_api_key, max_retries=0)
        self._redis = make_redis(settings)
        self._records = record_key(settings.key_prefix)

    async def reply(self, batch: Batch) -> str | None:
        await self._record("start", batch)
        messages: list[dict[str, Any]] = [{"role": "user", "content": batch.user_text}]
        answer = await self._ask(messages)
        while answer.stop_reason == "tool_use":
            results = []
            for block in answer.content:
                if block.type == "tool_use":
                    found = await self._check_calendar(batch, dict(block.input))
                    results.append(
                        {"type": "tool_result", "tool_use_id": block.id, "content": found}
                    )
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in answer.content]}
            )
            messages.append({"role": "user", "content": results})
            answer = await self._ask(messages)
        await self._record("end", batch)
        return "".join(b.text for b in answer.content if b.type == "text") or None

    async def _ask(self, messages: list[dict[str, Any]]) -> Any:
        return await self._client.messages.create(
            model=self._settings.ai_model,
            max_tokens=self._settings.ai_max_tokens,
            tools=[CALENDAR_TOOL],
            messages=messages,
        )

    async def _check_calendar(self, batch: Batch, args: dict[str, Any]) -> str:
        lock = self._keys.tenant(batch.tenant).lock(batch.person)
        deadline = time.monotonic() + float(args.get("seconds", 1))
        while time.monotonic() < deadline:
            holder = await self._redis.get(lock)
            pttl = await self._redis.pttl(lock)
            await self._record("tool", batch, holder=holder.decode() if holder else None, pttl=pttl)
            await asyncio.sleep(0.1)
        return f"{args.get('day', 'sábado')}: 16:00 libre"

    async def _record(self, event: str, batch: Batch, **extra: Any) -> None:
        record = {
            "event": event,
            "ms": int(time.time() * 1000),
            "pid": os.getpid(),
            "batch": batch.id,
            "token": batch.token,
            "texts": batch.texts,
            **extra,
        }
        await self._redis.rpush(self._records, json.dumps(record))
