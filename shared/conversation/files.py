"""The files of an inbound message event, as the ops page shows and fetches them.

A WhatsApp event keeps the media object in `raw` under its type (`{"image": {"id", "mime_type",
"caption"}}`, shared/events.py); a Chatwoot event keeps the webhook's `attachments` (each a
`data_url`). worker/brains/media.py reads the same fields for the AI. A remembered exchange keeps
the files of its messages as `files` (shared/conversation/presentation.py `exchange`), so the
thread can show an image after its batch is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.chatwoot import CHANNEL as CHATWOOT

WHATSAPP_KINDS = frozenset({"image", "sticker", "document", "audio", "video"})
CHATWOOT_KINDS = {"image": "image", "audio": "audio", "video": "video", "file": "document"}
SHOWN = frozenset({"image", "sticker"})  # what the thread shows inline


@dataclass(frozen=True)
class File:
    kind: str  # image, sticker, document, audio, video
    label: str = ""  # `[image: caption]`, `[document: name.pdf]`
    message_id: str = ""
    caption: str = ""
    media_id: str = ""  # WhatsApp's media id
    url: str = ""  # the webhook's url (WhatsApp) or data_url (Chatwoot)
    mime_type: str = ""
    filename: str = ""
    voice: bool = False
    channel: str = "whatsapp"
    n: int = 0  # its place among its message's files (Chatwoot: several attachments)

    @property
    def shown(self) -> bool:
        """An image the thread shows through the ops page's media route."""
        return self.kind in SHOWN and bool(self.media_id or self.url)

    @property
    def fetchable(self) -> bool:
        return bool(self.media_id or self.url)

    def to_json(self) -> dict[str, Any]:
        """What a remembered exchange keeps of it (short names: it is kept per exchange)."""
        kept: dict[str, Any] = {"id": self.message_id, "kind": self.kind, "label": self.label}
        for name, value in (
            ("media", self.media_id),
            ("url", self.url),
            ("mime", self.mime_type),
            ("ch", "" if self.channel == "whatsapp" else self.channel),
        ):
            if value:
                kept[name] = value
        if self.voice:
            kept["voice"] = True
        if self.n:
            kept["n"] = self.n
        return kept

    @classmethod
    def from_json(cls, kept: Mapping[str, Any]) -> File:
        return cls(
            kind=_str(kept.get("kind")),
            label=_str(kept.get("label")),
            message_id=_str(kept.get("id")),
            media_id=_str(kept.get("media")),
            url=_str(kept.get("url")),
            mime_type=_str(kept.get("mime")),
            voice=kept.get("voice") is True,
            channel=_str(kept.get("ch")) or "whatsapp",
            n=kept["n"] if isinstance(kept.get("n"), int) else 0,
        )


def files_of_event(event: Mapping[str, Any]) -> list[File]:
    """The files of a message event, in order ([] for a text)."""
    raw = event.get("raw")
    if not isinstance(raw, Mapping):
        return []
    message_id = _str(event.get("id"))
    if event.get("channel") == CHATWOOT:
        return _chatwoot(raw, message_id)
    kind = _str(event.get("type")) or _str(raw.get("type"))
    body = raw.get(kind)
    if kind not in WHATSAPP_KINDS or not isinstance(body, Mapping):
        return []
    caption, filename = _str(body.get("caption")), _str(body.get("filename"))
    voice = kind == "audio" and (body.get("voice") is True or not filename)
    return [
        File(
            kind=kind,
            label=_label("voice note" if voice else kind, filename, caption),
            message_id=message_id,
            caption=caption,
            media_id=_str(body.get("id")),
            url=_str(body.get("url")),
            mime_type=_mime(body.get("mime_type")),
            filename=filename,
            voice=voice,
        )
    ]


def _chatwoot(raw: Mapping[str, Any], message_id: str) -> list[File]:
    listed = raw.get("attachments")
    if not isinstance(listed, list):
        return []
    caption = _str(raw.get("content"))
    found: list[File] = []
    for attachment in (a for a in listed if isinstance(a, Mapping)):
        kind = CHATWOOT_KINDS.get(_str(attachment.get("file_type")))
        if kind is None:
            continue
        filename = _str(attachment.get("file_name"))
        voice = kind == "audio" and not filename
        said = caption if not found else ""
        found.append(
            File(
                kind=kind,
                label=_label("voice note" if voice else kind, filename, said),
                message_id=message_id,
                caption=said,
                url=_str(attachment.get("data_url")),
                mime_type=_mime(attachment.get("content_type")),
                filename=filename,
                voice=voice,
                channel=CHATWOOT,
                n=len(found),
            )
        )
    return found


def _label(kind: str, filename: str, caption: str) -> str:
    said = ": ".join(p for p in (filename, caption) if p)
    return f"[{kind}: {said}]" if said else f"[{kind}]"


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _mime(value: Any) -> str:
    return value.split(";", 1)[0].strip().lower() if isinstance(value, str) else ""
