"""The files of a customer's message as the ops page shows and fetches them, and what a
remembered exchange keeps of them (`files`), so the thread shows an image after its batch is
gone.

Which parts of a message are files is shared/conversation/files.py's (`items_of_message`, the
same the brain reads); this adds where each one is: its message's id and its place among that
message's files (`n`), which is all the ops page's media route is given
(shared/ops/media.py fetches it, never a URL from the request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.chatwoot import CHANNEL as CHATWOOT
from shared.conversation.batch import Message
from shared.conversation.files import items_of_message

SHOWN = frozenset({"image", "sticker"})  # what the thread shows inline


@dataclass(frozen=True)
class File:
    kind: str  # image, sticker, document, audio, video
    label: str = ""  # `[image: caption]`, `[document: name.pdf]`, `[voice note]`
    message_id: str = ""
    n: int = 0  # its place among its message's files (Chatwoot: several attachments)
    media_id: str = ""  # WhatsApp's media id
    url: str = ""  # the webhook's url (WhatsApp) or data_url (Chatwoot)
    mime_type: str = ""
    voice: bool = False
    channel: str = "whatsapp"
    caption: str = ""  # not kept: the remembered text holds it

    @property
    def shown(self) -> bool:
        """An image the thread shows through the ops page's media route."""
        return self.kind in SHOWN and self.fetchable

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
            n=kept["n"] if isinstance(kept.get("n"), int) else 0,
            media_id=_str(kept.get("media")),
            url=_str(kept.get("url")),
            mime_type=_str(kept.get("mime")),
            voice=kept.get("voice") is True,
            channel=_str(kept.get("ch")) or "whatsapp",
        )


def files_of(message: Message) -> list[File]:
    """The files of a message, in order ([] for a text)."""
    return [
        File(
            kind=item.kind,
            label=_label("voice note" if item.voice else item.kind, item.filename, item.caption),
            message_id=message.id,
            n=n,
            media_id=item.media_id,
            url=item.url,
            mime_type=item.mime_type,
            voice=item.voice,
            channel=CHATWOOT if message.channel == CHATWOOT else "whatsapp",
            caption=item.caption,
        )
        for n, item in enumerate(items_of_message(message))
    ]


def files_of_event(event: Mapping[str, Any]) -> list[File]:
    """The files of a stored message event (a waiting one, a batch's, a review item's)."""
    try:
        message = Message.from_event(dict(event))
    except (TypeError, ValueError):
        return []  # not an event this release wrote: no file to show
    return files_of(message)


def _label(kind: str, filename: str, caption: str) -> str:
    said = ": ".join(p for p in (filename, caption) if p)
    return f"[{kind}: {said}]" if said else f"[{kind}]"


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""
