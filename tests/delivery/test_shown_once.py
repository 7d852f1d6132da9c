"""Each thing shown once (issue 22, item 4), for every message sample the tests hold: each
message of tests/fixtures/whatsapp/ that starts a turn, plus Meta-shaped messages of the types the
fixtures lack (a voice note, a sticker, a PDF, a document Claude cannot open, a video, an image
without a caption, one whose file is gone) and messages Meta could not deliver in full (an
`interactive` with error 131000 "Unsupported webhook payload", an `unsupported` poll, a button
without its reply, an image with a media error, a type this product does not know).

Each is posted, signed, to the real receiver and answered by a real worker: the anthropic SDK
against the Messages API stand-in, its files from the Graph API stand-in, its voice note through
the speech-to-text stand-in. In what Claude was sent for it:
- what the customer wrote with a file (a caption, a file name) appears once, and so does
  every bracketed label;
- no bare `[image]`, `[audio]`, `[interactive]` (but as the label right before its image): a
  file comes as its label and the thing (an image or document block, a transcript), or as a
  sentence saying why it cannot be shown;
- a message Meta could not deliver in full is a sentence the model can act on (what it was,
  ask them to send it again or describe it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from receiver.providers.whatsapp import parse_body
from scripts.standins import GraphApiStandIn, MessagesApiStandIn, TranscribeApiStandIn
from tests.delivery.support import TENANT, InProcessWorkers, ai_requests, inbound, post_webhook
from tests.support.helpers import FIXTURES, standin_fixtures
from tests.support.shown import Sample, texts_of, what_is_wrong

pytestmark = pytest.mark.slow

STT_KEY = "stt-test-key"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2
WEBP = b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(range(64))
PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n"
DOCX = b"PK\x03\x04" + bytes(range(64))
OGG = b"OggS\x00\x02" + bytes(range(200))
TRANSCRIPT = "Hola, quería saber si tienen turno el sábado"
stt_server, stt = standin_fixtures("stt", lambda: TranscribeApiStandIn(api_keys=STT_KEY))


def _fixture_messages() -> list[tuple[str, dict[str, Any]]]:
    """(fixture name, message) of every fixture message that starts a turn (the receiver's own
    parse says which: events of kind "message")."""
    found = []
    for path in sorted((FIXTURES / "whatsapp").glob("*.json")):
        parsed = parse_body(path.read_bytes(), int(time.time() * 1000))
        for events in parsed.events.values():
            for event in events:
                if event["kind"] == "message":
                    raw = _raw_message(path, event["id"])
                    found.append((f"{path.stem}:{event['id']}", raw))
    return found


def _raw_message(path: Path, message_id: str) -> dict[str, Any]:
    body = orjson.loads(path.read_bytes())
    for entry in body["entry"]:
        for change in entry["changes"]:
            for message in change["value"].get("messages", []):
                if message["id"] == message_id:
                    return dict(message)
    raise AssertionError(f"{message_id} not in {path}")


def _said_in(message: dict[str, Any]) -> list[str]:
    """What the customer wrote that must reach Claude once: a text, a caption, a file name."""
    kind = message.get("type")
    body = message.get(kind) if isinstance(kind, str) else None
    if not isinstance(body, dict):
        return []
    if kind == "text":
        return [body["body"]]
    return [body[k] for k in ("caption", "filename") if isinstance(body.get(k), str)]


def _media(kind: str, media_id: str, **body: Any) -> dict[str, Any]:
    return {"type": kind, kind: {"id": media_id, "sha256": "x", **body}}


ERROR_131000 = {
    "code": 131000,
    "title": "Something went wrong",
    "message": "Something went wrong",
    "error_data": {"details": "Unsupported webhook payload"},
}

MADE_UP: list[Sample] = [
    Sample(
        "image without caption",
        _media("image", "9300000000001", mime_type="image/png"),
        blocks=["image"],
    ),
    Sample(
        "static sticker",
        _media("sticker", "9300000000002", mime_type="image/webp", animated=False),
        blocks=["image"],
    ),
    Sample(
        "animated sticker",
        _media("sticker", "9300000000003", mime_type="image/webp", animated=True),
    ),
    Sample(
        "voice note",
        _media("audio", "9300000000004", mime_type="audio/ogg; codecs=opus", voice=True),
        said=[TRANSCRIPT],
    ),
    Sample(
        "pdf",
        _media(
            "document",
            "9300000000005",
            mime_type="application/pdf",
            filename="presupuesto.pdf",
            caption="el de ayer",
        ),
        said=["presupuesto.pdf", "el de ayer"],
        blocks=["document"],
    ),
    Sample(
        "docx",
        _media("document", "9300000000006", mime_type="application/msword", filename="plano.docx"),
        said=["plano.docx"],
    ),
    Sample(
        "video",
        _media("video", "9300000000007", mime_type="video/mp4", caption="mirá cómo gotea"),
        said=["mirá cómo gotea"],
    ),
    Sample(
        "image gone",  # unknown to the stand-in: a media id past Meta's 7 days
        _media("image", "9300000000008", mime_type="image/jpeg", caption="la factura"),
        said=["la factura"],
        sentence=True,
    ),
    Sample(
        "interactive Meta could not deliver (131000)",
        {"type": "interactive", "errors": [ERROR_131000], "interactive": {"type": "unknown"}},
        said=["Unsupported webhook payload"],
        sentence=True,
    ),
    Sample(
        "interactive without a body",
        {"type": "interactive", "errors": [ERROR_131000]},
        sentence=True,
    ),
    Sample(
        "image with a media error",
        {
            "type": "image",
            "errors": [{"code": 131052, "title": "Media download error"}],
            "image": {"caption": "foto"},
        },
        said=["foto"],
        sentence=True,
    ),
    Sample("button without its reply", {"type": "button", "button": {}}, sentence=True),
    Sample("a type not known yet", {"type": "ephemeral", "ephemeral": {}}, sentence=True),
]


def _samples() -> list[Sample]:
    samples = []
    for name, message in _fixture_messages():
        kind = message.get("type")
        undelivered = bool(message.get("errors")) or kind == "unsupported"
        blocks = ["image"] if kind == "image" else []
        samples.append(Sample(name, message, _said_in(message), blocks, undelivered))
    return [*samples, *MADE_UP]


SAMPLES = _samples()


async def test_every_sample_reaches_claude_with_each_thing_once(
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    stt: TranscribeApiStandIn,
) -> None:
    assert len(SAMPLES) == len(_fixture_messages()) + len(MADE_UP) >= 30
    graph.media.add("880000000000007", PNG, "image/png")  # tests/fixtures/whatsapp/image.json
    graph.media.add("9300000000001", PNG, "image/png")
    graph.media.add("9300000000002", WEBP, "image/webp")
    graph.media.add("9300000000004", OGG, "audio/ogg")
    graph.media.add("9300000000005", PDF, "application/pdf")
    graph.media.add("9300000000006", DOCX, "application/msword")
    stt.transcript_for(OGG, TRANSCRIPT)
    await workers.start(TRANSCRIBE_BASE_URL=f"{stt.url}/v1", TRANSCRIBE_API_KEY=STT_KEY)

    problems: dict[str, list[str]] = {}
    for number, sample in enumerate(SAMPLES):
        person = f"54911555{number:05d}"
        message = {
            **sample.message,
            "from": person,
            "id": f"wamid.SHOWN{number:04d}",
            "timestamp": str(int(time.time())),
        }
        await post_webhook(receiver_url, inbound(TENANT, person, message))
        await graph.await_for(_sent_to(graph, person), timeout=20)
        content = ai_requests(ai)[-1].body["messages"][-1]["content"]
        wrong = what_is_wrong(sample, content)
        if wrong:
            problems[sample.name] = [*wrong, texts_of(content)]
    assert problems == {}
    assert len(ai_requests(ai)) == len(SAMPLES), "one turn each, no retry for a file"


def _sent_to(graph: GraphApiStandIn, person: str) -> Callable[[], Any]:
    return lambda: graph.sent_texts(to=person)
