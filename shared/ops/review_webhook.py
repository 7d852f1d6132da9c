"""The review webhook's event and signature: what a team's receiver gets for each new review
item, and how it checks that the event is ours (docs/operating.md#being-told).

    POST <REVIEW_WEBHOOK_URL>
    Content-Type: application/json
    X-Review-Timestamp: 1764636000
    X-Review-Signature: sha256=<hex HMAC-SHA256(REVIEW_WEBHOOK_SECRET, "1764636000.<raw body>")>

    {"id": "<tenant>:<item id>", "type": "review_item.created", "tenant": "...",
     "item": {"id", "person", "reason", "error", "attempts", "reviewed_ms", "messages",
              "preview"}, "at_ms": <when the item was created, Redis clock>}

The signature covers the timestamp and the raw bytes, as Chatwoot's webhooks do: a receiver
recomputes it over the body exactly as received, compares in constant time, and refuses a
timestamp too far from its clock (a replay). `id` is the same on every delivery of one item
(deliveries are at least once): a receiver drops an id it has seen. This module is the
product's only writer of both; `verify` is what a receiver written in Python can use as is.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import orjson

EVENT_TYPE = "review_item.created"
SIGNATURE_HEADER = "X-Review-Signature"
TIMESTAMP_HEADER = "X-Review-Timestamp"
# The first message's text in the event, at most this many characters (the item's messages
# stay in Redis: the event says there is something to look at, the page shows it).
PREVIEW_CHARS = 200
# How far a receiver's clock and the event's timestamp may be apart (`verify`).
TOLERANCE_S = 300


def event_id(tenant: str, item_id: str) -> str:
    """One review item, one event id, whatever the number of deliveries."""
    return f"{tenant}:{item_id}"


def event(tenant: str, item: dict[str, Any], created_ms: int) -> dict[str, Any]:
    """The event of review item `item` (as stored on the review list) of `tenant`."""
    messages = item.get("messages")
    messages = messages if isinstance(messages, list) else []
    item_id = str(item.get("id", ""))
    return {
        "id": event_id(tenant, item_id),
        "type": EVENT_TYPE,
        "tenant": tenant,
        "item": {
            "id": item_id,
            "person": item.get("person", ""),
            "reason": item.get("reason", ""),
            "error": item.get("error", ""),
            "attempts": item.get("attempts", 0),
            "reviewed_ms": item.get("reviewed_ms"),
            "messages": len(messages),
            "preview": _preview(messages),
        },
        "at_ms": created_ms,
    }


def _preview(messages: list[Any]) -> str:
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("text"), str):
            return str(message["text"])[:PREVIEW_CHARS]
    return ""


def body_of(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` of HMAC-SHA256(secret, "<timestamp>.<body>")."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def headers(secret: str, timestamp_s: int, body: bytes) -> dict[str, str]:
    """The headers of one delivery (the timestamp is the moment of sending, in seconds)."""
    stamp = str(timestamp_s)
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: stamp,
        SIGNATURE_HEADER: signature(secret, stamp, body),
    }


def verify(
    secret: str,
    timestamp: str,
    body: bytes,
    given: str,
    now_s: float,
    tolerance_s: float = TOLERANCE_S,
) -> bool:
    """What a receiver checks: the signature over the raw body, and a fresh timestamp."""
    try:
        fresh = abs(now_s - int(timestamp)) <= tolerance_s
    except ValueError:
        return False
    return fresh and hmac.compare_digest(signature(secret, timestamp, body), given)
