"""A batch: one person's burst of messages, handed to the brain as one turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(frozen=True)
class Message:
    """One inbound message of the burst, as the receiver stored it."""

    id: str
    type: str
    text: str
    ts: int
    name: str = ""
    context: str = ""
    raw: Any = None

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Message:
        return cls(
            id=str(event.get("id", "")),
            type=str(event.get("type", "text")),
            text=str(event.get("text", "")),
            ts=int(event.get("ts") or 0),
            name=str(event.get("name", "")),
            context=str(event.get("context", "")),
            raw=event.get("raw"),
        )


@dataclass
class Batch:
    """A claimed batch. `token` proves this worker holds the person's lock."""

    tenant: str
    person: str
    id: str
    token: str
    attempt: int
    claimed_ms: int
    due_ms: int
    requeued: bool
    messages: list[Message]
    messages_json: bytes = b"[]"
    fields: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_claim(cls, tenant: str, row: list[Any]) -> Batch:
        """Build from one `{person, token, field, value, ...}` row of claim.lua."""
        person, token = _s(row[0]), _s(row[1])
        flat = [_s(x) for x in row[2:]]
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        raw_messages = fields.pop("messages", "[]")
        events = orjson.loads(raw_messages)
        return cls(
            tenant=tenant,
            person=person,
            id=fields.get("id", ""),
            token=token,
            attempt=int(fields.get("attempt", 0)),
            claimed_ms=int(fields.get("claimed_ms", 0)),
            due_ms=int(float(fields.get("due_ms", 0))),
            requeued=fields.get("requeued") == "1",
            messages=[Message.from_event(e) for e in events],
            messages_json=raw_messages.encode(),
            fields=fields,
        )

    @property
    def oldest_ts(self) -> int:
        """Provider timestamp (unix seconds) of the oldest message; 0 if unknown."""
        stamps = [m.ts for m in self.messages if m.ts]
        return min(stamps) if stamps else 0

    @property
    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
