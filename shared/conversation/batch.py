"""A batch: one person's burst of messages, handed to the brain as one turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from shared.conversation.human_memory import with_transcript
from shared.events import WHATSAPP, restore_raw

T = TypeVar("T")
SERVICE_WINDOW_S = 24 * 3600  # WhatsApp's customer-service window


class _Raw:
    """`Message.raw`, a descriptor (dataclasses' descriptor-typed field, default None): a
    claimed WhatsApp message keeps its event and restores the provider's object from it only
    when something reads `raw` (the memory's exchange of a plain text never does: see
    `plain_text`). Restoring every message of every claim was a measurable share of a turn's
    worker CPU (docs/benchmarks/worker.md). Once restored, the value is the instance's own."""

    def __get__(self, message: Message | None, owner: type | None = None) -> Any:
        if message is None:
            return None  # the field's default, as dataclasses asks the class for it
        kept = message.__dict__
        try:
            return kept["raw"]
        except KeyError:
            event, person = kept.pop("_unrestored")
        raw = kept["raw"] = restore_raw(event, person)
        return raw

    def __set__(self, message: Message, value: Any) -> None:
        message.__dict__["raw"] = value


@dataclass(frozen=True)
class Message:
    """One inbound message of the burst, as the receiver stored it."""

    id: str
    type: str
    text: str
    ts: int
    name: str = ""
    context: str = ""
    # WhatsApp's message object whole: the event keeps only what its fields do not
    # (shared/events.py); restored when first read (`_Raw`).
    raw: Any = _Raw()
    channel: str = "whatsapp"  # the provider it came from (receiver/providers/base.py)

    @classmethod
    def from_event(cls, event: dict[str, Any], person: str = "") -> Message:
        """`person`: whose message it is; a waiting or claimed message does not say (claim.lua
        keeps it without `v`, `kind` and `person`), one the release before stored does."""
        message = _claimed(event, person)
        message.raw  # noqa: B018 - restored now: the caller's event may change after this
        return message


def _claimed(event: dict[str, Any], person: str) -> Message:
    """The message of a claimed event, `raw` restored only when read (`_Raw`): `event` is the
    message's own from here on (a claim's, parsed for this batch alone). Built without the
    frozen `__init__`, whose `object.__setattr__` per field cost more than the rest of it on
    the claim's path (every message of every batch claimed)."""
    channel = str(event.get("channel") or WHATSAPP)
    kept: dict[str, Any] = {
        "id": str(event.get("id", "")),
        "type": str(event.get("type", "text")),
        "text": str(event.get("text", "")),
        "ts": int(event.get("ts") or 0),
        "name": str(event.get("name", "")),
        "context": str(event.get("context", "")),
        "channel": channel,
    }
    if channel == WHATSAPP:
        kept["_unrestored"] = (event, person)
    else:
        kept["raw"] = event.get("raw")
    return _whole(Message, kept)


def plain_text(message: Message) -> bool:
    """Whether `message` is a claimed WhatsApp text whose event kept no `raw`: its provider
    object holds nothing its fields do not (shared/events.py `_slim`), so it is shown as its
    text and has no file, and the presentation need not restore it to know."""
    unrestored = message.__dict__.get("_unrestored")
    return unrestored is not None and message.type == "text" and "raw" not in unrestored[0]


def _whole(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the frozen dataclass `cls` with these fields (every one of them), made
    without its `__init__`."""
    made = object.__new__(cls)
    object.__setattr__(made, "__dict__", fields)
    return made


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
    # Provider ts of the person's latest message (0: unknown, or the window has closed); for a
    # new batch whose newest message is under half a window old, that message's ts (claim.lua):
    # a lower bound, which is all `window_closed` needs.
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
        try:  # the worker's clients: bytes, decoded here at once
            flat = list(map(bytes.decode, row))
        except TypeError:  # a client that decodes, or a number from Lua
            flat = [_s(x) for x in row]
        person, token = flat[0], flat[1]
        fields = dict(zip(flat[2::2], flat[3::2], strict=True))
        messages_json = fields.pop("messages", "[]").encode()
        get = fields.get
        # Built whole, without the frozen `__init__`'s `object.__setattr__` per field (every
        # batch claimed comes through here); tests/worker/test_batch.py checks that every
        # field is set.
        return _whole(
            cls,
            {
                "tenant": tenant,
                "person": person,
                "id": get("id", ""),
                "token": token,
                "attempt": int(get("attempt", 0)),
                "claimed_ms": int(get("claimed_ms", 0)),
                "due_ms": int(float(get("due_ms", 0))),
                "requeued": get("requeued") == "1",
                "messages": [_claimed(e, person) for e in orjson.loads(messages_json)],
                "messages_json": messages_json,
                "fields": fields,
                "history": _history(fields.pop("history", "[]")),
                "last_inbound_ts": int(fields.pop("last_inbound", 0) or 0),
                "context": _context(fields.pop("context", "[]")),
                "presented": {},
            },
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
        oldest = 0
        for m in self.messages:  # a loop, not a list: every turn asks (worker/turn/turn.py)
            if m.ts and (not oldest or m.ts < oldest):
                oldest = m.ts
        return oldest

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
