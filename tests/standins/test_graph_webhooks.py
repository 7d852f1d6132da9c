"""Status webhooks from the Graph stand-in, received by a tiny Starlette app that checks the
signature the way the receiver must (HMAC-SHA256 of the raw body, constant-time compare)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from scripts.standins import BackgroundServer, GraphApiStandIn
from tests.support.helpers import TOKEN

SECRET = "webhook-secret"
PHONE_NUMBER_ID = "106500000000001"
PERSON = "5491155550001"
PATH = f"/v23.0/{PHONE_NUMBER_ID}/messages"
FIXTURES = Path("/work/shared/fixtures/whatsapp")
if not FIXTURES.exists():
    FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "whatsapp"


class Receiver:
    """Verifies `X-Hub-Signature-256`; answers 401 on a bad one, else the next scripted status."""

    def __init__(self, secret: str = SECRET) -> None:
        self.secret = secret
        self.lock = threading.Lock()
        self.payloads: list[dict[str, Any]] = []
        self.rejected = 0
        self.answers: list[int] = []  # statuses to answer next (then 200)
        self.app = Starlette(routes=[Route("/webhooks/whatsapp", self.post, methods=["POST"])])

    async def post(self, request: Request) -> Response:
        raw = await request.body()
        expected = "sha256=" + hmac.new(self.secret.encode(), raw, hashlib.sha256).hexdigest()
        signature = request.headers.get("x-hub-signature-256", "")
        with self.lock:
            if not hmac.compare_digest(signature, expected):
                self.rejected += 1
                return PlainTextResponse("bad signature", 401)
            if self.answers:
                return PlainTextResponse("busy", self.answers.pop(0))
            self.payloads.append(json.loads(raw))
        return PlainTextResponse("ok")

    def statuses(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                status
                for payload in self.payloads
                for entry in payload["entry"]
                for change in entry["changes"]
                for status in change["value"].get("statuses", [])
            ]


@pytest.fixture(scope="module")
def receiver_server() -> Iterator[tuple[Receiver, str]]:
    receiver = Receiver()
    with BackgroundServer(receiver.app, name="receiver") as server:
        yield receiver, server.url + "/webhooks/whatsapp"


@pytest.fixture
def receiver(receiver_server: tuple[Receiver, str]) -> tuple[Receiver, str]:
    receiver, url = receiver_server
    with receiver.lock:
        receiver.payloads.clear()
        receiver.answers.clear()
        receiver.rejected = 0
    return receiver, url


async def send(graph: GraphApiStandIn, to: str = PERSON, kind: str = "text") -> str:
    body: dict[str, Any] = {"messaging_product": "whatsapp", "to": to}
    if kind == "text":
        body |= {"type": "text", "text": {"body": "hola"}}
    else:
        body |= {"type": "template", "template": {"name": "t", "language": {"code": "es"}}}
    async with httpx.AsyncClient(base_url=graph.url) as client:
        response = await client.post(PATH, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    return str(response.json()["messages"][0]["id"])


def shape(value: Any) -> Any:
    """The keys of a JSON document (recursively), not its values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


async def test_sent_delivered_read_signed_in_meta_shape(
    graph: GraphApiStandIn, receiver: tuple[Receiver, str]
) -> None:
    rx, url = receiver
    graph.configure(webhook_url=url, app_secret=SECRET, status_delays=[0.01])
    wamid = await send(graph)
    await graph.await_webhooks(timeout=15)
    statuses = rx.statuses()
    assert [s["status"] for s in statuses] == ["sent", "delivered", "read"]
    assert {s["id"] for s in statuses} == {wamid}
    assert {s["recipient_id"] for s in statuses} == {PERSON}
    stamps = [int(s["timestamp"]) for s in statuses]
    assert all(isinstance(s["timestamp"], str) for s in statuses) and stamps == sorted(stamps)
    assert rx.rejected == 0

    for payload, status in zip(rx.payloads, ("sent", "delivered", "read"), strict=True):
        fixture = json.loads((FIXTURES / f"status_{status}.json").read_text())
        assert shape(payload) == shape(fixture)
        value = payload["entry"][0]["changes"][0]["value"]
        assert value["metadata"]["phone_number_id"] == PHONE_NUMBER_ID
        assert payload["entry"][0]["changes"][0]["field"] == "messages"
    deliveries = graph.webhook_deliveries
    assert [(d.status, d.attempt, d.response_status) for d in deliveries] == [
        ("sent", 1, 200),
        ("delivered", 1, 200),
        ("read", 1, 200),
    ]


async def test_metadata_override_and_template(
    graph: GraphApiStandIn, receiver: tuple[Receiver, str]
) -> None:
    rx, url = receiver
    graph.configure(
        webhook_url=url,
        app_secret=SECRET,
        phone_number_id="999",
        display_phone_number="15551234567",
        status_order=["sent", "delivered"],
        status_delays=[0],
    )
    await send(graph, kind="template")
    await graph.await_webhooks()
    value = rx.payloads[0]["entry"][0]["changes"][0]["value"]
    assert value["metadata"] == {"display_phone_number": "15551234567", "phone_number_id": "999"}
    assert [s["status"] for s in rx.statuses()] == ["sent", "delivered"]
    assert value["statuses"][0]["pricing"]["category"] == "utility"


