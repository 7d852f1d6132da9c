"""Chatwoot attachments cannot reach inside: signed `message_created` webhooks through the real
receiver and a real worker turn (the Claude brain against the Messages API stand-in, the reply
through the Chatwoot stand-in), with hosts of the tests' own on other loopback ports standing in
for a host inside the network and for Chatwoot's storage (tests/support/inside_host.py).

What each hostile `data_url` gets: another host or port than `CHATWOOT_BASE_URL`'s and
`CHATWOOT_MEDIA_HOSTS` (a host inside, the Redis of the tests, a cloud metadata address) is not
fetched, and the AI is told "[the customer sent an image that could not be downloaded; ask
them to send it again or to describe it]"; a redirect from a listed host to an unlisted one
is not followed (the same sentence), to a listed one it is (Chatwoot redirecting to its S3 or
GCS storage). No token of ours goes anywhere."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest

from scripts.dev.redis_server import RedisServer
from scripts.standins import ChatwootApiStandIn, MessagesApiStandIn, chatwoot_headers
from scripts.webhooks import message_created
from tests.chatwoot.support import CONVERSATION, WEBHOOK_SECRET
from tests.delivery.support import InProcessWorkers, ai_requests
from tests.support.helpers import API_KEY
from tests.support.inside_host import PNG, RecordingHost, recording_host

AI: dict[str, Any] = {
    "BRAIN": "anthropic",
    "ANTHROPIC_API_KEY": API_KEY,
    "AI_MODEL": "claude-test-model",
    "AI_TIMEOUT_S": "5",
}
NOT_DOWNLOADED = (
    "[the customer sent an image that could not be downloaded;"
    " ask them to send it again or to describe it]"
)


@pytest.fixture(autouse=True)
def anthropic_env(ai: MessagesApiStandIn, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # In-process workers build their SDK client here: it reads these from the environment.
    monkeypatch.setenv("ANTHROPIC_BASE_URL", ai.url)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    yield


@pytest.fixture
async def inside() -> AsyncIterator[RecordingHost]:
    async with recording_host("inside") as host:
        yield host


@pytest.fixture
async def storage() -> AsyncIterator[RecordingHost]:
    async with recording_host("storage") as host:
        yield host


@pytest.fixture
async def front() -> AsyncIterator[RecordingHost]:
    async with recording_host("front") as host:
        yield host


def _image(n: int, data_url: str) -> dict[str, Any]:
    """An image attachment as Chatwoot's `Attachment#push_event_data` gives it."""
    return {
        "id": n,
        "message_id": 9300,
        "file_type": "image",
        "account_id": 1,
        "extension": None,
        "data_url": data_url,
        "thumb_url": data_url,
        "file_size": len(PNG),
    }


async def _turn(
    receiver_url: str, chatwoot: ChatwootApiStandIn, ai: MessagesApiStandIn, *urls: str
) -> list[dict[str, Any]]:
    """Post one signed incoming message with an image attachment per url; the content of the
    user message Claude was asked, once the reply went out."""
    attachments = [_image(n, url) for n, url in enumerate(urls, 1)]
    body = orjson.dumps(
        message_created(
            message_id=9300, content="mirá", conversation=CONVERSATION, attachments=attachments
        )
    )
    async with httpx.AsyncClient() as client:
        response = await client.post(
            receiver_url, content=body, headers=chatwoot_headers(body, WEBHOOK_SECRET)
        )
    assert response.status_code == 200, response.text
    await chatwoot.await_for(lambda: chatwoot.replies(CONVERSATION), timeout=20)
    (request,) = ai_requests(ai)
    content: list[dict[str, Any]] = request.body["messages"][-1]["content"]
    return content


def _texts(content: list[dict[str, Any]]) -> str:
    return "\n".join(b["text"] for b in content if b["type"] == "text")


def _images(content: list[dict[str, Any]]) -> list[bytes]:
    return [base64.b64decode(b["source"]["data"]) for b in content if b["type"] == "image"]


async def test_an_attachment_on_an_unlisted_host_is_not_fetched_and_the_ai_is_told(
    receiver_url: str,
    workers: InProcessWorkers,
    chatwoot: ChatwootApiStandIn,
    ai: MessagesApiStandIn,
    inside: RecordingHost,
    redis_server: RedisServer,
) -> None:
    await workers.start(**AI)
    redis_port = httpx.URL(redis_server.url).port
    content = await _turn(
        receiver_url,
        chatwoot,
        ai,
        f"{inside.url}/rails/active_storage/blobs/1.png",
        f"http://127.0.0.1:{redis_port}/",  # made Redis log "Possible SECURITY ATTACK"
        "http://169.254.169.254/latest/meta-data/",
    )

    # Each one said once; the first carries the message's content as its caption.
    assert _texts(content).count(NOT_DOWNLOADED.replace("image", 'image ("mirá")')) == 1
    assert _texts(content).count(NOT_DOWNLOADED) == 2
    assert _texts(content).count("mirá") == 1
    assert _images(content) == []
    assert inside.calls == []
    assert len(chatwoot.replies(CONVERSATION)) == 1  # answered once, never retried for a file


async def test_listed_hosts_are_fetched_and_redirects_go_only_to_listed_hosts(
    receiver_url: str,
    workers: InProcessWorkers,
    chatwoot: ChatwootApiStandIn,
    ai: MessagesApiStandIn,
    inside: RecordingHost,
    storage: RecordingHost,
    front: RecordingHost,
) -> None:
    await workers.start(**AI, CHATWOOT_MEDIA_HOSTS=f"{front.url},{storage.url}")
    content = await _turn(
        receiver_url,
        chatwoot,
        ai,
        f"{storage.url}/files/a.png",  # a listed host
        storage.redirect(f"{storage.url}/files/b.png"),  # a redirect on the same host
        front.redirect(f"{storage.url}/files/c.png"),  # to another listed host (S3)
        storage.redirect(f"{inside.url}/files/d.png"),  # to an unlisted host: not followed
    )

    assert _images(content) == [PNG, PNG, PNG]
    assert _texts(content).count(NOT_DOWNLOADED) == 1
    assert inside.calls == []
    assert sorted(c.path for c in storage.calls) == [
        "/files/a.png",
        "/files/b.png",
        "/files/c.png",
        "/redirect",
        "/redirect",
    ]
    assert {c.authorization for c in storage.calls + front.calls} == {None}
