"""The fleet's pause of AI calls as Redis holds it (`wa:ai:paused`): written by the workers'
gate (worker/brains/ai_pause.py), read there and by the ops page."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import orjson

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pause:
    """The value of the pause key."""

    until_ms: int
    level: int
    since_ms: int
    why: str
    by: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def parse(cls, raw: Any) -> Pause | None:
        """The pause a key holds; None for none, or for a value this release cannot read."""
        if raw is None:
            return None
        try:
            data = orjson.loads(raw)
            return cls(
                until_ms=int(data["until_ms"]),
                level=max(1, int(data.get("level", 1))),
                since_ms=int(data.get("since_ms", data["until_ms"])),
                why=str(data.get("why", "")),
                by=str(data.get("by", "")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("unreadable AI pause %r: ignored", raw)
            return None
