"""Sends whose outcome the worker cannot know, and what a person is shown of them.

A request that may have reached the provider but whose answer never came (a read timeout, a
connection dropped after the request was written, a 200 that names no message) may or may not
have put a message in front of the person. Neither Meta's Cloud API nor Chatwoot's has an
idempotency key, so sending it again may be a second copy: invariant 7 (a reply is sent once)
decides for at most once. Such a send is therefore never repeated, and never quietly counted as
done either: its batch goes to review as `delivery_unknown`, and the review item says what may
be missing (`UnknownDelivery`), since only a person can look at the conversation (WhatsApp
Business Manager, the phone, the Chatwoot conversation) and decide whether to write again.

What a person needs, and so what the item holds: which conversation (the item's tenant and
person), which message may be missing (the part and how many the reply had, or the template's
name), what the person already has (`parts_sent`), when the request was made (to find it in
the provider's logs) and why the answer was missing (the error). The part's text is kept too,
so it can be sent by hand, but only `review show` and `inspect --text` print it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

# httpx failures that happen before the request is complete on the wire: the provider cannot
# have acted on it, so a retry is safe. Every other transport error (read timeout, read error,
# the server closing without an answer) may come after the provider took the request.
NOT_SENT: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.WriteError,  # the body not fully written: a server does not act on half a request
    httpx.WriteTimeout,
    httpx.LocalProtocolError,
    httpx.ProxyError,
    httpx.UnsupportedProtocol,
)


def may_have_arrived(exc: httpx.TransportError) -> bool:
    """False only when httpx failed before the whole request was sent."""
    return not isinstance(exc, NOT_SENT)


def utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class UnknownDelivery:
    """One send of a batch whose outcome is unknown (the review item's `delivery_unknown`)."""

    what: str  # "part" or "template"
    part: int  # index of the reply part it was (or, for a template, replaced)
    parts_total: int
    at_ms: int  # when the request was made (the worker's clock)
    error: str  # why no answer came
    text: str  # the part's text, or the template's name: what the person may not have

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UnknownDelivery:
        return cls(
            what=str(data.get("what", "part")),
            part=int(data.get("part", 0)),
            parts_total=int(data.get("parts_total", 0)),
            at_ms=int(data.get("at_ms", 0)),
            error=str(data.get("error", "")),
            text=str(data.get("text", "")),
        )

    def sentence(self) -> str:
        """The review item's `error`: what, when, why; no message text (inspect prints it)."""
        return (
            f"{describe(self.to_json())}: no answer to the request made at {utc(self.at_ms)} "
            f"({self.error}); the person may or may not have it, and it is not sent again"
        )


def describe(data: dict[str, Any]) -> str:
    """'part 2 of 3', or 'template reengagement_es (in place of part 2 of 3)'."""
    of = f"part {int(data.get('part', 0)) + 1} of {data.get('parts_total', '?')}"
    if data.get("what") == "template":
        return f"template {data.get('text', '')} (in place of {of})"
    return of
