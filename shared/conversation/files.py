"""What of a message is a file, and what the model is told of a message it cannot be shown. No I/O.

One place for both halves of a message that carries a file: the presentation
(shared/conversation/presentation.py) leaves out of the batch's text what a brain shows beside
it as a file, and the built-in brain's media (worker/brains/media.py) shows each of these
`Item`s once, its label next to the thing (`[image: caption]`, then the image). Before, the
receiver's label (`[image: caption]`, `[audio]`) stood in the text and the media's label again
next to the file: the model read each twice.

A message Meta could not deliver in full (an `errors` entry, such as 131051 for an
`unsupported` poll or 131000 "Unsupported webhook payload" on an interactive message; an
interactive message or button without the reply it should carry) becomes one sentence the
model can act on (`could_not_show`), and so does a file that cannot be had (`Item.not_shown`):
what it was, what came with it, and to ask the customer to send it again or describe it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.chatwoot import CHANNEL as CHATWOOT
from shared.conversation.batch import Message, plain_text

# WhatsApp's message types that carry a file, and how far each one is fetched
# (worker/brains/media.py: a video is described, never downloaded).
FILE_TYPES = frozenset({"image", "sticker", "document", "audio", "video"})
# Chatwoot's attachment `file_type`s that are files, as WhatsApp's message types.
CHATWOOT_KINDS = {"image": "image", "audio": "audio", "video": "video", "file": "document"}
# How the sentences name a file of each kind.
A_KIND = {
    "image": "an image",
    "sticker": "a sticker",
    "document": "a document",
    "audio": "an audio file",
    "voice": "a voice note",
    "video": "a video",
}
ASK = "ask them to send it again or to describe it"
ASK_TO_WRITE = "ask them to write what it says"


@dataclass(frozen=True)
class Item:
    """One file of an inbound message."""

    kind: str  # image, sticker, document, audio, video
    caption: str = ""
    media_id: str = ""  # WhatsApp's media id
    url: str = ""  # a URL to download from directly
    token: bool = True  # send the tenant's bearer token (WhatsApp)
    mime_type: str = ""
    filename: str = ""
    voice: bool = False
    animated: bool = False
    size: int = 0  # as announced, 0 when unknown

    @property
    def label(self) -> str:
        """`[image: caption]`, `[document: name.pdf: caption]`, `[sticker]`."""
        said = ": ".join(p for p in (self.filename, self.caption) if p)
        return f"[{self.kind}: {said}]" if said else f"[{self.kind}]"

    @property
    def a_kind(self) -> str:
        return A_KIND["voice" if self.voice else self.kind]

    @property
    def said(self) -> str:
        """What the customer wrote with the file or named it, quoted, for a sentence about a
        file the model cannot see: ` ("presupuesto.pdf": "el de ayer")`, or ""."""
        said = ": ".join(f'"{p}"' for p in (self.filename, self.caption) if p)
        return f" ({said})" if said else ""

    def not_shown(self, why: str, ask: str = ASK) -> str:
        """`[the customer sent an image ("caption") that could not be downloaded; ask them
        ...]`: the file's kind, what came with it, why, and what the model can do."""
        return f"[the customer sent {self.a_kind}{self.said} {why}; {ask}]"


def items_of_message(message: Message) -> list[Item]:
    """The files of one message that a brain can fetch, in order; none for a message Meta
    could not deliver in full (its file is not there to fetch)."""
    if plain_text(message):  # a text: no file (and no need to restore its `raw` to know)
        return []
    raw = message.raw
    if not isinstance(raw, Mapping):
        return []
    if message.channel == CHATWOOT:
        return _chatwoot_items(raw)
    kind = raw.get("type")
    body = raw.get(kind) if isinstance(kind, str) else None
    if kind not in FILE_TYPES or not isinstance(body, Mapping) or undelivered(raw):
        return []
    return [
        Item(
            kind=str(kind),
            caption=_str(body.get("caption")),
            media_id=_str(body.get("id")),
            url=_str(body.get("url")),
            mime_type=mime(body.get("mime_type")),
            filename=_str(body.get("filename")),
            voice=kind == "audio" and (body.get("voice") is True or not body.get("filename")),
            animated=body.get("animated") is True,
            size=to_int(body.get("file_size")),
        )
    ]


