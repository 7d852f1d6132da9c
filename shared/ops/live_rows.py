"""How the live state shows one stored batch, message or review item: plain dicts for people
(worker/inspect.py prints them, the ops page renders them), never the stored bytes as they are.
"""

from __future__ import annotations

from typing import Any

import orjson

from shared.conversation.review_journal import JOURNAL_FIELD, ReviewJournal
from shared.conversation.unknowns import describe
from shared.events import message_type, received_ms


def text_of(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def review_summary(item: dict[str, Any]) -> dict[str, Any]:
    summary = {
        "id": item.get("id"),
        "person": item.get("person"),
        "reason": item.get("reason"),
        "error": item.get("error"),
        "attempts": item.get("attempts"),
        "messages": len(item.get("messages") or []),
        "reviewed_ms": item.get("reviewed_ms"),
    }
    unknown = item.get("delivery_unknown")
    if isinstance(unknown, dict):
        # What may be missing and when, without the text (that needs --text or review show).
        summary["delivery_unknown"] = {
            "send": describe(unknown),
            "at_ms": unknown.get("at_ms"),
            "error": unknown.get("error"),
        }
    for name in ("hand_over", "hand_over_steps", "parts_sent", "parts_total"):
        if name in item:
            summary[name] = item[name]
    return summary


def message_row(raw: bytes, now: int, with_text: bool) -> dict[str, Any]:
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"id": None, "error": "not JSON", "bytes": len(raw)}
    text = str(event.get("text") or "")
    row: dict[str, Any] = {
        "id": event.get("id"),
        "type": message_type(event),
        "ts": event.get("ts"),
        "received_ago_ms": now - (received_ms(event) or now),
        "chars": len(text),
    }
    if with_text:
        row["text"] = text
    return row


def batch_row(fields: dict[bytes, bytes], now: int, with_text: bool) -> dict[str, Any]:
    f = {text_of(name): text_of(value) for name, value in fields.items()}
    parts = sorted(int(name[5:]) for name in f if name.startswith("part:") and name[5:].isdigit())
    claimed = int(f.get("claimed_ms") or 0)
    row: dict[str, Any] = {
        "id": f.get("id"),
        "attempt": int(f.get("attempt") or 0),
        "messages": int(f.get("size") or 0),
        "created_ms": int(f.get("created_ms") or 0),
        "claimed_ms": claimed or None,
        "claimed_ago_ms": now - claimed if claimed else None,
        "in_turn": bool(f.get("token")),
        "last_error": f.get("last_error") or None,
        "requeued": f.get("requeued") == "1",
        "reply_stored": "reply" in f,
        "reply_chars": len(f["reply"]) if "reply" in f else None,
        "parts_sent": parts,
        # Noted before the template's request: if that part is not in parts_sent when the
        # batch is resumed, nobody knows whether the template went out.
        "template": {"part": int(f.get("template_part") or 0), "noted_ms": _int(f, "template_ms")}
        if f.get("template") == "1"
        else None,
        "review_journal": journal_row(f.get(JOURNAL_FIELD)),
    }
    if with_text:
        row["reply"] = f.get("reply")
        row["messages_json"] = orjson.loads(f.get("messages") or "[]")
    return row


def journal_row(raw: str | None) -> dict[str, Any] | None:
    """A review decided and a hand-over begun by a worker that has not finished the batch."""
    if raw is None:
        return None
    try:
        journal = ReviewJournal.from_json(raw)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return {"raw": raw[:200]}
    return {
        "reason": journal.reason,
        "decided_ms": journal.at_ms,
        "steps": journal.steps,
        "delivery_unknown": describe(journal.delivery_unknown.to_json())
        if journal.delivery_unknown
        else None,
    }


def _int(fields: dict[str, str], name: str) -> int | None:
    try:
        return int(fields[name])
    except (KeyError, ValueError):
        return None
