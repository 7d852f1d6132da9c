"""Each thing shown once (issue 22, item 4), for Chatwoot's attachments: signed
`message_created` webhooks through the real receiver, a real worker turn (the anthropic SDK
against the Messages API stand-in, the files from a host listed in `CHATWOOT_MEDIA_HOSTS`, the
voice note through the speech-to-text stand-in, the reply through the Chatwoot stand-in).

Chatwoot's content is the first file's caption: it reaches Claude once, in that file's label
next to the file (it used to come in the text and again in the label). An attachment that could
not be fetched is a sentence with what came with it and what to do; one that is no file (a
location, a contact) is said in the text; one Chatwoot itself could not show (`fallback`) is a
sentence. The same checks as WhatsApp's samples (tests/support/shown.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins import (
    BackgroundServer,
    ChatwootApiStandIn,
    MessagesApiStandIn,
    TranscribeApiStandIn,
    chatwoot_headers,
)
from scripts.webhooks import message_created
from tests.chatwoot.support import WEBHOOK_SECRET
from tests.delivery.support import InProcessWorkers, ai_requests
from tests.support.helpers import API_KEY, standin_fixtures
from tests.support.shown import Sample, texts_of, what_is_wrong

pytestmark = pytest.mark.slow

STT_KEY = "stt-test-key"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2
PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n"
OGG = b"OggS\x00\x02" + bytes(range(200))
TRANSCRIPT = "Buenas, ¿a qué hora abren mañana?"
FILES = {".png": (PNG, "image/png"), ".pdf": (PDF, "application/pdf"), ".ogg": (OGG, "audio/ogg")}

stt_server, stt = standin_fixtures("stt", lambda: TranscribeApiStandIn(api_keys=STT_KEY))


@pytest.fixture(autouse=True)
def anthropic_env(ai: MessagesApiStandIn, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # In-process workers build their SDK client here: it reads these from the environment.
    monkeypatch.setenv("ANTHROPIC_BASE_URL", ai.url)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    yield


async def _file(request: Request) -> Response:
    """Chatwoot's storage: a file by its extension; anything else is gone."""
    name = request.path_params["name"]
    for extension, (data, mime) in FILES.items():
        if name.endswith(extension):
            return Response(data, media_type=mime)
    return Response(b"gone", status_code=404)


@pytest.fixture
async def storage() -> AsyncIterator[str]:
    app = Starlette(routes=[Route("/files/{name}", _file)])
    async with BackgroundServer(app, name="storage") as server:
        yield server.url


def _attachment(kind: str, **fields: Any) -> dict[str, Any]:
    """An attachment as Chatwoot's `Attachment#push_event_data` gives it."""
    return {"id": 1, "message_id": 1, "file_type": kind, "account_id": 1, **fields}


def _samples(storage: str) -> list[Sample]:
    def file(kind: str, name: str) -> dict[str, Any]:
        url = f"{storage}/files/{name}"
        return _attachment(kind, data_url=url, thumb_url=url, extension=name.rsplit(".")[-1])

    def sample(name: str, content: str | None, *attachments: dict[str, Any], **kw: Any) -> Sample:
        return Sample(name, {"content": content, "attachments": list(attachments)}, **kw)

    return [
        sample(
            "image with caption",
            "así está la canilla",
            file("image", "canilla.png"),
            said=["así está la canilla"],
            blocks=["image"],
        ),
        sample(
            "two images, one caption",
            "las dos paredes",
            file("image", "a.png"),
            file("image", "b.png"),
            said=["las dos paredes"],
            blocks=["image", "image"],
        ),
        sample("image alone", None, file("image", "sola.png"), blocks=["image"]),
        sample(
            "pdf",
            "el presupuesto",
            file("file", "p.pdf"),
            said=["el presupuesto"],
            blocks=["document"],
        ),
        sample("voice note", None, file("audio", "nota.ogg"), said=[TRANSCRIPT]),
        sample(
            "video",
            "mirá cómo gotea",
            file("video", "v.mp4"),
            said=["mirá cómo gotea"],
        ),
        sample(
            "image that could not be fetched",
            "la factura",
            file("image", "borrada.jpg"),
            said=["la factura"],
            sentence=True,
        ),
        sample(
            "location",
            None,
            _attachment(
                "location",
                coordinates_lat=-34.6037,
                coordinates_long=-58.3816,
                fallback_title="Av. Corrientes 1234",
            ),
            said=["Av. Corrientes 1234", "-34.6037, -58.3816"],
        ),
        sample(
            "contact",
            "mi hermano",
            _attachment("contact", fallback_title="+54 9 11 5555 0002"),
            said=["mi hermano", "+54 9 11 5555 0002"],
        ),
        sample("what Chatwoot could not show", None, _attachment("fallback"), sentence=True),
    ]


async def test_every_attachment_reaches_claude_once(
    receiver_url: str,
    workers: InProcessWorkers,
    chatwoot: ChatwootApiStandIn,
    ai: MessagesApiStandIn,
    stt: TranscribeApiStandIn,
    storage: str,
) -> None:
    stt.transcript_for(OGG, TRANSCRIPT)
    await workers.start(
        BRAIN="anthropic",
        ANTHROPIC_API_KEY=API_KEY,
        AI_MODEL="claude-test-model",
        AI_TIMEOUT_S="5",
        CHATWOOT_MEDIA_HOSTS=storage,
        TRANSCRIBE_BASE_URL=f"{stt.url}/v1",
        TRANSCRIBE_API_KEY=STT_KEY,
    )
    samples = _samples(storage)
    problems: dict[str, list[str]] = {}
    for number, sample in enumerate(samples):
        conversation = 4200 + number
        body = orjson.dumps(
            message_created(
                message_id=9400 + number,
                content=sample.message["content"],
                conversation=conversation,
                attachments=sample.message["attachments"],
            )
        )
        async with httpx.AsyncClient() as client:
            response = await client.post(
                receiver_url, content=body, headers=chatwoot_headers(body, WEBHOOK_SECRET)
            )
        assert response.status_code == 200, response.text
        await chatwoot.await_for(lambda c=conversation: chatwoot.replies(c), timeout=20)
        content = ai_requests(ai)[-1].body["messages"][-1]["content"]
        wrong = what_is_wrong(sample, content)
        if wrong:
            problems[sample.name] = [*wrong, texts_of(content)]
    assert problems == {}
    assert len(ai_requests(ai)) == len(samples), "one turn each, no retry for a file"
