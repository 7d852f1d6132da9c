"""A host of the tests' own: a tiny HTTP server on its own loopback port that records every
request it gets (path and Authorization header) and answers each with a PNG, so a file it gave
would reach the AI. It stands in for a host inside the network (Redis, a metadata service) that
hostile media URLs point at, or, listed in a setting, for a media proxy or Chatwoot's storage.
`/redirect?to=<url>` answers 302 to that url (recorded too)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from scripts.standins import BackgroundServer

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2


@dataclass(frozen=True)
class Call:
    path: str
    authorization: str | None


@dataclass
class RecordingHost:
    url: str = ""
    calls: list[Call] = field(default_factory=list)

    def routes(self) -> list[Route]:
        return [Route("/redirect", self._redirect), Route("/{path:path}", self._file)]

    def redirect(self, to: str) -> str:
        """A url of this host that redirects to `to`."""
        return f"{self.url}/redirect?to={to}"

    async def _redirect(self, request: Request) -> Response:
        self._record(request)
        return RedirectResponse(request.query_params["to"], status_code=302)

    async def _file(self, request: Request) -> Response:
        self._record(request)
        return Response(PNG, media_type="image/png")

    def _record(self, request: Request) -> None:
        self.calls.append(Call(request.url.path, request.headers.get("authorization")))


@asynccontextmanager
async def recording_host(name: str) -> AsyncIterator[RecordingHost]:
    """A running RecordingHost on 127.0.0.1 and a port of its own."""
    host = RecordingHost()
    async with BackgroundServer(Starlette(routes=host.routes()), name=name) as server:
        host.url = server.url
        yield host
