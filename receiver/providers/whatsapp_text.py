"""What the AI is shown of each WhatsApp message type: the text of a text message, else a short
bracketed description (`[image: caption]`, `[location: name, address]`). No I/O.

The receiver stores this `text` on each inbox event beside the raw message, so a brain that
wants more (a media id, an order's items) reads `raw`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def describe(message: dict[str, Any]) -> str:
    """The text of a text message, else a short bracketed description: `[image: caption]`."""
    return describe_as(message_type(message), message)


def describe_as(kind: str, message: dict[str, Any]) -> str:
    """What the AI is shown of a message of type `kind`."""
    if kind == "text":  # by far the most common: _text's rule, without its two calls
        body = message.get("text")
        text = body.get("body") if isinstance(body, dict) else ""
        return text if isinstance(text, str) else ""
    describer = _DESCRIBERS.get(kind)
    if describer is None:
        return f"[{kind}]"
    return describer(message.get(kind))


# Each describer gets the message's `<type>` value.


def _text(body: Any) -> str:
    return field_str(body, "body")


def _media(label: str) -> Callable[[Any], str]:
    return lambda body: _bracket(label, field_str(body, "caption"))


def _document(body: Any) -> str:
    return _bracket("document", field_str(body, "filename") or field_str(body, "caption"))


def _location(body: Any) -> str:
    parts = [field_str(body, "name"), field_str(body, "address")]
    if not any(parts) and isinstance(body, dict):
        parts = [_number(body.get("latitude")), _number(body.get("longitude"))]
    return _bracket("location", ", ".join(p for p in parts if p))


def _contacts_card(body: Any) -> str:
    names = [field_str(c.get("name"), "formatted_name") for c in objects(body)]
    return _bracket("contacts", ", ".join(n for n in names if n))


def _interactive(body: Any) -> str:
    if not isinstance(body, dict):
        return "[interactive]"
    for reply in ("button_reply", "list_reply"):
        chosen = body.get(reply)
        if isinstance(chosen, dict):
            return _bracket("button", field_str(chosen, "title") or field_str(chosen, "id"))
    return "[interactive]"


def _button(body: Any) -> str:
    return _bracket("button", field_str(body, "text") or field_str(body, "payload"))


def _reaction(body: Any) -> str:
    return _bracket("reaction", field_str(body, "emoji"))


def _order(body: Any) -> str:
    items = body.get("product_items") if isinstance(body, dict) else None
    return _bracket("order", f"{len(items)} items" if isinstance(items, list) else "")


def _system(body: Any) -> str:
    return _bracket("system", field_str(body, "body"))


def _unsupported(body: Any) -> str:
    # A poll, a view-once message...: said plainly, so the AI can ask for something it can read.
    what = field_str(body, "type") or "unknown"
    return f"[the customer sent a message of a kind that cannot be shown here: {what}]"


def _edit(body: Any) -> str:
    # An edit shows its new content (`edit.message`, a message of its own type).
    new = body.get("message") if isinstance(body, dict) else None
    return describe_as(message_type(new), new) if isinstance(new, dict) else "[edit]"


def _plain(label: str) -> Callable[[Any], str]:
    return lambda body: f"[{label}]"


_DESCRIBERS: dict[str, Callable[[Any], str]] = {
    "text": _text,
    "image": _media("image"),
    "video": _media("video"),
    "document": _document,
    "audio": _plain("audio"),
    "sticker": _plain("sticker"),
    "location": _location,
    "contacts": _contacts_card,
    "interactive": _interactive,
    "button": _button,
    "reaction": _reaction,
    "order": _order,
    "system": _system,
    "unsupported": _unsupported,
    "edit": _edit,
}


def _bracket(label: str, detail: str) -> str:
    return f"[{label}: {detail}]" if detail else f"[{label}]"


def message_type(message: dict[str, Any]) -> str:
    kind = message.get("type")
    return kind if isinstance(kind, str) and kind else "unknown"


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def field_str(obj: Any, key: str) -> str:
    """`obj[key]` when obj is an object and that value a string, else ""."""
    return _str(obj.get(key)) if isinstance(obj, dict) else ""


def objects(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _number(value: Any) -> str:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else ""
