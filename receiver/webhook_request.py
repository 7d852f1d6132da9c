"""The steps of a webhook POST that do not wait, as plain calls of `Receiver.webhook`
(receiver/app.py): the headers read and checked before the body, the signature checked and the
body parsed after it, and the answers' parts. Plain functions, not methods of one more
coroutine: every coroutine on the request's way costs it (docs/benchmarks/receiver.md)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

from receiver.providers.base import InboundProvider, WebhookRequest
from receiver.providers.signature import SignatureError

logger = logging.getLogger(__name__)


def request_headers(
    raw: Iterable[tuple[bytes, bytes]], inbound: InboundProvider, max_body_bytes: int
) -> Any:
    """The headers `inbound` reads (name -> latin-1 text) of a request's `raw` headers (ASGI's
    lower-case names), or (status, text) when the request is refused before its body: 413 a
    Content-Length over the limit, 400 a malformed one, 403 no credential configured."""
    wanted = inbound.header_names
    headers: dict[bytes, str] = {}
    length = None
    for name, value in raw:
        if name in wanted:
            headers[name] = value.decode("latin-1")
        elif name == b"content-length":
            length = value
    if length is not None:
        try:
            if int(length) > max_body_bytes:
                return 413, b"body too large"
        except ValueError:
            return 400, b"bad request"
    if not inbound.configured:
        return 403, b"forbidden"  # never accept unauthenticated traffic
    return headers


def admit(request: WebhookRequest, inbound: InboundProvider, now_ns: int) -> Any:
    """The body's `Parsed` once the request is authentic, else (401 or 403, text)."""
    try:
        inbound.verify(request, now_ns / 1e9)
    except SignatureError as exc:
        logger.info("%s webhook refused: %s", inbound.channel, exc)
        return (401, b"missing signature") if exc.status_code == 401 else (403, b"forbidden")
    parsed = inbound.parse(request, now_ns // 1_000_000)
    if parsed.ignored_fields:
        logger.debug("ignored webhook fields: %s", parsed.ignored_fields)
    return parsed


@functools.lru_cache(maxsize=1024)  # the same few answers over and over: built once each
def counts(stored: int, duplicates: int, deadlettered: bool = False) -> list[tuple[bytes, bytes]]:
    """The headers of a 200: the counts, and an empty body's length."""
    headers = [
        (b"content-length", b"0"),
        (b"x-stored", str(stored).encode()),
        (b"x-duplicates", str(duplicates).encode()),
    ]
    if deadlettered:
        headers.append((b"x-deadlettered", b"1"))
    return headers


TEXT = b"text/plain; charset=utf-8"
# A body that did not come in time: the connection is closed, not kept for a next request
# behind the rest of a body a trickling client would hold it with. (413 and 400 keep it: a client
# still writing a large body would see the close as a reset, not the answer; uvicorn drains the
# rest, and a slow rest meets the deadline.)
BODY_UNREAD = frozenset({408})
EMPTY_BODY = {"type": "http.response.body", "body": b""}
