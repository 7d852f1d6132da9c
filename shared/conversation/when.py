"""Times as the model reads them: a moment in a tenant's time zone, and how late a reply is.
No I/O (shared/conversation/presentation.py puts them in a batch's header)."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

LATE_START = "Answered: "
# A reply this long after the person's latest message is late enough for the model to know:
# well past a debounce window and a turn, short of REVIEW_AFTER_S (900 s) by default.
LATE_AFTER_S = 300
# English names whatever the process' locale (strftime's %A and %B follow it).
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def late_note(written_s: float, answered_s: float, zone: str) -> str:
    """`Answered: Tuesday 1 December 2026, 22:45 (zone), 3 hours 5 minutes after their last
    message; this reply is late.` when the answer comes `LATE_AFTER_S` or more after the
    message, else "". `answered_s`: the batch's claim, so every render of a batch is the same."""
    late_s = answered_s - written_s
    if late_s < LATE_AFTER_S:
        return ""
    return (
        f"{LATE_START}{local_time(answered_s, zone)}, {_duration(late_s)} after their last"
        " message; this reply is late."
    )


def _duration(seconds: float) -> str:
    """`2 days 3 hours`, `3 hours 5 minutes`, `7 minutes`: the two largest units."""
    minutes = int(seconds // 60)
    parts = [(minutes // 1440, "day"), (minutes // 60 % 24, "hour"), (minutes % 60, "minute")]
    shown = [f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in parts if n]
    return " ".join(shown[:2]) or "less than a minute"


def local_time(unix_s: float, zone: str) -> str:
    """`Tuesday 1 December 2026, 19:40 (America/Argentina/Buenos_Aires)`."""
    return _local_minute(int(unix_s // 60), zone)


@functools.lru_cache(maxsize=4096)
def _local_minute(minute: int, zone: str) -> str:
    # Every batch of a minute in a zone shows the same words: worked out once.
    moment = datetime.fromtimestamp(minute * 60, UTC).astimezone(ZoneInfo(zone))
    day, month = DAYS[moment.weekday()], MONTHS[moment.month - 1]
    return f"{day} {moment.day} {month} {moment.year}, {moment:%H:%M} ({zone})"
