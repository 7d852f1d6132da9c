"""The media of a batch, fetched by the worker during the turn, as content blocks for Claude.

Never in the receiver: its hot path stores the webhook and answers. The brain calls
`MediaLoader.blocks(batch, deadline)` before it builds the request; the blocks follow the
batch's text in the last user message (worker/brains/prompt.py).

Where the files come from:
- WhatsApp, as Meta documents it: `GET {WHATSAPP_API_BASE_URL}/{WHATSAPP_API_VERSION}/{media-id}`
  with the tenant's bearer token answers JSON `{url, mime_type, sha256, file_size}`, then
  `GET url` with the same token gives the bytes (the url lives 5 minutes, the media id 7 days).
  A webhook that carries its own `url` is downloaded from it directly (with the token too) when
  its host is one the token may go to (the Graph API's, Meta's media host, `WHATSAPP_MEDIA_HOSTS`);
  any other `url` is ignored for the media id.
- Chatwoot: each attachment's `data_url`, as the webhook gave it (no token), when it is on
  `CHATWOOT_BASE_URL`'s host or one of `CHATWOOT_MEDIA_HOSTS`; any other is not fetched.
Every fetch, redirects and addresses checked, goes through shared/fetch.py.

What Claude gets (each file once: the batch's text leaves the files to these blocks,
shared/conversation/files.py):
- images (jpeg, png, webp, gif) as image blocks, base64, after a text block naming the message
  (`[image: caption]`, the only place the caption is); PDFs as document blocks the same way;
  a static sticker as the image ("a sticker"), an animated one as a sentence;
- a voice note or audio file as its transcription (worker/brains/transcribe.py):
  `[voice note, transcribed]: ...`; with no transcriber configured, a sentence saying a voice
  note arrived that the AI cannot hear;
- a video as its caption and a note that videos cannot be watched (nothing downloaded).

A file larger than `MEDIA_MAX_BYTES` (an image larger than 3.75 MB, past the API's limit of 5 MB
of base64; the files of one turn past 30 MB of base64, the request's limit being 32), of a type
Claude cannot read, gone (404, 410: Meta keeps media 7 days), unreachable, refused or slower than
`MEDIA_TIMEOUT_S` becomes one plain sentence for the AI, with what came with the file and what to
do ('[the customer sent an image ("caption") that could not be downloaded; ask them to send it
again or to describe it]'); never a retry of the turn, which would only fetch it again. All of a
turn's files are fetched at once, each bounded by `MEDIA_TIMEOUT_S` and by half of the time the
turn has left (the AI call needs the rest); the turn's lease renewal cancels them with the turn.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import httpx
import orjson

from shared.conversation.batch import Batch
from shared.conversation.files import ASK_TO_WRITE, Item, items_of_message, to_int
from shared.conversation.files import mime as mime_of
from shared.fetch import MediaFetcher, MediaHosts, Origin, TooBig, Unfetchable, origin_of
from shared.settings import Settings
from worker.brains.transcribe import TranscribeError, Transcriber

log = logging.getLogger(__name__)

IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/webp", "image/gif"})
# The Messages API takes an image of at most 5 MB as base64 (3.75 MB of file), and a request
# of at most 32 MB (https://platform.claude.com/docs/en/build-with-claude/vision, pdf-support):
# the files of a turn take up to 30 MB of base64, the rest of the request fits in what is left.
IMAGE_MAX_BYTES = 5 * 1024 * 1024 * 3 // 4
REQUEST_MEDIA_BUDGET = 30 * 1024 * 1024
PDF = "application/pdf"
INFO_MAX_BYTES = 1024 * 1024  # the Graph API's answer for a media id is a few hundred bytes


class MediaUnavailable(Exception):
    """The file cannot be had (no media id, not the JSON Meta documents)."""


def items_of(batch: Batch) -> list[Item]:
    """The files of the batch's messages, in order."""
    found: list[Item] = []
    for message in batch.messages:
        found.extend(items_of_message(message))
    return found


