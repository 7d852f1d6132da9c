"""uvicorn's httptools protocol with a deadline on a request's headers.

uvicorn arms no timer on a new connection, nor on a request whose headers never end: its
keep-alive timeout runs only between requests. A client that opens a socket and sends nothing,
or a few header bytes a minute, would hold it for ever and count against `--limit-concurrency`
(`WEB_MAX_CONNECTIONS`) until every other client got 503. This protocol closes a connection
whose request headers are not complete within `HEADERS_TIMEOUT_S` of the connection opening or
of the request's first byte. The Procfile's `web` line names it (`--http
receiver.header_deadline:HeaderDeadlineProtocol`); the body has its own deadline in the app
(receiver/body_deadline.py). Behind Heroku's router, which forwards whole requests, it never
fires.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shared.settings import ConfigError, Settings


def headers_timeout_s() -> float:
    """`HEADERS_TIMEOUT_S`. uvicorn imports this class before it calls the app factory, so a
    bad configuration gets the default here and stops the process, clearly worded, there."""
    try:
        return Settings.from_env().headers_timeout_s
    except ConfigError:
        return Settings().headers_timeout_s


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol`, closing a connection whose headers do not come in time."""

    headers_timeout_s = headers_timeout_s()
    _headers_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_headers_deadline()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_headers_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_headers_deadline()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_headers_deadline()
        super().connection_lost(exc)

    def _arm_headers_deadline(self) -> None:
        self._disarm_headers_deadline()
        self._headers_deadline = self.loop.call_later(self.headers_timeout_s, self._headers_late)

    def _disarm_headers_deadline(self) -> None:
        if self._headers_deadline is not None:
            self._headers_deadline.cancel()
            self._headers_deadline = None

    def _headers_late(self) -> None:
        self._headers_deadline = None
        if not self.transport.is_closing():
            self.transport.close()
