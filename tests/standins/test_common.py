"""What every stand-in has from `StandInBase`, checked on each of the three over HTTP: the
`/_control` ops they share, faults used up, answers cut by a drop, requests that outlive a
`clear()`, unknown paths, the `/_requests` listing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins import (
    BackgroundServer,
    ChatwootApiStandIn,
    GraphApiStandIn,
    MessagesApiStandIn,
)
from scripts.standins._common import StandInBase


@dataclass(frozen=True)
class Kind:
    """How to make one stand-in answer a valid call, and how to make that call fail."""

    make: Callable[[], StandInBase[Any]]
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    fail: dict[str, Any]  # a `/_control` "fail" op
    fail_status: int
    config: dict[str, Any]  # a `/_control` "config" op, and how `state()` shows it
    shown: Callable[[dict[str, Any]], Any]


KINDS = {
    "graph": Kind(
        make=lambda: GraphApiStandIn(access_tokens="tok"),
        path="/v23.0/106500000000001/messages",
        headers={"Authorization": "Bearer tok"},
        body={"messaging_product": "whatsapp", "to": "5491155550001", "text": {"body": "hola"}},
        fail={"op": "fail", "code": 130429},
        fail_status=429,
        config={"op": "config", "access_tokens": ["other"]},
        shown=lambda state: state["access_tokens"],
    ),
    "messages": Kind(
        make=lambda: MessagesApiStandIn(api_keys="key"),
        path="/v1/messages",
        headers={"x-api-key": "key", "anthropic-version": "2023-06-01"},
        body={"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hola"}]},
        fail={"op": "fail", "error": "overloaded"},
        fail_status=529,
        config={"op": "config", "api_keys": ["other"]},
        shown=lambda state: state["api_keys"],
    ),
    "chatwoot": Kind(
        make=lambda: ChatwootApiStandIn(access_tokens="tok"),
        path="/api/v1/accounts/1/conversations/42/messages",
        headers={"api_access_token": "tok"},
        body={"content": "hola", "message_type": "outgoing"},
        fail={"op": "fail", "status": 500},
        fail_status=500,
        config={"op": "config", "access_tokens": ["other"]},
        shown=lambda state: state["access_tokens"],
    ),
}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]


@pytest.fixture
def standin(kind: Kind) -> Iterator[StandInBase[Any]]:
    with kind.make() as running:
        yield running


def call(standin: StandInBase[Any], kind: Kind, timeout: float = 5.0) -> httpx.Response:
    return httpx.post(
        standin.url + kind.path, json=kind.body, headers=kind.headers, timeout=timeout
    )


def control(standin: StandInBase[Any], payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(standin.url + "/_control", json=payload)


def test_a_fault_answers_its_count_of_calls_then_is_gone(
    standin: StandInBase[Any], kind: Kind
) -> None:
    assert control(standin, {**kind.fail, "count": 2}).json()["ok"]
    assert [call(standin, kind).status_code for _ in range(3)] == [kind.fail_status] * 2 + [200]
    assert standin.faults == []
    assert [r.fault is not None for r in standin.requests] == [True, True, False]


def test_a_removed_fault_answers_nothing(standin: StandInBase[Any], kind: Kind) -> None:
    control(standin, {**kind.fail, "count": None})
    [fault] = standin.faults
    standin.remove_fault(fault)
    assert call(standin, kind).status_code == 200


def test_reset_clear_and_reset_all_over_http(standin: StandInBase[Any], kind: Kind) -> None:
    before = kind.shown(httpx.get(standin.url + "/_control").json())
    control(standin, {"op": "latency", "seconds": 0.01})
    control(standin, {**kind.fail, "count": None})
    control(standin, kind.config)
    state = httpx.get(standin.url + "/_control").json()
    assert state["latency"] == 0.01 and len(state["faults"]) == 1
    assert kind.shown(state) == ["other"]

    state = control(standin, {"op": "reset"}).json()["state"]
    assert state["latency"] == 0.0 and state["faults"] == []
    assert kind.shown(state) == ["other"], "reset keeps the configuration"
    call(standin, kind)
    assert control(standin, {"op": "clear"}).json()["state"]["requests"] == 0
    assert standin.requests == []
    assert kind.shown(control(standin, {"op": "reset_all"}).json()["state"]) == before


def test_an_unknown_op_or_a_fault_without_effect_is_refused(
    standin: StandInBase[Any], kind: Kind
) -> None:
    refused = control(standin, {"op": "explode"})
    assert refused.status_code == 400 and "explode" in refused.json()["error"]
    assert control(standin, {"op": "fail"}).status_code == 400
    assert standin.faults == []


def carried_out(standin: StandInBase[Any]) -> list[Any]:
    """What the stand-in did for the calls so far: sends, created messages, generated replies."""
    if isinstance(standin, GraphApiStandIn):
        return standin.sent_messages()
    if isinstance(standin, ChatwootApiStandIn):
        return standin.created()
    assert isinstance(standin, MessagesApiStandIn)
    return standin.replies_sent()


def drop_next(standin: StandInBase[Any]) -> None:
    assert isinstance(standin, GraphApiStandIn | ChatwootApiStandIn | MessagesApiStandIn)
    standin.drop_next()


@pytest.mark.parametrize("how", ["control", "python"])
def test_a_drop_fault_carries_the_call_out_then_cuts_its_answer(
    standin: StandInBase[Any], kind: Kind, how: str
) -> None:
    if how == "control":
        assert control(standin, {"op": "fail", "drop": True}).json()["ok"]
    else:
        drop_next(standin)
    with pytest.raises(httpx.RemoteProtocolError):
        call(standin, kind)
    [record] = standin.requests
    assert record.status == 200 and record.fault is not None and record.fault.drop
    assert len(carried_out(standin)) == 1, "the dropped call was still carried out"
    assert standin.faults == []
    assert call(standin, kind).status_code == 200, "one drop, used up"
    assert len(carried_out(standin)) == 2


def test_a_call_held_across_clear_is_answered_503_and_not_recorded(
    standin: StandInBase[Any], kind: Kind
) -> None:
    standin.set_latency(0.5)
    answers: list[httpx.Response] = []
    held = threading.Thread(target=lambda: answers.append(call(standin, kind)))
    held.start()
    standin.wait_for(lambda: standin.requests, timeout=5)
    standin.clear()
    held.join(5)
    assert answers[0].status_code == 503
    assert standin.requests == []


def test_latency_holds_every_call(standin: StandInBase[Any], kind: Kind) -> None:
    standin.set_latency(0.3)
    started = time.monotonic()
    assert call(standin, kind).status_code == 200
    assert time.monotonic() - started >= 0.3


def test_an_unknown_path_is_recorded_as_invalid(standin: StandInBase[Any]) -> None:
    response = httpx.get(standin.url + "/nowhere")
    assert 400 <= response.status_code < 500
    [record] = standin.requests
    assert (record.kind, record.path, record.status) == (
        "invalid",
        "/nowhere",
        response.status_code,
    )


def test_the_listing_shows_each_call_with_what_it_made(
    standin: StandInBase[Any], kind: Kind
) -> None:
    call(standin, kind)
    [listed] = httpx.get(standin.url + "/_requests").json()["requests"]
    assert listed["path"] == kind.path and listed["status"] == 200
    assert listed["body"] == kind.body
    if isinstance(standin, GraphApiStandIn):
        assert listed["sent"]["to"] == "5491155550001"  # the SentMessage, as an object
    elif isinstance(standin, ChatwootApiStandIn):
        assert listed["created"]["content"] == "hola"  # the CreatedMessage
    else:
        assert listed["response"]["content"][0]["type"] == "text"


def test_a_webhook_in_flight_is_pending_until_the_receiver_answers() -> None:
    async def slow_receiver(request: Request) -> Response:
        await asyncio.sleep(2)  # still pending below, however slowly a loaded machine gets there
        return Response(status_code=200)

    app = Starlette(routes=[Route("/hook", slow_receiver, methods=["POST"])])
    with (
        BackgroundServer(app) as receiver,
        ChatwootApiStandIn(webhook_url=receiver.url + "/hook") as chatwoot,
    ):
        httpx.post(
            chatwoot.url + "/api/v1/accounts/1/conversations/7/messages",
            json={"content": "hola"},
            headers={"api_access_token": "cw-token"},
        )
        assert chatwoot.pending_webhooks == 1 and chatwoot.webhook_deliveries == []
        chatwoot.wait_for_webhooks(timeout=15)
        assert [d.response_status for d in chatwoot.webhook_deliveries] == [200]
        assert chatwoot.pending_webhooks == 0
