"""worker/brains/media.py on its own: Chatwoot attachments fetched from their `data_url` on
Chatwoot's host (no token sent), a WhatsApp webhook's own `url` on a listed host used directly,
what is never downloaded (a video, an animated sticker), and the files past a request's 32 MB kept
out of it. A small HTTP server stands in for where the files live. The hosts media may come from
and the addresses it may not: tests/delivery/test_media_hosts.py, tests/chatwoot/test_media_hosts.py
and shared/fetch.py's own checks below."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins import BackgroundServer
from shared.chatwoot import CHANNEL as CHATWOOT
from shared.conversation.batch import Batch, Message
from shared.settings import Settings
from worker.brains import media
from worker.brains.media import MediaLoader

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
PDF = b"%PDF-1.4\n%%EOF\n"


class Files:
    """Serves `/files/{name}` with the content type its extension says; records the
    Authorization header of each request."""

    def __init__(self) -> None:
        self.auth: list[str | None] = []
        self.app = Starlette(routes=[Route("/files/{name}", self._file)])

    async def _file(self, request: Request) -> Response:
        self.auth.append(request.headers.get("authorization"))
        name = request.path_params["name"]
        if name.endswith(".png"):
            return Response(PNG, media_type="image/png")
        if name.endswith(".pdf"):
            return Response(PDF, media_type="application/pdf; qs=0.001")
        return Response(b"gone", status_code=404)


@pytest.fixture
async def files() -> AsyncIterator[tuple[Files, str]]:
    served = Files()
    async with BackgroundServer(served.app, name="files") as server:
        yield served, server.url


def _batch(*messages: Message) -> Batch:
    return Batch("106540352242922", "p", "b1", "tok", 0, 0, 0, False, list(messages))


def _loader(**overrides: str) -> MediaLoader:
    env = {"WHATSAPP_ACCESS_TOKEN": "global-token", **overrides}
    return MediaLoader(Settings.from_env(env))


async def _blocks(loader: MediaLoader, batch: Batch) -> list[dict[str, Any]]:
    try:
        return await loader.blocks(batch, asyncio.get_running_loop().time() + 30)
    finally:
        await loader.aclose()


async def test_chatwoot_attachments_come_from_their_data_url_without_a_token(
    files: tuple[Files, str],
) -> None:
    served, url = files
    raw = {
        "content": "el presupuesto y la foto",
        "attachments": [
            {"file_type": "file", "data_url": f"{url}/files/presupuesto.pdf"},
            {"file_type": "image", "data_url": f"{url}/files/foto.png"},
            {"file_type": "image", "data_url": f"{url}/files/borrada.png.old"},
        ],
    }
    text = "[document: el presupuesto y la foto]"
    message = Message("1", "document", text, 0, raw=raw, channel=CHATWOOT)
    blocks = await _blocks(_loader(CHATWOOT_BASE_URL=url), _batch(message))

    assert [b["type"] for b in blocks] == ["text", "document", "text", "image", "text"]
    assert blocks[0]["text"] == "[document: el presupuesto y la foto]"  # the caption kept
    assert base64.b64decode(blocks[1]["source"]["data"]) == PDF
    assert blocks[1]["source"]["media_type"] == "application/pdf"  # parameters dropped
    assert base64.b64decode(blocks[3]["source"]["data"]) == PNG
    assert blocks[4]["text"] == (
        "[the customer sent an image that could not be downloaded;"
        " ask them to send it again or to describe it]"
    )
    assert served.auth == [None, None, None]  # Chatwoot's links carry no token of ours


async def test_a_webhook_url_on_a_listed_host_is_downloaded_directly_with_the_token(
    files: tuple[Files, str],
) -> None:
    served, url = files
    raw = {"type": "image", "image": {"url": f"{url}/files/a.png", "mime_type": "image/png"}}
    loader = _loader(WHATSAPP_MEDIA_HOSTS=url)
    blocks = await _blocks(loader, _batch(Message("1", "image", "[image]", 0, raw=raw)))

    assert [b["type"] for b in blocks] == ["text", "image"]
    assert served.auth == ["Bearer global-token"]


async def test_videos_and_animated_stickers_are_described_not_downloaded() -> None:
    video = {"type": "video", "video": {"id": "1", "caption": "mirá cómo gotea"}}
    sticker = {"type": "sticker", "sticker": {"id": "2", "animated": True}}
    batch = _batch(
        Message("1", "video", "[video: mirá cómo gotea]", 0, raw=video),
        Message("2", "sticker", "[sticker]", 0, raw=sticker),
    )
    # The Graph API URL points nowhere: a download would fail and say so instead.
    blocks = await _blocks(_loader(WHATSAPP_API_BASE_URL="http://127.0.0.1:9"), batch)

    assert [b["text"] for b in blocks] == [
        "[video: mirá cómo gotea] (videos cannot be watched)",
        "[the customer sent an animated sticker]",
    ]


def test_files_past_the_request_budget_become_sentences() -> None:
    item = media.Item(kind="document")
    big = [{"type": "text", "text": "[document]"}, media._source_block("document", "x", b"")]
    big[1]["source"]["data"] = "A" * (media.REQUEST_MEDIA_BUDGET // 2 + 1)
    kept = media._within_budget([item, item], [big, big])

    assert kept[:2] == big  # the first fits
    too_large = (
        "[the customer sent a document too large to open;"
        " ask them to send it again or to describe it]"
    )
    assert kept[2:] == [{"type": "text", "text": too_large}]
