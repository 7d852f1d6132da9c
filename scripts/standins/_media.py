"""Media serving of the Graph API stand-in: what the worker fetches of an inbound image, PDF or
voice note (worker/brains/media.py), the way Meta documents it.

- `GET /{version}/{media-id}` (bearer token) answers `{messaging_product, url, mime_type,
  sha256, file_size, id}`; an unknown media id 400 with code 100, as Meta answers an expired
  one (media ids live 7 days).
- `GET {url}` (`/whatsapp_business/attachments/?mid=...`, bearer token too) answers the bytes
  with the media's Content-Type.

Tests register files with `graph.media.add(media_id, data, mime_type, ...)`: a `status` other
than 200 makes the download fail with it (a 404: the url expired), `delay` holds the download,
`announce` claims another `file_size`, `url` names another download url in the media-id
answer. `graph.media.downloads()` lists the downloads and `graph.media.peak` says how many were
in flight at once (a turn fetches its files at once).
`reset()` of the stand-in forgets the files.
Over HTTP: `{"op": "media", "media_id": ..., "data_b64": ..., "mime_type": ...}`.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins._common import RecordedRequest, StandInBase

DOWNLOAD_PATH = "/whatsapp_business/attachments/"


@dataclass
class StoredMedia:
    media_id: str
    data: bytes
    mime_type: str
    status: int = 200  # of the download: 404 (expired url), 500 ...
    delay: float = 0.0  # seconds before the download answers
    announce: int | None = None  # `file_size` in the media info, if not the real one
    url: str | None = None  # the media info's `url`, if not the stand-in's own download


class MediaServer:
    """The media part of `standin` (a `GraphApiStandIn`: `graph.media`); `authorized` checks
    the Authorization header as the rest of the stand-in does."""

    def __init__(self, standin: StandInBase[Any], authorized: Callable[[str | None], bool]) -> None:
        self._standin = standin
        self._authorized = authorized
        self._lock = threading.Lock()
        self._media: dict[str, StoredMedia] = {}
        self._in_flight = 0
        self.peak = 0  # the most downloads in flight at once

    def routes(self) -> list[Route]:
        return [
            Route(DOWNLOAD_PATH, self._download, methods=["GET"]),
            Route("/{version}/{media_id}", self._info, methods=["GET"]),
        ]

    def add(
        self,
        media_id: str,
        data: bytes,
        mime_type: str,
        *,
        status: int = 200,
        delay: float = 0.0,
        announce: int | None = None,
        url: str | None = None,
    ) -> StoredMedia:
        media = StoredMedia(media_id, data, mime_type, status, delay, announce, url)
        with self._lock:
            self._media[media_id] = media
        return media

    def reset(self) -> None:
        with self._lock:
            self._media.clear()
            self._in_flight = 0
            self.peak = 0

    def url(self, media_id: str) -> str:
        return f"{self._standin.url}{DOWNLOAD_PATH}?mid={media_id}"

    def downloads(self) -> list[RecordedRequest]:
        """The download requests (not the media-info ones), oldest first."""
        return [r for r in self._standin.requests if r.kind == "media_download"]

    def infos(self) -> list[RecordedRequest]:
        """The media-info requests (`GET /{version}/{media-id}`), oldest first."""
        return [r for r in self._standin.requests if r.kind == "media_info"]

    def control(self, payload: Mapping[str, Any]) -> None:
        """`{"op": "media", "media_id", "data_b64", "mime_type", "status", "delay"}`."""
        self.add(
            str(payload["media_id"]),
            base64.b64decode(str(payload.get("data_b64", ""))),
            str(payload.get("mime_type", "application/octet-stream")),
            status=int(payload.get("status", 200)),
            delay=float(payload.get("delay", 0.0)),
        )

    async def _info(self, request: Request) -> Response:
        standin = self._standin
        media_id = request.path_params["media_id"]
        record = await standin._receive(request, kind="media_info", extra={"media_id": media_id})
        if not self._authorized(request.headers.get("authorization")):
            return self._unauthorized(record)
        with self._lock:
            media = self._media.get(media_id)
        if media is None:
            return self._no_media(record, media_id)
        # Where this request came in (a script's stand-in is served without `start()`).
        own_url = f"{str(request.base_url).rstrip('/')}{DOWNLOAD_PATH}?mid={media_id}"
        body = {
            "messaging_product": "whatsapp",
            "url": media.url or own_url,
            "mime_type": media.mime_type,
            "sha256": hashlib.sha256(media.data).hexdigest(),
            "file_size": len(media.data) if media.announce is None else media.announce,
            "id": media_id,
        }
        return standin._answer(record, 200, body)

    async def _download(self, request: Request) -> Response:
        standin = self._standin
        media_id = request.query_params.get("mid", "")
        record = await standin._receive(
            request, kind="media_download", extra={"media_id": media_id}
        )
        if not self._authorized(request.headers.get("authorization")):
            return self._unauthorized(record)
        with self._lock:
            media = self._media.get(media_id)
            self._in_flight += 1
            self.peak = max(self.peak, self._in_flight)
        try:
            if media is not None and media.delay > 0:
                await standin._sleep(media.delay, record.generation)
        finally:
            with self._lock:
                self._in_flight -= 1
        if media is None:
            return self._no_media(record, media_id)
        if media.status != 200:
            return standin._answer(record, media.status, {"error": "not available"})
        standin._finish(record, 200, {"bytes": len(media.data)})
        return Response(media.data, media_type=media.mime_type)

    def _unauthorized(self, record: RecordedRequest) -> Response:
        body = {"error": {"message": "Invalid OAuth access token", "code": 190}}
        return self._standin._answer(record, 401, body, "unauthorized")

    def _no_media(self, record: RecordedRequest, media_id: str) -> Response:
        message = (
            f"Unsupported get request. Object with ID '{media_id}' does not exist, cannot be"
            " loaded due to missing permissions, or does not support this operation."
        )
        body = {"error": {"message": message, "type": "GraphMethodException", "code": 100}}
        return self._standin._answer(record, 400, body)
