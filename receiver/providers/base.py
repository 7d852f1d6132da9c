"""The receiver's half of a provider: what WhatsApp, Chatwoot and any later provider's
webhook module implements (`InboundProvider`), and what it sees of a request
(`WebhookRequest`); the providers served are listed in receiver/providers/registry.py.

A provider has two halves because they run in different processes. This one serves a webhook
path: `verify` authenticates a request (raising a `SignatureError`: 401 missing, 403 wrong) and
`parse` turns its body into inbox events (`receiver.providers.parsing.Parsed`), both pure (no
I/O), so the receiver stores the events and answers. The other half is the provider's sender
(shared/senders/<provider>.py, a subclass of `shared.senders.base.Sender`): it sends a reply's
parts, marks read and shows typing where the provider has it, and hands a conversation to a
person. Events carry their `channel`; the worker picks each batch's sender by it, so debounce,
locks, leases, retries and review never know which provider a conversation came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

from receiver.providers.parsing import Parsed


class WebhookRequest(NamedTuple):
    """What an inbound provider sees of a POST: the headers it asked for, the query, the body.

    `headers` maps lower-case header names (bytes, as ASGI gives them) to latin-1 text.
    A NamedTuple (one per request): cheaper to build than a frozen dataclass.
    """

    headers: Mapping[bytes, str]
    query_string: bytes
    body: bytes

    def header(self, name: bytes) -> str | None:
        return self.headers.get(name)


class InboundProvider(Protocol):
    """The receiver's half of a provider."""

    channel: str
    path: str  # the webhook route, e.g. "/webhooks/chatwoot"
    header_names: frozenset[bytes]  # request headers `verify`/`parse` read (lower case)
    # The answer when Redis did not take a webhook in time: a status this provider retries.
    unavailable_status: int

    @property
    def configured(self) -> bool:
        """False when no credential is set: every request is then refused with 403."""
        ...

    def verify(self, request: WebhookRequest, now_s: float) -> None:
        """Return if the request is authentic, else raise
        `receiver.providers.signature.SignatureError`."""
        ...

    def parse(self, request: WebhookRequest, received_ms: int) -> Parsed:
        """The body's inbox events by tenant; what cannot be understood is a problem."""
        ...
