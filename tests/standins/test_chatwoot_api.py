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
