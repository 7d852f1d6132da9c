"""The inbox event: what the receiver stores and the worker reads (versioned JSON, orjson).

An event keeps everything the worker needs without the provider's original body. The first
three fields are always `v`, `kind` and `person`, in that order: the claim script routes events
by matching that prefix instead of decoding the whole JSON (it falls back to decoding). No
event names its tenant: the keys it is stored under do (a release before wrote `tenant`).

Message event (kind "message"):
    v, kind, person, channel (left out for "whatsapp"), id, type, text, ts (provider
    unix seconds), received_ms (receiver clock), name (profile name; left out when there is
    none), context (quoted id; left out when none), raw (the provider's message)
A WhatsApp message's event leaves out what its other fields imply: a text's `type` (read it
with `message_type`), and `received_ms` (13 digits) is `rd` = received_ms - ts * 1000 (a few;
read it with `received_ms`); events of the release before have both. The claim keeps a
message in its person's pending list (and the batch's `messages`) without the routing prefix
(`v`, `kind`, `person`: shared/lua/claim.lua `slim_event`), so a reader of those takes the
person from where it is kept. A message waits there until its turn, so its event holds what
a turn, the ops page and a review item read, once: WhatsApp's `raw` leaves out what the fields above
hold already (`id`, `from`, `timestamp`, a text's `type` and body) and is left out when nothing
else is in it; `restore_raw` gives the message object whole (shared/conversation/batch.py
`Message.raw`). A 3-message conversation's events so take about 0.5 KB with their text
(docs/benchmarks/memory.md).
Events that are not messages (kinds from `message_kind`) carry the same fields as a message
event plus `target` (the message they are about: reacted to, deleted, edited; "" when none)
and `new_person` (a number change's new id; "" otherwise); they start no turn by themselves
(shared/lua/claim.lua, docs/architecture.md "Events that are not messages"):
    "note"     a reaction (a removed one has an empty emoji), a system event (number or
               identity change), a call-permission reply: context for the next turn
    "revoke"   the person deleted `target`
    "edit"     the person edited `target`; `text` is the new content
    "welcome"  `request_welcome`: a turn only where a welcome text is configured
    "human"    Chatwoot: a message a person of the business (an agent) wrote to the customer;
               `name` is the agent's. It enters the memory and makes the bot silent in that
               conversation, unless the intake finds it is the bot's own reply coming back
Conversation event (kind "conversation", Chatwoot): a change of a conversation that starts or
ends the bot's silence there (shared/lua/lib/silence.lua); never a turn:
    v, kind, person, channel, id (Chatwoot's event name, the conversation and a hash
    of the body: deliveries of one event are one), type (the event's name), effect ("silence"
    or "speak"), why (assignee, opened; pending, resolved, reopened), name (the assignee's),
    ts (Chatwoot's time of the change, unix seconds), received_ms, raw (the event's status,
    changed attributes and assignee)
Echo event (kind "echo"): what the business itself wrote to `person` from the WhatsApp Business
app (coexistence, the `smb_message_echoes` webhook field); the fields of an event that is not a
message (`type` and `text` of what the business sent; no `name`; `target`, `new_person` ""). It
starts no turn: it pauses the bot for the person and enters their memory as written by a human
(shared/lua/lib/human.lua).
Status event (kind "status"):
    v, kind, person (recipient), channel, id (our outbound id), status, ts,
    received_ms, errors (list), raw
"""

from __future__ import annotations

from typing import Any

import orjson

EVENT_VERSION = 1
WHATSAPP = "whatsapp"  # the channel an event without `channel` is on


class EventError(ValueError):
    """Bytes that are not an inbox event of a version this code understands."""


def message_event(
    *,
    channel: str,
    person: str,
    message_id: str,
    type: str,
    text: str,
    ts: int,
    received_ms: int,
    raw: Any,
    name: str = "",
    context: str = "",
    kind: str = "",
) -> dict[str, Any]:
    """`kind` "" classifies the item by its WhatsApp type; a caller that knows better (a
    Chatwoot agent's message is "human") names it."""
    if not kind:
        # The kinds below are WhatsApp's types; other channels' items are all messages.
        # Text, nearly all traffic, is told apart with one string comparison: a set lookup
        # would hash the fresh string, and the receiver's hot path measured that
        # (docs/benchmarks/receiver.md).
        if type == "text" or channel != "whatsapp":
            kind = "message"
        else:
            kind = message_kind(type, raw)
    event: dict[str, Any] = {"v": EVENT_VERSION, "kind": kind, "person": person}
    if channel != WHATSAPP:
        event["channel"] = channel
    event["id"] = message_id
    # A WhatsApp message waits in its pending list as written here (less its routing prefix):
    # a text's type is implied, and `rd` (a few digits) holds what `received_ms` (13) would.
    lean = kind == "message" and channel == WHATSAPP
    if type != "text" or not lean:
        event["type"] = type
    event["text"] = text
    event["ts"] = ts
    if lean:
        event["rd"] = received_ms - ts * 1000
    else:
        event["received_ms"] = received_ms
    if name:
        event["name"] = name
    if context:
        event["context"] = context
    if kind not in ("message", "human"):
        event["target"], event["new_person"] = _about(type, raw)
    if channel == WHATSAPP:
        raw = _slim(raw, person, message_id, type, text, ts)
        if raw:
            event["raw"] = raw
    else:
        event["raw"] = raw
    return event


