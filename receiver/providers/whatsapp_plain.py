"""WhatsApp message fields read the same way by every path of the parser, and the plain text
shortcut of its one-item fast path (receiver/providers/whatsapp.py). No I/O."""

from __future__ import annotations

import math
from typing import Any

from shared.events import EVENT_VERSION
from shared.ids import is_person_id

MAX_TS = 2**53  # keeps the timestamp a JSON-safe integer


def timestamp(value: Any, received_ms: int) -> int:
    """Provider unix seconds (Meta sends a string); the receive time when absent or absurd."""
    try:
        if isinstance(value, str):
            ts = int(value)
        elif isinstance(value, float) and math.isfinite(value):
            ts = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            ts = value
        else:
            raise ValueError
    except ValueError:
        return received_ms // 1000
    return ts if 0 <= ts < MAX_TS else received_ms // 1000


def plain_text_event(
    message: dict[str, Any], contact: dict[str, Any], message_id: str, received_ms: int
) -> dict[str, Any] | None:
    """The event of a plain text message, built at once; None to take `_lone_message`'s way.

    Nearly all traffic is a text with nothing but `from`, `id`, `timestamp`, `type` and
    `text: {body}` (the caller checked there are five keys, `id` and `type`). For such a
    message `message_event` keeps no `raw` (`_slim` drops all five) and its kind is
    "message", so the event is a literal here: the kwargs call, the copy `_slim` makes and
    takes apart, and the classification cost about a third of a request's parse
    (docs/benchmarks/receiver.md). Anything else (a timestamp `str(ts)` would not give back,
    a body with more than `body`, no `from`) goes the general way, which keeps it in `raw`.
    tests/receiver/test_fast_path.py holds the two to the same events, key order included.
    """
    person = message.get("from")
    body = message.get("text")
    stamp = message.get("timestamp")
    if type(person) is not str or not person or not is_person_id(person):
        return None
    if type(body) is not dict or len(body) != 1 or type(stamp) is not str:
        return None
    text = body.get("body")
    if type(text) is not str:
        return None
    try:
        ts = int(stamp)
    except ValueError:
        return None
    if not 0 <= ts < MAX_TS or str(ts) != stamp:
        return None
    event = {
        "v": EVENT_VERSION,
        "kind": "message",
        "person": person,
        "id": message_id,
        "text": text,  # a text's type is implied (shared/events.py `message_event`)
        "ts": ts,
        "rd": received_ms - ts * 1000,
    }
    profile = contact.get("profile")
    if type(profile) is dict and (
        contact.get("wa_id") == person or contact.get("user_id") == person
    ):
        name = profile.get("name")
        if type(name) is str and name:
            event["name"] = name
    return event
