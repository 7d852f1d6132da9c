"""A batch: one person's burst of messages, handed to the brain as one turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.conversation.human_memory import with_transcript
from shared.events import WHATSAPP, restore_raw

SERVICE_WINDOW_S = 24 * 3600  # WhatsApp's customer-service window


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
    channel: str = "whatsapp"  # the provider it came from (receiver/providers/base.py)

    @classmethod
    def from_event(cls, event: dict[str, Any], person: str = "") -> Message:
        """`person`: whose message it is; a waiting or claimed message does not say (claim.lua
        keeps it without `v`, `kind` and `person`), one the release before stored does."""
        channel = str(event.get("channel") or WHATSAPP)
        return cls(
            channel=channel,
            id=str(event.get("id", "")),
            type=str(event.get("type", "text")),
            text=str(event.get("text", "")),
            ts=int(event.get("ts") or 0),
            name=str(event.get("name", "")),
            context=str(event.get("context", "")),
            # WhatsApp's message object whole: the event keeps only what its fields do not
            # (shared/events.py).
            raw=restore_raw(event, person) if channel == WHATSAPP else event.get("raw"),
        )


@dataclass(frozen=True)
class Batch:
    """A claimed batch, as a brain and a sender read it; frozen, since what a turn changes
    (the reply, the parts sent, the template noted, the review journal) is the turn's own
    state (shared/conversation/turn_state.py). `token` proves this worker holds the person's
    lock."""

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
    # The batch hash as claimed, besides the messages: what earlier attempts recorded (the
    # reply, `part:<i>`, the template note, the review journal) is read from here by
    # `TurnState.resumed`.
    fields: dict[str, str] = field(default_factory=dict)
    # Earlier exchanges with this person, oldest first: [{"user": ..., "assistant": ...}]; what
    # a Chatwoot agent and the customer said while the bot was silent too
    # (shared/conversation/human_memory.py)
    history: list[dict[str, Any]] = field(default_factory=list)
    # Provider ts of the person's latest message (0: unknown, or the window has closed).
    last_inbound_ts: int = 0
    # Events that are not messages since the previous batch, oldest first (shared/lua/claim.lua:
    # `what`, `type`, `text`, `target`, `target_text`, `ts`, `raw`); worker/brains/prompt.py shows
    # them.
    context: list[dict[str, Any]] = field(default_factory=list)
    # The batch's presentations by time zone, computed once (shared/conversation/
    # presentation.py `present`): the brain's prompt and the memory's exchange share one.
    presented: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_claim(cls, tenant: str, row: list[Any]) -> Batch:
        """Build from one `{person, token, field, value, ...}` row of claim.lua."""
        if isinstance(row[0], bytes):  # the worker's clients: bytes, decoded here at once
            flat = [x.decode() if isinstance(x, bytes) else str(x) for x in row]
        else:
            flat = [_s(x) for x in row]
        person, token = flat[0], flat[1]
        fields = dict(zip(flat[2::2], flat[3::2], strict=True))
        messages_json = fields.pop("messages", "[]").encode()
        return cls(
            tenant=tenant,
            person=person,
            id=fields.get("id", ""),
            token=token,
            attempt=int(fields.get("attempt", 0)),
            claimed_ms=int(fields.get("claimed_ms", 0)),
            due_ms=int(float(fields.get("due_ms", 0))),
            requeued=fields.get("requeued") == "1",
            messages=[Message.from_event(e, person) for e in orjson.loads(messages_json)],
            messages_json=messages_json,
            fields=fields,
            history=_history(fields.pop("history", "[]")),
            last_inbound_ts=int(fields.pop("last_inbound", 0) or 0),
            context=_context(fields.pop("context", "[]")),
        )

    def window_closed(self, now_s: float, window_s: float = SERVICE_WINDOW_S) -> bool:
        """Whether the 24-hour customer-service window has closed for this person."""
        latest = max([self.last_inbound_ts, *(m.ts for m in self.messages)])
        return bool(latest) and now_s - latest >= window_s

    @property
    def channel(self) -> str:
        """The provider this conversation is on: its sender answers it."""
        return self.messages[-1].channel if self.messages else "whatsapp"

    @property
    def user_text(self) -> str:
        """Every message of the burst, in order, one per line (what the AI is asked)."""
        return "\n".join(m.text for m in self.messages if m.text)

    @property
    def only_welcome(self) -> bool:
        """Whether every message is `request_welcome` (answered with the welcome text)."""
        return bool(self.messages) and all(m.type == "request_welcome" for m in self.messages)

    @property
    def oldest_ts(self) -> int:
        """Provider timestamp (unix seconds) of the oldest message; 0 if unknown."""
        stamps = [m.ts for m in self.messages if m.ts]
        return min(stamps) if stamps else 0

    @property
    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


def _history(raw: str) -> list[dict[str, Any]]:
    """The memory, oldest first; what people of the business said while the bot was silent
    (Chatwoot) reads like an exchange (shared/conversation/human_memory.py)."""
    if raw in ("", "[]"):  # no memory yet: most batches of a busy hour
        return []
    entries = orjson.loads(raw)
    if not isinstance(entries, list):
        return []
    return [with_transcript(e) for e in entries if isinstance(e, dict)]


def _context(raw: str) -> list[dict[str, Any]]:
    """The batch's context items; Lua's cjson writes an empty array as `{}`."""
    if raw in ("", "[]", "{}"):
        return []
    items = orjson.loads(raw)
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
