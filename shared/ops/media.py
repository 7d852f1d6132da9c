"""The file of a customer's message, fetched for the ops page through the product's own media
fetch (shared/fetch.py): the same allowed hosts and address checks as the worker's fetches for
the AI (worker/brains/media.py), the provider's token sent only where it may go, never shown.

The page asks for a message of a person (`GET /ops/media?tenant=&person=&id=`), never for a URL:
the reference is the one Redis holds for that message (shared/ops/thread.py
`message_event`), so nobody can make the receiver fetch an address of their choosing.

- WhatsApp: `GET {WHATSAPP_API_BASE_URL}/{version}/{media id}` with the tenant's token gives the
  file's url, then `GET url` with the token gives the bytes; a webhook's own `url` is used
  directly only when its host is one the token may go to.
- Chatwoot: the attachment's `data_url`, no token, only from `CHATWOOT_BASE_URL`'s host or
  `CHATWOOT_MEDIA_HOSTS`.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from shared.conversation.kept_files import File
from shared.fetch import MediaFetcher, MediaHosts, Origin, TooBig, Unfetchable, origin_of
from shared.settings import Settings

INFO_MAX_BYTES = 1024 * 1024  # the Graph API's answer for a media id is a few hundred bytes
# What the page shows inline; anything else is offered as a download of unknown type (an SVG
# or HTML file served with its own type could run script on the page's origin).
INLINE_TYPES = frozenset(
    {
        "image/jpeg",
        "image/png",
        "image/webp",
        "image/gif",
        "audio/ogg",
        "audio/mpeg",
        "audio/mp4",
        "audio/aac",
        "audio/amr",
    }
)


class MediaError(Exception):
    """The file cannot be had: the message says why, in a sentence for the page."""


@dataclass(frozen=True)
class Media:
    body: bytes
    content_type: str


class OpsMedia:
    """One per receiver process (one httpx client)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._hosts = MediaHosts.of(settings)
        self._fetcher = MediaFetcher(self._hosts, settings.media_timeout_s)

    async def aclose(self) -> None:
        await self._fetcher.aclose()

    async def get(self, tenant: str, file: File) -> Media:
        limit = self._settings.media_max_bytes
        try:
            if not file.fetchable:
                raise MediaError("the message holds no reference to its file")
            if file.channel != "whatsapp":
                got = await self._fetcher.get(file.url, allowed=self._hosts.chatwoot, limit=limit)
                return Media(got.body, file.mime_type or _mime(got.content_type))
            token = self._settings.tenant(tenant).whatsapp_access_token
            if not token:
                raise MediaError("the tenant has no WhatsApp token to fetch its media with")
            headers = {"Authorization": f"Bearer {token}"}
            url, allowed, mime = await self._whatsapp_source(file, headers, limit)
            got = await self._fetcher.get(url, allowed=allowed, limit=limit, headers=headers)
            return Media(got.body, mime or _mime(got.content_type))
        except TooBig:
            raise MediaError("the file is larger than MEDIA_MAX_BYTES") from None
        except Unfetchable as exc:
            raise MediaError(f"the provider did not give the file ({exc})") from None

    async def _whatsapp_source(
        self, file: File, headers: dict[str, str], limit: int
    ) -> tuple[str, frozenset[Origin], str]:
        if file.url and origin_of(file.url) in self._hosts.whatsapp:
            return file.url, self._hosts.whatsapp, file.mime_type
        if not file.media_id:
            raise MediaError("no media id, and the url's host is not one for the token")
        s = self._settings
        info_url = f"{s.whatsapp_api_base_url}/{s.whatsapp_api_version}/{file.media_id}"
        graph = frozenset({self._hosts.graph}) if self._hosts.graph else frozenset()
        answer = await self._fetcher.get(
            info_url, allowed=graph, limit=INFO_MAX_BYTES, headers=headers
        )
        try:
            info = orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            info = None
        if not isinstance(info, dict) or not isinstance(info.get("url"), str):
            raise MediaError("the Graph API's answer for the media id holds no url")
        if int(info.get("file_size") or 0) > limit:
            raise TooBig(info["file_size"])
        url = info["url"]
        return url, self._hosts.for_download(url), _mime(info.get("mime_type")) or file.mime_type


def _mime(value: object) -> str:
    return value.split(";", 1)[0].strip().lower() if isinstance(value, str) else ""
