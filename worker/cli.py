"""What the command-line tools (review, takeover, manual_reply, forget) share: read the
settings, run against Redis, and turn the two failures every one of them can meet into one line
and an exit code: a bad setting (2) and a Redis that cannot be reached (1)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from shared.settings import ConfigError, Settings
from shared.storage.redis_client import explain


def run(command: Callable[[Settings], Coroutine[Any, Any, int]]) -> int:
    """`command(settings)`'s exit code; 2 with `configuration error: ...` on stderr for a bad
    setting, 1 with `error: cannot reach Redis at ...` when Redis fails."""
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(command(settings))
    except (RedisError, OSError) as exc:
        url = settings.masked()["redis_url"]
        print(f"error: cannot reach Redis at {url}: {explain(exc)}", file=sys.stderr)
        return 1