async def test_out_of_order(graph: GraphApiStandIn, receiver: tuple[Receiver, str]) -> None:
    rx, url = receiver
    graph.configure(webhook_url=url, app_secret=SECRET, out_of_order=True, status_delays=[0.01])
    try:
        await send(graph)
        await graph.await_webhooks()
    finally:
        graph.configure(out_of_order=False)
    statuses = rx.statuses()
    assert [s["status"] for s in statuses] == ["read", "delivered", "sent"]
    # the timestamps still tell the true order
    by_status = {s["status"]: int(s["timestamp"]) for s in statuses}
    assert by_status["sent"] < by_status["delivered"] < by_status["read"]


async def test_failed_status_for_a_recipient(
    graph: GraphApiStandIn, receiver: tuple[Receiver, str]
) -> None:
    rx, url = receiver
    graph.configure(webhook_url=url, app_secret=SECRET, status_delays=[0])
    graph.fail_status_for("+" + PERSON, 131047)
    wamid = await send(graph)  # accepted: Meta reports the closed window afterwards
    await send(graph, to="5491155550002")
    await graph.await_webhooks()
    mine = [s for s in rx.statuses() if s["recipient_id"] == PERSON]
    assert [(s["id"], s["status"]) for s in mine] == [(wamid, "failed")]
    assert mine[0]["errors"][0]["code"] == 131047
    assert mine[0]["errors"][0]["title"] == "Re-engagement message"
    fixture = json.loads((FIXTURES / "status_failed_window.json").read_text())
    failed_payload = next(p for p in rx.payloads if "errors" in json.dumps(p))
    assert shape(failed_payload) == shape(fixture)
    others = [s["status"] for s in rx.statuses() if s["recipient_id"] != PERSON]
    assert others == ["sent", "delivered", "read"]


async def test_retries_until_200(graph: GraphApiStandIn, receiver: tuple[Receiver, str]) -> None:
    rx, url = receiver
    rx.answers = [500, 503]
    graph.configure(
        webhook_url=url,
        app_secret=SECRET,
        status_order=["sent"],
        webhook_retry_delay=0.01,
        status_delays=[0],
    )
    await send(graph)
    await graph.await_webhooks()
    assert [s["status"] for s in rx.statuses()] == ["sent"]
    assert [(d.attempt, d.response_status) for d in graph.webhook_deliveries] == [
        (1, 500),
        (2, 503),
        (3, 200),
    ]
    # the retried body is byte-identical (same signature)
    assert len({d.body for d in graph.webhook_deliveries}) == 1


async def test_wrong_secret_is_rejected_and_given_up(
    graph: GraphApiStandIn, receiver: tuple[Receiver, str]
) -> None:
    rx, url = receiver
    graph.configure(
        webhook_url=url,
        app_secret="not-the-secret",
        status_order=["sent"],
        webhook_retries=2,
        webhook_retry_delay=0.01,
        status_delays=[0],
    )
    try:
        await send(graph)
        await graph.await_webhooks()
    finally:
        graph.configure(webhook_retries=3, webhook_retry_delay=0.1)
    assert rx.statuses() == [] and rx.rejected == 3
    assert [d.response_status for d in graph.webhook_deliveries] == [401, 401, 401]


async def test_unreachable_receiver_is_retried(graph: GraphApiStandIn) -> None:
    graph.configure(
        webhook_url="http://127.0.0.1:9/nothing-here",
        app_secret=SECRET,
        status_order=["sent"],
        webhook_retries=1,
        webhook_retry_delay=0.01,
        status_delays=[0],
    )
    await send(graph)
    await graph.await_webhooks()
    deliveries = graph.webhook_deliveries
    assert [d.attempt for d in deliveries] == [1, 2]
    assert all(d.response_status is None and d.error for d in deliveries)


async def test_webhook_url_needs_a_secret(graph: GraphApiStandIn) -> None:
    with pytest.raises(ValueError, match="app_secret"):
        graph.configure(webhook_url="http://127.0.0.1:1/x", app_secret=None)
    graph.configure(webhook_url=None)


async def test_webhooks_configured_over_http(
    graph: GraphApiStandIn, receiver: tuple[Receiver, str]
) -> None:
    rx, url = receiver
    async with httpx.AsyncClient(base_url=graph.url) as client:
        response = await client.post(
            "/_control",
            json={
                "op": "config",
                "webhook_url": url,
                "app_secret": SECRET,
                "status_delays": [0],
                "status_order": ["sent", "read"],
            },
        )
        assert response.status_code == 200, response.text
        await client.post("/_control", json={"op": "fail_status", "to": "5491155550009"})
    await send(graph)
    await send(graph, to="5491155550009")
    await graph.await_webhooks()
    pairs = sorted((s["recipient_id"], s["status"]) for s in rx.statuses())
    assert pairs == [(PERSON, "read"), (PERSON, "sent"), ("5491155550009", "failed")]
    async with httpx.AsyncClient() as client:
        dump = (await client.get(graph.url + "/_requests")).json()
    assert len(dump["webhooks"]) == 3
    assert dump["webhooks"][0]["body"]["object"] == "whatsapp_business_account"
