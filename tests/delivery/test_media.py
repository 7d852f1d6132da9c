"""Media of inbound messages, through the real receiver and a real worker: images and PDFs
fetched from the Graph API stand-in (media id, then its url, with the tenant's token) reach the
Messages API stand-in as image and document blocks; voice notes go through the speech-to-text
stand-in and reach it as text. A file that cannot be had (gone, too big, too slow) becomes a
sentence for the AI: the turn is answered once, never retried for it.

What each bad input gets: a media id Meta does not know (400) or a url gone (404) -> "could not be
downloaded"; a file announced larger than MEDIA_MAX_BYTES -> "too large to open", not downloaded;
a download slower than the turn allows -> "could not be downloaded", the turn answered in time;
a voice note with no transcriber configured -> "which you cannot hear", not downloaded."""

from __future__ import annotations

import base64
import time
from typing import Any

from scripts.standins import GraphApiStandIn, MessagesApiStandIn, TranscribeApiStandIn
from tests.delivery.support import TENANT, InProcessWorkers, ai_requests, inbound, post_webhook
from tests.support.helpers import TENANT_TOKEN, standin_fixtures
from tests.worker.support import WorkerFleet

PERSON = "5491155550071"
STT_KEY = "stt-test-key"
# Enough of each format's start for a reader to tell it; the stand-ins check no more.
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n"
OGG = b"OggS\x00\x02" + bytes(range(200)) * 3


stt_server, stt = standin_fixtures("stt", lambda: TranscribeApiStandIn(api_keys=STT_KEY))


def _transcriber(stt: TranscribeApiStandIn) -> dict[str, str]:
    return {"TRANSCRIBE_BASE_URL": f"{stt.url}/v1", "TRANSCRIBE_API_KEY": STT_KEY}


def _message(message_id: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "from": PERSON,
        "id": message_id,
        "timestamp": str(int(time.time())),
        "type": kind,
        kind: body,
    }


def _image(message_id: str, media_id: str, caption: str = "") -> dict[str, Any]:
    body = {"mime_type": "image/png", "sha256": "x", "id": media_id}
    return _message(message_id, "image", {**body, "caption": caption} if caption else body)


def _voice(message_id: str, media_id: str) -> dict[str, Any]:
    body = {"mime_type": "audio/ogg; codecs=opus", "sha256": "x", "id": media_id, "voice": True}
    return _message(message_id, "audio", body)


async def _turn(
    receiver_url: str, graph: GraphApiStandIn, ai: MessagesApiStandIn, *messages: dict[str, Any]
) -> list[dict[str, Any]]:
    """Post the messages as one webhook; the content of the user message Claude was asked,
    once the reply went out."""
    await post_webhook(receiver_url, inbound(TENANT, PERSON, *messages))
    await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=20)
    (request,) = ai_requests(ai)
    content: list[dict[str, Any]] = request.body["messages"][-1]["content"]
    return content


def _texts(content: list[dict[str, Any]]) -> str:
    return "\n".join(b["text"] for b in content if b["type"] == "text")


def _sources(content: list[dict[str, Any]], kind: str) -> list[tuple[str, bytes]]:
    return [
        (b["source"]["media_type"], base64.b64decode(b["source"]["data"]))
        for b in content
        if b["type"] == kind and b["source"]["type"] == "base64"
    ]


async def test_an_image_reaches_claude_as_an_image_block_with_its_caption(
    receiver_url: str, workers: InProcessWorkers, graph: GraphApiStandIn, ai: MessagesApiStandIn
) -> None:
    graph.media.add("9100000000001", PNG, "image/png")
    await workers.start()
    content = await _turn(
        receiver_url, graph, ai, _image("wamid.m1", "9100000000001", "así está la canilla")
    )

    assert _sources(content, "image") == [("image/png", PNG)]
    assert "así está la canilla" in _texts(content)
    # The text first (as the receiver described it), then the file.
    assert content[0]["type"] == "text" and content[-1]["type"] == "image"
    # Meta's two steps, both with the tenant's own token (TENANTS_FILE), not the global one.
    (info,) = graph.media.infos()
    (download,) = graph.media.downloads()
    assert info.path.endswith("/9100000000001")
    assert info.headers["authorization"] == download.headers["authorization"]
    assert download.headers["authorization"] == f"Bearer {TENANT_TOKEN}"


