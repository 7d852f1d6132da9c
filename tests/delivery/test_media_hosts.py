"""The Graph token goes only where it belongs, and no media fetch reaches inside: signed webhooks
through the real receiver and a real worker turn (the Claude brain against the Messages API
stand-in, media from the Graph API stand-in), with hosts of the tests' own on other loopback ports
standing in for a host inside the network and for a media proxy (tests/support/inside_host.py).

What each hostile input gets:
- an image, a document or a voice note whose `url` points at another host: the url is ignored
  and never called; the media id is fetched from the Graph API and the file reaches the AI;
- such a url without a media id: "could not be downloaded", nothing sent there;
- a listed host (`WHATSAPP_MEDIA_HOSTS`, a media proxy) is fetched with the token; a redirect
  from it to another host is not followed: "could not be downloaded";
- a media-id answer whose url names a host inside (by name or by address): refused before
  connecting: "could not be downloaded".
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from scripts.standins import GraphApiStandIn, MessagesApiStandIn, TranscribeApiStandIn
from tests.delivery.support import TENANT, InProcessWorkers, ai_requests, inbound, post_webhook
from tests.support.helpers import TENANT_TOKEN
from tests.support.inside_host import PNG, Call, RecordingHost, recording_host

PERSON = "5491155550091"
STT_KEY = "stt-test-key"
PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n"
OGG = b"OggS\x00\x02" + bytes(range(200))
NOT_DOWNLOADED = (
    "[the customer sent an image that could not be downloaded;"
    " ask them to send it again or to describe it]"
)


@pytest.fixture
async def inside() -> AsyncIterator[RecordingHost]:
    async with recording_host("inside") as host:
        yield host


@pytest.fixture
async def proxy() -> AsyncIterator[RecordingHost]:
    async with recording_host("proxy") as host:
        yield host


@pytest.fixture
def stt() -> Iterator[TranscribeApiStandIn]:
    with TranscribeApiStandIn(api_keys=STT_KEY) as standin:
        yield standin


def _message(message_id: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    stamp = str(int(time.time()))
    return {"from": PERSON, "id": message_id, "timestamp": stamp, "type": kind, kind: body}


async def _turn(
    receiver_url: str, graph: GraphApiStandIn, ai: MessagesApiStandIn, *messages: dict[str, Any]
) -> list[dict[str, Any]]:
    """Post the messages as one signed webhook; the content of the user message Claude was
    asked, once the reply went out."""
    await post_webhook(receiver_url, inbound(TENANT, PERSON, *messages))
    await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=20)
    (request,) = ai_requests(ai)
    content: list[dict[str, Any]] = request.body["messages"][-1]["content"]
    return content


def _texts(content: list[dict[str, Any]]) -> str:
    return "\n".join(b["text"] for b in content if b["type"] == "text")


def _sources(content: list[dict[str, Any]], kind: str) -> list[bytes]:
    return [base64.b64decode(b["source"]["data"]) for b in content if b["type"] == kind]


async def test_a_payload_url_elsewhere_never_gets_the_token_and_the_media_id_is_used(
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    inside: RecordingHost,
    stt: TranscribeApiStandIn,
) -> None:
    graph.media.add("9200000000001", PNG, "image/png")
    graph.media.add("9200000000002", PDF, "application/pdf")
    graph.media.add("9200000000003", OGG, "audio/ogg")
    stt.transcript_for(OGG, "¿tienen turno el sábado?")
    await workers.start(TRANSCRIBE_BASE_URL=f"{stt.url}/v1", TRANSCRIBE_API_KEY=STT_KEY)
    hostile = f"{inside.url}/whatsapp_business/attachments/?mid="
    content = await _turn(
        receiver_url,
        graph,
        ai,
        _message("wamid.h1", "image", {"id": "9200000000001", "url": f"{hostile}1"}),
        _message(
            "wamid.h2",
            "document",
            {"id": "9200000000002", "url": f"{hostile}2", "filename": "presupuesto.pdf"},
        ),
        _message("wamid.h3", "audio", {"id": "9200000000003", "url": f"{hostile}3", "voice": True}),
    )

    assert inside.calls == []  # never called, so the token never went there
    infos = sorted(r.extra["media_id"] for r in graph.media.infos())
    assert infos == ["9200000000001", "9200000000002", "9200000000003"]
    assert {r.headers["authorization"] for r in graph.media.downloads()} == {
        f"Bearer {TENANT_TOKEN}"
    }
    assert _sources(content, "image") == [PNG]
    assert _sources(content, "document") == [PDF]
    assert "[voice note, transcribed]: ¿tienen turno el sábado?" in _texts(content)


async def test_a_payload_url_elsewhere_without_a_media_id_is_not_fetched(
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    inside: RecordingHost,
) -> None:
    await workers.start()
    image = {"url": f"{inside.url}/latest/meta-data/", "mime_type": "image/png"}
    content = await _turn(receiver_url, graph, ai, _message("wamid.h4", "image", image))

    assert NOT_DOWNLOADED in _texts(content)
    assert inside.calls == [] and graph.media.infos() == []


async def test_a_listed_host_gets_the_token_but_its_redirect_elsewhere_is_not_followed(
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    inside: RecordingHost,
    proxy: RecordingHost,
) -> None:
    await workers.start(WHATSAPP_MEDIA_HOSTS=f"cdn.example.com, {proxy.url}")
    listed = {"url": f"{proxy.url}/media/1.png", "mime_type": "image/png"}
    redirected = {"url": proxy.redirect(f"{inside.url}/media/2.png"), "mime_type": "image/png"}
    content = await _turn(
        receiver_url,
        graph,
        ai,
        _message("wamid.h5", "image", listed),
        _message("wamid.h6", "image", redirected),
    )

    assert _sources(content, "image") == [PNG]  # the listed host's file
    assert NOT_DOWNLOADED in _texts(content)  # the redirect's
    assert sorted(proxy.calls, key=lambda c: c.path) == [
        Call("/media/1.png", f"Bearer {TENANT_TOKEN}"),
        Call("/redirect", f"Bearer {TENANT_TOKEN}"),
    ]
    assert inside.calls == [] and graph.media.infos() == []


async def test_a_media_id_answer_pointing_inside_is_refused_before_connecting(
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    inside: RecordingHost,
) -> None:
    """The Graph API's answer is trusted for where the file is, not for reaching inside: a
    name that resolves to a loopback address, and the address itself, are refused alike."""
    by_name = inside.url.replace("127.0.0.1", "localhost")
    graph.media.add("9200000000007", PNG, "image/png", url=f"{by_name}/steal")
    graph.media.add("9200000000008", PNG, "image/png", url=f"{inside.url}/steal")
    await workers.start()
    content = await _turn(
        receiver_url,
        graph,
        ai,
        _message("wamid.h7", "image", {"id": "9200000000007"}),
        _message("wamid.h8", "image", {"id": "9200000000008"}),
    )

    assert _texts(content).count(NOT_DOWNLOADED) == 2
    assert len(graph.media.infos()) == 2 and inside.calls == []
