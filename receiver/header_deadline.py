"""uvicorn's httptools protocol with a deadline on a request's headers.

uvicorn arms no timer on a new connection, nor on a request whose headers never end: its
keep-alive timeout runs only between requests. A client that opens a socket and sends nothing,
or a few header bytes a minute, would hold it for ever and count against `--limit-concurrency`
(`WEB_MAX_CONNECTIONS`) until every other client got 503. This protocol closes a connection
whose request headers are not complete within `HEADERS_TIMEOUT_S` of the connection opening or
of the request's first byte (up to a quarter of that later: `DeadlineWatch`). The Procfile's
protocol (receiver/http_protocol.py) is this one and more; the body has its own deadline, on
the direct path there and in the app (receiver/body_deadline.py) on the ASGI path. Behind
Heroku's router, which forwards whole requests, it never fires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shared.settings import ConfigError, Settings


def headers_timeout_s() -> float:
    """`HEADERS_TIMEOUT_S`. uvicorn imports this class before it calls the app factory, so a
    bad configuration gets the default here and stops the process, clearly worded, there."""
    try:
        return Settings.from_env().headers_timeout_s
    except ConfigError:
        return Settings().headers_timeout_s


# The watch looks this often per deadline, within these bounds (seconds): a connection is cut
# up to a quarter of the deadline late, which is what the deadline is for anyway.
TICKS_PER_DEADLINE = 4
TICK_BOUNDS_S = (0.01, 1.0)


class DeadlineWatch:
    """The connections of one server that are waiting for something (a request's headers, a
    webhook's body), each with the loop time it began; one timer looks over them a few times
    per deadline and calls `late(protocol)` for each that overran.

    A timer per request (call_later, then cancel) cost ~6 800 instructions a webhook, a few
    per cent of its whole cost (docs/benchmarks/receiver.md); noting a start in a dict costs
    a small share of that."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout_s: float,
        late: Callable[[Any], None],
    ) -> None:
        self.started: dict[Any, float] = {}
        self._loop = loop
        self._timeout_s = timeout_s
        self._late = late
        low, high = TICK_BOUNDS_S
        self._tick_s = min(high, max(low, timeout_s / TICKS_PER_DEADLINE))
        self._timer: asyncio.TimerHandle | None = None

    def begin(self, protocol: Any) -> None:
        self.started[protocol] = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_later(self._tick_s, self._look)

    def end(self, protocol: Any) -> None:
        self.started.pop(protocol, None)

    def _look(self) -> None:
        self._timer = None
        began_by = self._loop.time() - self._timeout_s
        for protocol, began in list(self.started.items()):
            if began <= began_by:
                del self.started[protocol]
                self._late(protocol)
        if self.started:
            self._timer = self._loop.call_later(self._tick_s, self._look)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol`, closing a connection whose headers do not come in time."""

    headers_timeout_s = headers_timeout_s()
    _watch: DeadlineWatch | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # One watch per server (its state is shared by all of its connections).
        watch = getattr(self.server_state, "header_watch", None)
        if watch is None:
            watch = DeadlineWatch(
                self.loop, self.headers_timeout_s, HeaderDeadlineProtocol.headers_late
            )
            self.server_state.header_watch = watch  # type: ignore[attr-defined]
        self._watch = watch
        watch.begin(self)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._watch is not None:
            self._watch.begin(self)

    def on_headers_complete(self) -> None:
        if self._watch is not None:
            self._watch.end(self)
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watch is not None:
            self._watch.end(self)
        super().connection_lost(exc)

    def headers_late(self) -> None:
        """The headers did not come within the deadline: close without an answer."""
        if not self.transport.is_closing():
            self.transport.close()