async def test_a_pdf_reaches_claude_as_a_document_block(
    receiver_url: str, workers: InProcessWorkers, graph: GraphApiStandIn, ai: MessagesApiStandIn
) -> None:
    graph.media.add("9100000000002", PDF, "application/pdf")
    await workers.start()
    body = {"filename": "presupuesto.pdf", "mime_type": "application/pdf", "id": "9100000000002"}
    content = await _turn(receiver_url, graph, ai, _message("wamid.m2", "document", body))

    assert _sources(content, "document") == [("application/pdf", PDF)]
    assert "presupuesto.pdf" in _texts(content)


async def test_a_voice_note_reaches_claude_transcribed(
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    stt: TranscribeApiStandIn,
) -> None:
    graph.media.add("9100000000003", OGG, "audio/ogg")
    stt.transcript_for(OGG, "Hola, ¿tienen turno el sábado?")
    await workers.start(**_transcriber(stt), TRANSCRIBE_MODEL="whisper-large-v3")
    content = await _turn(receiver_url, graph, ai, _voice("wamid.m3", "9100000000003"))

    assert "[voice note, transcribed]: Hola, ¿tienen turno el sábado?" in _texts(content)
    (sent,) = stt.transcriptions()
    assert (sent.data, sent.model, sent.filename) == (OGG, "whisper-large-v3", "voice.ogg")
    assert sent.content_type == "audio/ogg"


async def test_the_next_turn_remembers_what_the_voice_note_said(
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    stt: TranscribeApiStandIn,
) -> None:
    """The memory keeps the transcription, not "[audio]": asked later "¿y a qué hora?", the AI
    still knows the voice note asked about Saturday. Each file is fetched only in its turn."""
    graph.media.add("9100000000013", OGG, "audio/ogg")
    stt.transcript_for(OGG, "Hola, ¿tienen turno el sábado?")
    await workers.start(**_transcriber(stt))
    first = await _turn(receiver_url, graph, ai, _voice("wamid.m13", "9100000000013"))
    transcribed = "[voice note, transcribed]: Hola, ¿tienen turno el sábado?"
    assert first[-1] == {"type": "text", "text": transcribed}

    later = _message("wamid.m14", "text", {"body": "¿y a qué hora?"})
    await post_webhook(receiver_url, inbound(TENANT, PERSON, later))
    await graph.await_for(lambda: len(graph.sent_texts(to=PERSON)) == 2, timeout=20)
    _, second = ai_requests(ai)
    remembered_user, _answer, current = second.body["messages"]
    # The earlier turn as it was sent, up to its transcription (same bytes: the cache holds).
    assert [b["text"] for b in remembered_user["content"]] == [b["text"] for b in first]
    assert "¿y a qué hora?" in _texts(current["content"])
    assert len(graph.media.downloads()) == 1 and len(stt.transcriptions()) == 1


async def test_without_a_transcriber_the_ai_is_told_it_cannot_hear_the_voice_note(
    receiver_url: str, workers: InProcessWorkers, graph: GraphApiStandIn, ai: MessagesApiStandIn
) -> None:
    graph.media.add("9100000000004", OGG, "audio/ogg")
    await workers.start()  # no TRANSCRIBE_BASE_URL
    content = await _turn(receiver_url, graph, ai, _voice("wamid.m4", "9100000000004"))

    assert (
        "[the customer sent a voice note that you cannot hear; ask them to write what it says]"
        in _texts(content)
    )
    assert graph.media.downloads() == []  # nothing fetched that nobody can use


