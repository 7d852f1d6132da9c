"""The Chatwoot API stand-in itself: what it accepts, refuses, records and posts back."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from receiver.providers.base import WebhookRequest
from receiver.providers.chatwoot import ChatwootInbound, parse_body
from scripts.standins import BackgroundServer, ChatwootApiStandIn
from tests.standins.support import launch
from tests.support.helpers import stop_process

TOKEN = "cw-token"
PATH = "/api/v1/accounts/1/conversations/42"


@pytest.fixture
def chatwoot() -> Iterator[ChatwootApiStandIn]:
    with ChatwootApiStandIn(access_tokens=TOKEN) as standin:
        yield standin


def call(standin: ChatwootApiStandIn, action: str, body: object, token: str = TOKEN) -> Any:
    return httpx.post(
        f"{standin.url}{PATH}/{action}", json=body, headers={"api_access_token": token}
    )


def test_messages_status_and_typing_as_chatwoot_answers_them(
    chatwoot: ChatwootApiStandIn,
) -> None:
    reply = call(chatwoot, "messages", {"content": "hola", "message_type": "outgoing"})
    note = call(chatwoot, "messages", {"content": "nota", "private": True})
    status = call(chatwoot, "toggle_status", {"status": "open"})
    typing = call(chatwoot, "toggle_typing_status", {"typing_status": "on"})
    assert [r.status_code for r in (reply, note, status, typing)] == [200] * 4
    assert reply.json()["id"] != note.json()["id"] and reply.json()["conversation_id"] == 42
    assert status.json()["payload"] == {
        "success": True,
        "conversation_id": 42,
        "current_status": "open",
        "snoozed_until": None,
    }
    assert [m.content for m in chatwoot.replies(42)] == ["hola"]
    assert [m.content for m in chatwoot.notes(42)] == ["nota"]
    assert chatwoot.status_of(42) == "open"
    assert [r.kind for r in chatwoot.requests] == ["reply", "note", "status", "typing"]


def test_bad_tokens_bodies_and_paths_are_refused_and_recorded(
    chatwoot: ChatwootApiStandIn,
) -> None:
    assert call(chatwoot, "messages", {"content": "x"}, token="nope").status_code == 401
    assert call(chatwoot, "messages", {"content": " "}).status_code == 422
    assert call(chatwoot, "toggle_status", {"status": "closed"}).status_code == 422
    assert call(chatwoot, "assignments", {}).status_code == 404
    assert httpx.get(f"{chatwoot.url}/api/v1/profile").status_code == 404
    assert chatwoot.created() == [] and chatwoot.status_of(42) is None
    assert [r.status for r in chatwoot.requests] == [401, 422, 422, 404, 404]


def test_faults_by_kind_and_conversation_over_http_too(chatwoot: ChatwootApiStandIn) -> None:
    chatwoot.fail_next(1, 429, kinds=["reply"], conversation=42)
    assert call(chatwoot, "toggle_status", {"status": "open"}).status_code == 200
    limited = call(chatwoot, "messages", {"content": "x"})
    assert (limited.status_code, limited.json()) == (429, {"error": "Too many requests"})
    control = httpx.post(f"{chatwoot.url}/_control", json={"op": "fail", "status": 503})
    assert control.json()["ok"]
    assert call(chatwoot, "messages", {"content": "x"}).status_code == 503
    assert call(chatwoot, "messages", {"content": "x"}).status_code == 200
    assert httpx.post(f"{chatwoot.url}/_control", json={"op": "nope"}).status_code == 400


@contextmanager
def posting_webhooks_to(
    hook: Callable[[Request], Awaitable[Response]],
) -> Iterator[ChatwootApiStandIn]:
    """A stand-in whose webhooks (secret "s") go to `hook`, served on a port of its own."""
    receiver = BackgroundServer(Starlette(routes=[Route("/hook", hook, methods=["POST"])]))
    with (
        receiver,
        ChatwootApiStandIn(
            access_tokens=TOKEN, webhook_url=f"{receiver.url}/hook", webhook_secret="s"
        ) as chatwoot,
    ):
        yield chatwoot


def test_created_messages_come_back_as_signed_outgoing_webhooks() -> None:
    got: list[WebhookRequest] = []

    async def hook(request: Request) -> Response:
        headers = {k.encode(): v for k, v in request.headers.items()}
        got.append(WebhookRequest(headers, request.url.query.encode(), await request.body()))
        return Response("")

    with posting_webhooks_to(hook) as chatwoot:
        created = call(chatwoot, "messages", {"content": "hola"}).json()
        chatwoot.wait_for(lambda: chatwoot.webhook_deliveries, timeout=15)
        # Over HTTP too (what scripts/simulate reads): the delivery and the receiver's answer.
        (listed,) = httpx.get(f"{chatwoot.url}/_requests").json()["webhooks"]
    assert (listed["message_id"], listed["response_status"]) == (created["id"], 200)
    assert listed["body"]["message_type"] == "outgoing" and listed["error"] is None
    (request,) = got
    ChatwootInbound(["s"], []).verify(request, time.time())
    payload = orjson.loads(request.body)
    assert payload["message_type"] == "outgoing" and payload["content"] == "hola"
    assert payload["conversation"]["id"] == 42 and payload["inbox"]["id"] == 3


@pytest.mark.parametrize("mode", ["account", "agent_bot"])
def test_people_in_chatwoot_over_http_post_the_events_each_webhook_gets(mode: str) -> None:
    """An agent writes, is assigned, changes the status, and the product's own hand-over sets
    `open`: an account webhook gets `conversation_updated` / `conversation_status_changed`
    with `changed_attributes`, an agent bot only `conversation_opened` / `_resolved`; the
    agent's message comes from a `user`. The receiver's parser reads every one of them."""
    got: list[dict[str, Any]] = []

    async def hook(request: Request) -> Response:
        got.append(orjson.loads(await request.body()))
        return Response("")

    with posting_webhooks_to(hook) as chatwoot:
        control = f"{chatwoot.url}/_control"
        httpx.post(control, json={"op": "conversation_events", "mode": mode}).raise_for_status()
        for op in [
            {"op": "agent_writes", "conversation": 42, "content": "Hola, soy Laura."},
            {"op": "assign", "conversation": 42, "agent_id": 12, "name": "Laura Gómez"},
            {"op": "set_status", "conversation": 42, "status": "resolved"},
        ]:
            httpx.post(control, json=op).raise_for_status()
            chatwoot.wait_for(lambda: chatwoot.pending_webhooks == 0, timeout=15)
        call(chatwoot, "toggle_status", {"status": "open"})
        chatwoot.wait_for(lambda: chatwoot.pending_webhooks == 0, timeout=15)
    kinds = [(p["event"], p.get("message_type")) for p in got]
    events = [
        e.get("effect", e["kind"]) + ":" + e.get("why", "")
        for p in got
        for e in parse_body(orjson.dumps(p), 1).events.get("cw-1-3", [])
    ]
    if mode == "account":
        assert kinds == [
            ("message_created", "outgoing"),
            ("conversation_updated", None),
            ("conversation_status_changed", None),
            ("conversation_status_changed", None),
        ]
        assert events == ["human:", "silence:assignee", "speak:resolved", "speak:reopened"]
    else:
        assert kinds == [
            ("message_created", "outgoing"),
            ("conversation_resolved", None),
            ("conversation_opened", None),
        ]
        assert events == ["human:", "speak:resolved", "silence:opened"]
    assert got[0]["sender"]["type"] == "user" and got[0]["sender"]["name"] == "Laura Gómez"


@pytest.mark.skipif(sys.platform == "win32", reason="bash launchers")
def test_chatwoot_standin_launcher() -> None:
    proc, url = launch("chatwoot_standin", "--token", "tok")
    try:
        path = f"{url}{PATH}/messages"
        headers = {"api_access_token": "tok"}
        assert httpx.post(path, json={"content": "hi"}, headers=headers).status_code == 200
        assert httpx.post(f"{url}/_control", json={"op": "fail", "status": 422}).json()["ok"]
        assert httpx.post(path, json={"content": "hi"}, headers=headers).status_code == 422
        records = httpx.get(f"{url}/_requests").json()["requests"]
        assert [r["status"] for r in records] == [200, 422]
    finally:
        stop_process(proc, 5)


def get(standin: ChatwootApiStandIn, path: str, token: str = TOKEN, **params: Any) -> Any:
    return httpx.get(
        f"{standin.url}/api/v1/accounts/1/conversations{path}",
        params=params,
        headers={"api_access_token": token},
    )


def test_conversations_are_listed_25_a_page_newest_activity_first(
    chatwoot: ChatwootApiStandIn,
) -> None:
    now = time.time()
    for n in range(30):
        chatwoot.customer_writes(100 + n, "hola", created_at=now - 100 + n)
    chatwoot.customer_writes(100, "otra vez", created_at=now)  # 100 is the newest now
    chatwoot.set_status(101, "open")
    first = get(chatwoot, "", status="all").json()["data"]
    second = get(chatwoot, "", status="all", page=2).json()["data"]
    ids = [c["id"] for c in first["payload"] + second["payload"]]
    assert len(first["payload"]) == 25 and first["meta"]["all_count"] == 30
    assert ids == [100, *range(129, 100, -1)]
    newest = first["payload"][0]
    assert newest["last_activity_at"] == newest["timestamp"] == int(now)
    assert (newest["inbox_id"], newest["account_id"], newest["status"]) == (3, 1, "pending")
    assert newest["meta"]["sender"]["type"] == "contact"
    # Chatwoot's default is `open` only; `pending` the bot's, and an inbox that has none.
    assert [c["id"] for c in get(chatwoot, "").json()["data"]["payload"]] == [101]
    assert len(get(chatwoot, "", status="pending").json()["data"]["payload"]) == 25
    assert get(chatwoot, "", status="all", inbox_id=4).json()["data"]["payload"] == []
    assert [
        c["id"]
        for c in get(chatwoot, "", status="all", sort_by="last_activity_at_asc").json()["data"][
            "payload"
        ][:2]
    ] == [101, 102]
    assert get(chatwoot, "", token="wrong").status_code == 401
    assert get(chatwoot, "", page="x").status_code == 422
    assert [r.kind for r in chatwoot.requests][:2] == ["list", "list"]


def test_messages_are_read_20_before_an_id_or_100_after_oldest_first(
    chatwoot: ChatwootApiStandIn,
) -> None:
    ids = [chatwoot.customer_writes(42, f"m{n}", webhook=False) for n in range(130)]
    latest = get(chatwoot, "/42/messages").json()["payload"]
    assert [m["content"] for m in latest] == [f"m{n}" for n in range(110, 130)]
    before = get(chatwoot, "/42/messages", before=ids[110]).json()["payload"]
    assert [m["id"] for m in before] == ids[90:110]
    after = get(chatwoot, "/42/messages", after=ids[9]).json()["payload"]
    assert [m["id"] for m in after] == ids[10:110]
    between = get(chatwoot, "/42/messages", after=ids[5], before=ids[8]).json()["payload"]
    assert [m["id"] for m in between] == ids[5:8]
    message = latest[0]
    assert message["message_type"] == 0 and message["private"] is False
    assert message["sender"]["type"] == "contact" and isinstance(message["created_at"], int)
    assert get(chatwoot, "/43/messages").status_code == 404
    assert get(chatwoot, "/42/messages", before="x").status_code == 422


def test_every_message_is_kept_with_its_type_sender_and_privacy(
    chatwoot: ChatwootApiStandIn,
) -> None:
    chatwoot.customer_writes(42, "hola", webhook=False)
    call(chatwoot, "messages", {"content": "respuesta", "message_type": "outgoing"})
    call(chatwoot, "messages", {"content": "nota", "private": True})
    chatwoot.agent_writes(42, "soy Laura")
    chatwoot.add_message(42, "Conversation was assigned", 2)
    kept = [
        (m["message_type"], m["private"], (m.get("sender") or {}).get("type"), m["content"])
        for m in get(chatwoot, "/42/messages").json()["payload"]
    ]
    assert kept == [
        (0, False, "contact", "hola"),
        (1, False, "agent_bot", "respuesta"),
        (1, True, "agent_bot", "nota"),
        (1, False, "user", "soy Laura"),
        (2, False, None, "Conversation was assigned"),
    ]


async def test_a_customers_message_is_posted_once_or_not_at_all(
    chatwoot: ChatwootApiStandIn,
) -> None:
    received: list[dict[str, Any]] = []

    async def receiver(request: Request) -> Response:
        received.append(orjson.loads(await request.body()))
        return Response(b"", status_code=500)  # never sent again

    app = Starlette(routes=[Route("/hook", receiver, methods=["POST"])])
    async with BackgroundServer(app) as server:
        chatwoot.configure(webhook_url=f"{server.url}/hook", webhook_secret="s")
        posted = chatwoot.customer_writes(42, "hola")
        chatwoot.customer_writes(42, "sin webhook", webhook=False)
        await chatwoot.await_webhooks(timeout=10)
    assert [(h["id"], h["message_type"], h["content"]) for h in received] == [
        (posted, "incoming", "hola")
    ]
    assert [d.response_status for d in chatwoot.webhook_deliveries] == [500]
    (parsed,) = parse_body(orjson.dumps(received[0]), 0).events["cw-1-3"]
    assert parsed["text"] == "hola" and parsed["id"] == str(posted)


def test_reads_fail_only_when_a_fault_names_them_and_a_429_says_when_to_retry(
    chatwoot: ChatwootApiStandIn,
) -> None:
    chatwoot.customer_writes(42, "hola", webhook=False)
    chatwoot.fail_next(1, 500)  # the senders' default kinds: not the reads
    assert get(chatwoot, "").status_code == 200
    chatwoot.reset_faults()
    chatwoot.fail_next(1, 429, kinds=["history"], retry_after=2)
    limited = get(chatwoot, "/42/messages")
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    assert get(chatwoot, "/42/messages").status_code == 200


def test_people_write_through_the_control_endpoint(chatwoot: ChatwootApiStandIn) -> None:
    for op in (
        {"op": "customer_writes", "conversation": 42, "content": "hola", "webhook": False},
        {"op": "add_message", "conversation": 42, "content": "asignada", "message_type": 2},
    ):
        assert httpx.post(f"{chatwoot.url}/_control", json=op).json()["ok"] is True
    assert [(m["message_type"], m["content"]) for m in chatwoot.messages(42)] == [
        (0, "hola"),
        (2, "asignada"),
    ]