class MediaLoader:
    """Fetches and presents a batch's files; one per brain (one httpx client, one
    transcriber)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._hosts = MediaHosts.of(settings)
        self._fetcher = MediaFetcher(self._hosts, settings.media_timeout_s)
        self._transcriber = (
            Transcriber(settings, self._fetcher.client) if settings.transcribe_base_url else None
        )

    async def aclose(self) -> None:
        await self._fetcher.aclose()

    async def blocks(self, batch: Batch, deadline: float) -> list[dict[str, Any]]:
        """Content blocks for the batch's files, in order, all fetched at once; `deadline`
        (the event loop's clock) is when the turn must be over."""
        items = items_of(batch)
        if not items:
            return []
        left = deadline - asyncio.get_running_loop().time()
        timeout_s = max(0.1, min(self._settings.media_timeout_s, left / 2))
        presented = await asyncio.gather(*(self._one(batch, item, timeout_s) for item in items))
        return _within_budget(items, presented)

    async def _one(self, batch: Batch, item: Item, timeout_s: float) -> list[dict[str, Any]]:
        if item.kind == "video":
            return [_text(f"{item.label} (videos cannot be watched)")]
        if item.kind == "sticker" and item.animated:
            return [_text("[the customer sent an animated sticker]")]
        if item.kind == "audio" and self._transcriber is None:
            return [_text(item.not_shown("that you cannot hear", ASK_TO_WRITE))]
        try:
            async with asyncio.timeout(timeout_s):
                data, mime = await self._fetch(batch.tenant, item)
                return await self._present(item, data, mime)
        except TooBig:
            return [_text(item.not_shown("too large to open"))]
        except TranscribeError as exc:
            log.warning("transcription failed tenant=%s batch=%s: %s", batch.tenant, batch.id, exc)
            return [_text(item.not_shown("that could not be transcribed"))]
        except (MediaUnavailable, Unfetchable, httpx.HTTPError, TimeoutError, ValueError) as exc:
            log.warning(
                "media unavailable tenant=%s batch=%s %s: %r",
                batch.tenant,
                batch.id,
                item.kind,
                exc,
            )
            return [_text(item.not_shown("that could not be downloaded"))]

    async def _fetch(self, tenant: str, item: Item) -> tuple[bytes, str]:
        """(bytes, mime type) of the file."""
        limit = self._limit(item)
        if item.size > limit:
            raise TooBig(item.size)
        if not item.url and not item.media_id:
            raise MediaUnavailable("no media id nor url")
        if not item.token:  # Chatwoot's attachments: no token of ours
            got = await self._fetcher.get(item.url, allowed=self._hosts.chatwoot, limit=limit)
            return got.body, item.mime_type or mime_of(got.content_type)
        headers = {"Authorization": f"Bearer {self._token(tenant)}"}
        url, allowed, mime = await self._whatsapp_source(tenant, item, headers, limit)
        got = await self._fetcher.get(url, allowed=allowed, limit=limit, headers=headers)
        return got.body, mime or mime_of(got.content_type)

    async def _whatsapp_source(
        self, tenant: str, item: Item, headers: dict[str, str], limit: int
    ) -> tuple[str, frozenset[Origin], str]:
        """(url, the origins it may lead to, mime type) of a WhatsApp file: the webhook's own
        url when the token may go there, else the one the Graph API gives for the media id."""
        if item.url and origin_of(item.url) in self._hosts.whatsapp:
            return item.url, self._hosts.whatsapp, item.mime_type
        if item.url:
            # Whoever wrote the url may not have the token: Meta's answer for the id says where.
            origin = origin_of(item.url)
            log.warning("media url of an unlisted host ignored tenant=%s host=%s", tenant, origin)
        if not item.media_id:
            raise MediaUnavailable("no media id, and the url's host is not one for the token")
        s = self._settings
        info_url = f"{s.whatsapp_api_base_url}/{s.whatsapp_api_version}/{item.media_id}"
        graph = frozenset({self._hosts.graph}) if self._hosts.graph else frozenset()
        try:
            answer = await self._fetcher.get(
                info_url, allowed=graph, limit=INFO_MAX_BYTES, headers=headers
            )
        except Unfetchable as exc:
            raise MediaUnavailable(f"media id: {exc}") from exc
        info = orjson.loads(answer.body)
        if not isinstance(info, dict) or not isinstance(info.get("url"), str):
            raise MediaUnavailable("media id: no url in the answer")
        if to_int(info.get("file_size")) > limit:
            raise TooBig(info["file_size"])
        url = info["url"]
        return url, self._hosts.for_download(url), mime_of(info.get("mime_type")) or item.mime_type

    def _limit(self, item: Item) -> int:
        if item.kind in ("image", "sticker"):
            return min(IMAGE_MAX_BYTES, self._settings.media_max_bytes)
        return self._settings.media_max_bytes

    def _token(self, tenant: str) -> str:
        return self._settings.tenant(tenant).whatsapp_access_token

    async def _present(self, item: Item, data: bytes, mime: str) -> list[dict[str, Any]]:
        if item.kind == "audio":
            assert self._transcriber is not None
            text = (await self._transcriber.text(data, mime)).strip()
            what = "voice note" if item.voice else "audio"
            return [_text(f"[{what}, transcribed]: {text or '(nothing audible)'}")]
        if item.kind in ("image", "sticker"):
            if mime not in IMAGE_TYPES:
                return [_text(item.not_shown("in a format you cannot see"))]
            label = "[a sticker]" if item.kind == "sticker" else item.label
            return [_text(label), _source_block("image", mime, data)]
        if mime == PDF:
            return [_text(item.label), _source_block("document", PDF, data)]
        return [_text(f"{item.label} (a file of type {mime or 'unknown'} that you cannot open)")]


def _within_budget(
    items: list[Item], presented: list[list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The blocks, in order, with the files past the request's budget of base64 (the request
    would be refused whole) replaced by the sentence of a file too large."""
    left = REQUEST_MEDIA_BUDGET
    kept: list[dict[str, Any]] = []
    for item, blocks in zip(items, presented, strict=True):
        size = sum(len(b["source"]["data"]) for b in blocks if "source" in b)
        if size > left:
            blocks = [_text(item.not_shown("too large to open"))]
        left -= size if size <= left else 0
        kept.extend(blocks)
    return kept


def _source_block(kind: str, mime: str, data: bytes) -> dict[str, Any]:
    source = {"type": "base64", "media_type": mime, "data": base64.b64encode(data).decode()}
    return {"type": kind, "source": source}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