async def test_files_gone_or_too_big_become_sentences_and_the_turn_is_answered_once(
    receiver_url: str, workers: InProcessWorkers, graph: GraphApiStandIn, ai: MessagesApiStandIn
) -> None:
    graph.media.add("9100000000005", PNG, "image/png", status=404)  # the url expired
    graph.media.add("9100000000006", PDF, "application/pdf", announce=50_000_000)
    # 9100000000007 is unknown to the stand-in: a media id past its 7 days.
    await workers.start(MEDIA_MAX_BYTES=10_000_000)
    big = {"filename": "planos.pdf", "mime_type": "application/pdf", "id": "9100000000006"}
    content = await _turn(
        receiver_url,
        graph,
        ai,
        _image("wamid.m5", "9100000000005"),
        _message("wamid.m6", "document", big),
        _image("wamid.m7", "9100000000007"),
    )

    texts = _texts(content)
    assert (
        texts.count(
            "[the customer sent an image that could not be downloaded;"
            " ask them to send it again or to describe it]"
        )
        == 2
    )
    assert (
        '[the customer sent a document ("planos.pdf") too large to open;'
        " ask them to send it again or to describe it]"
    ) in texts
    assert not [b for b in content if b["type"] in ("image", "document")]
    assert [r.extra["media_id"] for r in graph.media.downloads()] == ["9100000000005"]
    assert len(graph.sent_texts(to=PERSON)) == 1
    assert len(ai_requests(ai)) == 1  # no retry of the turn for a file


async def test_a_slow_download_is_given_up_within_the_turn(
    receiver_url: str, workers: InProcessWorkers, graph: GraphApiStandIn, ai: MessagesApiStandIn
) -> None:
    """The download hangs 30 s; the turn (AI_TURN_TIMEOUT_S=3, LEASE_S=5) gives each file
    half of its time, so the reply goes out long before the download would end."""
    graph.media.add("9100000000008", PNG, "image/png", delay=30)
    await workers.start(AI_TURN_TIMEOUT_S=3, MEDIA_TIMEOUT_S=60)
    started = time.monotonic()
    content = await _turn(receiver_url, graph, ai, _image("wamid.m8", "9100000000008", "mirá"))
    took = time.monotonic() - started

    assert (
        '[the customer sent an image ("mirá") that could not be downloaded;'
        " ask them to send it again or to describe it]"
    ) in _texts(content)
    assert _texts(content).count("mirá") == 1
    assert took < 12, took  # 0.25 s debounce + 1.5 s for the file + the AI; never the 30 s
    assert len(ai_requests(ai)) == 1


async def test_the_files_of_a_burst_are_fetched_at_once(
    receiver_url: str, workers: InProcessWorkers, graph: GraphApiStandIn, ai: MessagesApiStandIn
) -> None:
    ids = [f"91000000001{i}" for i in range(3)]
    for i, media_id in enumerate(ids):
        graph.media.add(media_id, PNG + bytes([i]), "image/png", delay=1.0)
    await workers.start()
    content = await _turn(
        receiver_url, graph, ai, *(_image(f"wamid.m9{i}", m) for i, m in enumerate(ids))
    )

    assert graph.media.peak == 3  # all three downloads in flight together
    assert _sources(content, "image") == [("image/png", PNG + bytes([i])) for i in range(3)]


async def test_a_worker_process_fetches_an_image_and_a_voice_note_of_one_burst(
    receiver_url: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    stt: TranscribeApiStandIn,
) -> None:
    """The same through a real `python -m worker` process, configured only by its environment."""
    graph.media.add("9100000000020", PNG, "image/png")
    graph.media.add("9100000000021", OGG, "audio/ogg")
    stt.transcript_for(OGG, "te mando la foto del recibo")
    await fleet.start(1, **{**env, **_transcriber(stt)})
    content = await _turn(
        receiver_url,
        graph,
        ai,
        _image("wamid.m20", "9100000000020", "el recibo"),
        _voice("wamid.m21", "9100000000021"),
    )

    assert _sources(content, "image") == [("image/png", PNG)]
    texts = _texts(content)
    assert "[voice note, transcribed]: te mando la foto del recibo" in texts
    assert "el recibo" in texts
