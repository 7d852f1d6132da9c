"""Reading Chatwoot's webhook fields: its numeric ids, its times, labels for what was ignored.

Shared by the message (receiver/providers/chatwoot.py) and conversation
(receiver/providers/chatwoot_conversations.py) parsers. No I/O.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from receiver.providers.parsing import Invalid

MAX_TS = 2**53


def chatwoot_id(value: Any, problem: str) -> str:
    """Chatwoot's numeric ids (an int, or a string of digits) as a string; Invalid(problem)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TS:
        return str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 16:
        return str(int(value))
    raise Invalid(problem)


def timestamp(value: Any, received_ms: int) -> int:
    """Unix seconds of a time (ISO 8601 or a number); the receive time when unusable."""
    ts: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        ts = value
    elif isinstance(value, str):
        try:
            ts = float(value)
        except ValueError:
            try:
                ts = datetime.fromisoformat(value).timestamp()
            except (ValueError, OverflowError, OSError):  # not a date, or out of range
                ts = None
    if ts is None or not math.isfinite(ts) or not 0 <= ts < MAX_TS:
        return received_ms // 1000
    return int(ts)


def field(obj: Any, key: str) -> Any:
    """`obj[key]` when obj is an object, else None."""
    return obj.get(key) if isinstance(obj, dict) else None


def label(value: Any) -> str:
    """A value named in an ignored-item reason: a string cut short, else its type."""
    if isinstance(value, str):
        return value[:40]
    return type(value).__name__ if value is not None else "missing"