def _slim(raw: Any, person: str, message_id: str, type: str, text: str, ts: int) -> Any:
    """WhatsApp's message object without what the event holds already, which `restore_raw`
    puts back: `id`, `timestamp`, `from` (unless a `from_user_id` is beside it) and, for a
    text, `type` and the body. What stays is what only the message says (a context, a
    referral, the media object, a reply's choice, ...). A text's `type` and body alone go:
    a worker of the release before finds the rest where it looks (media ids, a context)."""
    if not isinstance(raw, dict):
        return raw
    slim = raw.copy()
    if slim.get("id") == message_id:
        del slim["id"]
    if slim.get("from") == person and "from_user_id" not in slim:
        del slim["from"]
    stamp = slim.get("timestamp")
    if stamp is not None and stamp == str(ts):
        del slim["timestamp"]
    if type == "text" and slim.get("type") == "text" and slim.get("text") == {"body": text}:
        del slim["type"], slim["text"]
    return slim


def restore_raw(event: dict[str, Any], person: str = "") -> Any:
    """The provider's message object of a WhatsApp event as the receiver got it: `raw` with
    what `_slim` left out put back (an event written before slimming has it all already).
    `person`: whose message it is, for an event kept without its `person` (a waiting or
    claimed message: claim.lua keeps it without the routing prefix)."""
    raw = event.get("raw")
    if raw is not None and not isinstance(raw, dict):
        return raw
    raw = raw or {}
    whole: dict[str, Any] = {}
    if "from" not in raw and "from_user_id" not in raw and event.get("kind") != "echo":
        whole["from"] = event.get("person") or person
    if "id" not in raw:
        whole["id"] = event.get("id", "")
    if "timestamp" not in raw:
        whole["timestamp"] = str(event.get("ts", ""))
    kind = event.get("type", "text")
    if "type" not in raw:
        whole["type"] = kind
    if kind == "text" and "text" not in raw:
        whole["text"] = {"body": event.get("text", "")}
    if not whole:
        return raw
    whole.update(raw)
    return whole


def received_ms(event: Any) -> int:
    """When the receiver got the message, on its clock (ms); 0 when the event does not say.
    A WhatsApp message's event holds `rd`, received_ms - ts * 1000 (`message_event`), one of
    the release before or of another kind or channel `received_ms`."""
    if not isinstance(event, dict):
        return 0
    value = event.get("received_ms")
    if value is None and "rd" in event:
        try:
            return int(event.get("ts") or 0) * 1000 + int(event["rd"])
        except (TypeError, ValueError):
            return 0
    try:
        return int(value or 0) if not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        return 0


def message_type(event: Any) -> str:
    """A message event's `type`: a WhatsApp text's leaves it out (`message_event`)."""
    return str(event.get("type", "text")) if isinstance(event, dict) else ""


def conversation_event(
    *,
    channel: str,
    person: str,
    event_id: str,
    type: str,
    effect: str,
    why: str,
    ts: int,
    received_ms: int,
    raw: Any,
    name: str = "",
) -> dict[str, Any]:
    """A conversation's change that starts (`effect` "silence") or ends ("speak") the bot's
    silence there, `why` in a word."""
    return {
        "v": EVENT_VERSION,
        "kind": "conversation",
        "person": person,
        "channel": channel,
        "id": event_id,
        "type": type,
        "effect": effect,
        "why": why,
        "name": name,
        "ts": ts,
        "received_ms": received_ms,
        "raw": raw,
    }


# Types that are always plain messages.
_PLAIN = frozenset({"text", "image", "audio", "video", "document", "sticker", "location"})
_NOTE_TYPES = frozenset({"reaction", "system"})


def echo_event(
    *,
    channel: str,
    person: str,
    message_id: str,
    type: str,
    text: str,
    ts: int,
    received_ms: int,
    raw: Any,
) -> dict[str, Any]:
    """The event of a message the business sent from the WhatsApp Business app to `person`:
    a message event of kind "echo", with `target` and `new_person` "" (it is about nothing)."""
    return message_event(
        channel=channel,
        person=person,
        message_id=message_id,
        type=type,
        text=text,
        ts=ts,
        received_ms=received_ms,
        raw=raw,
        kind="echo",
    )


def message_kind(type: str, raw: Any) -> str:
    """The event kind of an inbound item of provider type `type` (see the module docstring)."""
    if type in _PLAIN:
        return "message"
    if type in _NOTE_TYPES:
        return "note"
    if type in ("revoke", "edit"):
        return type
    if type == "request_welcome":
        return "welcome"
    if type == "interactive" and _field(_field(raw, "interactive"), "type") == (
        "call_permission_reply"
    ):
        return "note"
    return "message"


def _about(type: str, raw: Any) -> tuple[str, str]:
    """(target, new_person) of an event that is not a message."""
    body = _field(raw, type)
    if type == "reaction":
        return _str(_field(body, "message_id")), ""
    if type in ("revoke", "edit"):
        return _str(_field(body, "original_message_id")), ""
    if type == "system" and _field(body, "type") in (
        "customer_changed_number",
        "user_changed_number",
    ):
        # The receiver refuses a new id that is not a phone number (receiver/providers/whatsapp.py).
        return "", _str(_field(body, "wa_id")) or _str(_field(body, "new_wa_id"))
    return "", ""


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def status_event(
    *,
    channel: str,
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
    channel = event.get("channel", WHATSAPP)
    if event["kind"] == "status":
        return f"{channel}:{event['id']}:{event['status']}"
    return f"{channel}:{event['id']}"


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