def _chatwoot_items(raw: Mapping[str, Any]) -> list[Item]:
    """Chatwoot's `attachments` that are files (stored on the event as the webhook gave them):
    each one's `data_url`, no token; the message's content is the first one's caption."""
    caption = _str(raw.get("content"))
    found: list[Item] = []
    for attachment in chatwoot_attachments(raw):
        kind = CHATWOOT_KINDS.get(_str(attachment.get("file_type")))
        if kind is None:
            continue
        found.append(
            Item(
                kind=kind,
                caption=caption if not found else "",
                url=_str(attachment.get("data_url")),
                token=False,
                mime_type=mime(attachment.get("content_type")),
                filename=_str(attachment.get("file_name")),
                voice=kind == "audio" and not attachment.get("file_name"),
                size=to_int(attachment.get("file_size")),
            )
        )
    return found


def chatwoot_attachments(raw: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    listed = raw.get("attachments")
    return [a for a in listed if isinstance(a, Mapping)] if isinstance(listed, list) else []


def chatwoot_content(message: Message, raw: dict[str, Any], files_beside: bool) -> str:
    """A Chatwoot message with attachments: its files by their labels (the first one's caption
    is the message's content), or nothing of them when the brain shows them beside the text
    (`files_beside`); the content when no file carries it; the attachments that are no files
    (a location, a contact) said here, and one Chatwoot could not show as a sentence."""
    attachments = chatwoot_attachments(raw)
    if not attachments:
        return message.text
    files = items_of_message(message)
    if files:
        lines = [] if files_beside else [item.label for item in files]
    else:
        lines = [_field(raw, "content")]
    for attachment in attachments:
        kind = _field(attachment, "file_type")
        if kind in CHATWOOT_KINDS:
            continue
        title = _field(attachment, "fallback_title")
        if kind == "location":
            where = [
                title,
                _coordinates(attachment.get("coordinates_lat"), attachment.get("coordinates_long")),
            ]
            lines.append(f"[shared a location: {'; '.join(w for w in where if w)}]")
        elif kind == "contact" and title:
            lines.append(f"[shared a contact: {title}]")
        else:
            lines.append(could_not_show(f"a Chatwoot attachment of type {kind or 'unknown'}"))
    return "\n".join(line for line in lines if line)


def _coordinates(latitude: Any, longitude: Any) -> str:
    if latitude is None or longitude is None:
        return ""
    return f"{_number(latitude)}, {_number(longitude)}"


def undelivered(raw: Mapping[str, Any]) -> str:
    """Why Meta could not deliver this WhatsApp message in full, from its `errors` entry
    (`Unsupported webhook payload`, `Message type unknown`), else ""."""
    errors = raw.get("errors")
    if not isinstance(errors, list) or not errors:
        return ""
    first = errors[0] if isinstance(errors[0], Mapping) else {}
    details = first.get("error_data")
    said = [_str(first.get("title")) or _str(first.get("message"))]
    if isinstance(details, Mapping):
        said.append(_str(details.get("details")))
    code = first.get("code")
    shown = ": ".join(dict.fromkeys(s for s in said if s)) or "no details"
    return f"{shown} (code {code})" if isinstance(code, int) else shown


def could_not_show(what: str, why: str = "") -> str:
    """The sentence for a message the model cannot be shown, `what` naming its kind:
    `[the customer sent something that could not be shown here (interactive: Unsupported
    webhook payload); ask them to send it again or to describe it]`."""
    detail = f"{what}: {why}" if why else what
    return f"[the customer sent something that could not be shown here ({detail}); {ASK}]"


def _field(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _number(value: Any) -> str:
    return (
        str(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else ""
    )


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def to_int(value: Any) -> int:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        return 0


def mime(value: Any) -> str:
    """`audio/ogg; codecs=opus` -> `audio/ogg`."""
    return value.split(";", 1)[0].strip().lower() if isinstance(value, str) else ""
