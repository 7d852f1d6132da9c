"""The inbox event: what the receiver stores and the worker reads (versioned JSON, orjson).

An event keeps everything the worker needs without the provider's original body. The first
three fields are always `v`, `kind` and `person`, in that order: the claim script routes events
by matching that prefix instead of decoding the whole JSON (it falls back to decoding).

Message event (kind "message"):
    v, kind, person, tenant, channel, id, type, text, ts (provider unix seconds),
    received_ms (receiver clock), name (profile name or ""), context (quoted id or ""), raw
Status event (kind "status"):
    v, kind, person (recipient), tenant, channel, id (our outbound id), status, ts,
    received_ms, errors (list), raw
"""

from __future__ import annotations

from typing import Any

import orjson

EVENT_VERSION = 1


class EventError(ValueError):
    """Bytes that are not an inbox event of a version this code understands."""


def message_event(
    *,
    channel: str,
    tenant: str,
    person: str,
    message_id: str,
    type: str,
    text: str,
    ts: int,
    received_ms: int,
    raw: Any,
    name: str = "",
    context: str = "",
) -> dict[str, Any]:
    return {
        "v": EVENT_VERSION,
        "kind": "message",
        "person": person,
        "tenant": tenant,
        "channel": channel,
        "id": message_id,
        "type": type,
        "text": text,
        "ts": ts,
        "received_ms": received_ms,
        "name": name,
        "context": context,
        "raw": raw,
    }


def status_event(
    *,
    channel: str,
    tenant: str,
    person: str,
    message_id: str,
    status: str,
    ts: int,
    received_ms: int,
    raw: Any,
    errors: list[Any] | None = None,
) -> dict[str, Any]:
    return {
        "v": EVENT_VERSION,
        "kind": "status",
        "person": person,
        "tenant": tenant,
        "channel": channel,
        "id": message_id,
        "status": status,
        "ts": ts,
        "received_ms": received_ms,
        "errors": errors or [],
        "raw": raw,
    }


def dedupe_id(event: dict[str, Any]) -> str:
    """What makes two deliveries the same item: channel + provider id (+ status for receipts)."""
    if event["kind"] == "status":
        return f"{event['channel']}:{event['id']}:{event['status']}"
    return f"{event['channel']}:{event['id']}"


def encode(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event)


def decode(data: bytes | str) -> dict[str, Any]:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EventError(f"not JSON: {exc}") from None
    if not isinstance(event, dict) or event.get("v") != EVENT_VERSION:
        raise EventError(f"not a version {EVENT_VERSION} event")
    return event
