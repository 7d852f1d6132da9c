"""The Graph API stand-in, driven by a real httpx.AsyncClient the way the worker calls Meta."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from scripts.standins import GraphApiStandIn, GraphFault
from tests.support.helpers import TOKEN

PHONE_NUMBER_ID = "106500000000001"
PERSON = "5491155550001"
OTHER = "5491155550002"
PATH = f"/v23.0/{PHONE_NUMBER_ID}/messages"
# Only the answer is waited for briefly: a connect slowed by a loaded machine is not the
# ReadTimeout these tests expect.
READ_TIMEOUT = httpx.Timeout(5.0, read=0.1)


def text(body: str = "hola", to: str = PERSON, **extra: Any) -> dict[str, Any]:
    return {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "text",
        "text": {"body": body, "preview_url": False},
        **extra,
    }


def template(to: str = PERSON) -> dict[str, Any]:
    return {
        "messaging_product": "whatsapp",
        "to": to,
        "type": "template",
        "template": {"name": "reengage", "language": {"code": "es_AR"}},
    }


READ = {
    "messaging_product": "whatsapp",
    "status": "read",
    "message_id": "wamid.INBOUND0001",
    "typing_indicator": {"type": "text"},
}


@pytest.fixture
async def client(graph: GraphApiStandIn) -> Any:
    async with httpx.AsyncClient(
        base_url=graph.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5.0
    ) as c:
        yield c


def assert_meta_error(response: httpx.Response, status: int, code: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["type"] == "OAuthException"
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["fbtrace_id"], str) and error["fbtrace_id"]
    return error


# ---------------------------------------------------------------------- happy paths


async def test_text_send(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    r1 = await client.post(PATH, json=text("hola", context={"message_id": "wamid.IN1"}))
    r2 = await client.post(PATH, json=text("¿qué tal?"))
    assert r1.status_code == 200
    data = r1.json()
    assert data["messaging_product"] == "whatsapp"
    assert data["contacts"] == [{"input": PERSON, "wa_id": PERSON}]
    wamid = data["messages"][0]["id"]
    assert wamid.startswith("wamid.")
    assert r2.json()["messages"][0]["id"] != wamid

    sent = graph.sent_texts(to=PERSON)
    assert [m.body for m in sent] == ["hola", "¿qué tal?"]
    assert sent[0].wamid == wamid
    assert sent[0].context_message_id == "wamid.IN1"
    assert sent[0].phone_number_id == PHONE_NUMBER_ID
    assert graph.sent_texts(to=OTHER) == []
    record = graph.requests[0]
    assert record.headers["authorization"] == f"Bearer {TOKEN}"
    assert record.body == text("hola", context={"message_id": "wamid.IN1"})
    assert record.status == 200 and record.response == data and record.kind == "text"


async def test_recipient_with_plus_is_normalised(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    response = await client.post(PATH, json=text(to="+" + PERSON))
    assert response.json()["contacts"] == [{"input": "+" + PERSON, "wa_id": PERSON}]
    assert len(graph.sent_texts(to=PERSON)) == 1


async def test_a_username_is_addressed_with_recipient(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    """A business-scoped user id goes in `recipient` instead of `to`; anything that is not one
    there gets Meta's 400 (code 100)."""
    user_id = "AR.4410000000000000001"
    body = {k: v for k, v in text("hola").items() if k != "to"}
    response = await client.post(PATH, json={**body, "recipient": user_id})
    assert response.status_code == 200, response.text
    (sent,) = graph.sent_texts()
    assert sent.to == user_id and sent.payload["recipient"] == user_id
    for bad in ("", "5491155550001", "AR.", 7):
        assert_meta_error(await client.post(PATH, json={**body, "recipient": bad}), 400, 100)
    assert_meta_error(await client.post(PATH, json=body), 400, 100)  # neither `to` nor it
    assert len(graph.sent_texts()) == 1


async def test_body_limit_is_4096_characters(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    assert (await client.post(PATH, json=text("x" * 4096))).status_code == 200
    error = assert_meta_error(await client.post(PATH, json=text("x" * 4097)), 400, 100)
    assert "4096" in error["error_data"]["details"]
    assert len(graph.sent_texts()) == 1


async def test_template_send(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    response = await client.post(PATH, json=template())
    assert response.status_code == 200
    assert response.json()["messages"][0]["id"].startswith("wamid.")
    [sent] = graph.sent_templates(to=PERSON)
    assert (sent.template_name, sent.template_language) == ("reengage", "es_AR")
    assert graph.sent_texts() == []


async def test_read_receipt_with_typing_indicator(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    response = await client.post(PATH, json=READ)
    assert response.status_code == 200
    assert response.json() == {"success": True}
    without_typing = {k: v for k, v in READ.items() if k != "typing_indicator"}
    assert (await client.post(PATH, json=without_typing)).json() == {"success": True}
    receipts = graph.read_receipts()
    assert [(r.message_id, r.typing_indicator) for r in receipts] == [
        ("wamid.INBOUND0001", "text"),
        ("wamid.INBOUND0001", None),
    ]
    assert graph.sent_messages() == []


# ---------------------------------------------------------------------- bad requests


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer", "Basic dGVzdA=="])
async def test_bad_token_is_401_code_190(graph: GraphApiStandIn, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    async with httpx.AsyncClient(base_url=graph.url) as c:
        response = await c.post(PATH, json=text(), headers=headers)
    assert_meta_error(response, 401, 190)
    assert graph.sent_texts() == []
    assert graph.requests[0].kind == "unauthorized"


async def test_token_rotation_and_any_token(graph: GraphApiStandIn) -> None:
    graph.configure(access_tokens="old, new")
    async with httpx.AsyncClient(base_url=graph.url) as c:
        for token, status in (("old", 200), ("new", 200), (TOKEN, 401)):
            response = await c.post(PATH, json=text(), headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == status
        graph.configure(access_tokens=None)
        response = await c.post(PATH, json=text(), headers={"Authorization": "Bearer whatever"})
        assert response.status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        {"to": PERSON, "type": "text", "text": {"body": "no product"}},
        {"messaging_product": "whatsapp", "type": "text", "text": {"body": "no to"}},
        {"messaging_product": "whatsapp", "to": PERSON, "type": "text", "text": {}},
        {"messaging_product": "whatsapp", "to": PERSON, "type": "text", "text": {"body": "  "}},
        {"messaging_product": "whatsapp", "to": PERSON, "type": "carrier_pigeon"},
        {"messaging_product": "whatsapp", "to": PERSON, "type": "template", "template": {}},
        {
            "messaging_product": "whatsapp",
            "to": PERSON,
            "type": "template",
            "template": {"name": "t", "language": "es"},
        },
        {**text(), "context": {"message_id": 5}},
        {"messaging_product": "whatsapp", "status": "read"},
        {**READ, "status": "delivered"},
        {**READ, "typing_indicator": {"type": "audio"}},
    ],
)
async def test_malformed_is_400_code_100(
    graph: GraphApiStandIn, client: httpx.AsyncClient, body: Any
) -> None:
    if isinstance(body, bytes):
        response = await client.post(PATH, content=body)
    else:
        response = await client.post(PATH, json=body)
    assert_meta_error(response, 400, 100)
    assert graph.sent_messages() == [] and graph.read_receipts() == []
    assert graph.requests[-1].kind == "invalid"


@pytest.mark.parametrize(
    "path", ["/106500000000001/messages", "/latest/106500000000001/messages", "/v23.0/abc/messages"]
)
async def test_wrong_path_is_400_code_100(client: httpx.AsyncClient, path: str) -> None:
    assert_meta_error(await client.post(path, json=text()), 400, 100)


# ---------------------------------------------------------------------- injected errors


@pytest.mark.parametrize(
    ("code", "status", "words"),
    [
        (130429, 429, "Rate limit"),
        (131056, 400, "pair rate limit"),
        (131000, 500, "Something went wrong"),
        (131016, 503, "Service unavailable"),
        (131047, 400, "Re-engagement message"),
        (131026, 400, "Undeliverable"),
        (190, 401, "access token"),
        (100, 400, "Invalid parameter"),
        (999999, 400, "999999"),
    ],
)
async def test_fail_next(
    graph: GraphApiStandIn, client: httpx.AsyncClient, code: int, status: int, words: str
) -> None:
    graph.fail_next(1, code=code)
    error = assert_meta_error(await client.post(PATH, json=text("one")), status, code)
    assert words.lower() in error["message"].lower()
    assert error["error_data"]["details"]
    assert error["error_data"]["messaging_product"] == "whatsapp"
    assert graph.sent_texts() == []
    # used up: the next send goes through
    assert (await client.post(PATH, json=text("two"))).status_code == 200
    assert [m.body for m in graph.sent_texts()] == ["two"]
    assert graph.requests[0].fault is not None and graph.requests[0].status == status


async def test_fail_next_n_with_custom_status_and_message(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    graph.fail_next(2, code=131000, status=502, message="boom", details="exploded")
    for _ in range(2):
        error = assert_meta_error(await client.post(PATH, json=text()), 502, 131000)
        assert (error["message"], error["error_data"]["details"]) == ("boom", "exploded")
    assert (await client.post(PATH, json=text())).status_code == 200


async def test_faults_skip_read_receipts_unless_asked(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    graph.fail_next(1, code=131000)
    assert (await client.post(PATH, json=READ)).status_code == 200
    assert (await client.post(PATH, json=text())).status_code == 500
    graph.fail_next(1, code=131000, kinds=["read"])
    assert (await client.post(PATH, json=text())).status_code == 200
    assert (await client.post(PATH, json=READ)).status_code == 500


async def test_fail_recipient_always(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    graph.fail_recipient(OTHER, code=131047)
    for _ in range(3):
        assert_meta_error(await client.post(PATH, json=text(to=OTHER)), 400, 131047)
        assert (await client.post(PATH, json=text(to=PERSON))).status_code == 200
    assert graph.sent_texts(to=OTHER) == []
    assert len(graph.sent_texts(to=PERSON)) == 3
    # templates count as sends too (a closed window rejects nothing else in real life either)
    assert_meta_error(await client.post(PATH, json=template(to=OTHER)), 400, 131047)


async def fraction_pattern(graph: GraphApiStandIn, client: httpx.AsyncClient) -> list[int]:
    graph.reset()
    graph.fail_fraction(0.3, code=130429, seed=42)
    return [(await client.post(PATH, json=text())).status_code for _ in range(40)]


async def test_fail_fraction_is_seeded(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    first = await fraction_pattern(graph, client)
    assert first == await fraction_pattern(graph, client)
    assert set(first) == {200, 429}
    assert 4 <= first.count(429) <= 20


async def test_fail_fraction_with_limit(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    graph.fail_fraction(1.0, code=131000, n=2)
    codes = [(await client.post(PATH, json=text())).status_code for _ in range(4)]
    assert codes == [500, 500, 200, 200]


async def test_raw_5xx_without_json(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    graph.fail_raw(1, status=503, body="upstream connect error")
    response = await client.post(PATH, json=text())
    assert response.status_code == 503
    assert response.text == "upstream connect error"
    assert response.headers["content-type"].startswith("text/html")
    with pytest.raises(ValueError):
        response.json()
    assert graph.sent_texts() == []


async def test_latency(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    # A latency long enough that a loaded CI machine cannot blur the two cases.
    graph.set_latency(1.5)
    started = time.monotonic()
    assert (await client.post(PATH, json=text())).status_code == 200
    assert time.monotonic() - started >= 1.5
    (record,) = graph.requests
    assert record.answered is not None and record.answered - record.time >= 1.5
    graph.set_latency(0)
    started = time.monotonic()
    await client.post(PATH, json=text())
    assert time.monotonic() - started < 1.5


async def _send_given_up(
    graph: GraphApiStandIn, client: httpx.AsyncClient, body: str, hang_s: float
) -> None:
    """A text send the stand-in holds for `hang_s`, longer than the client waits: the client
    gives up (ReadTimeout) while the stand-in still has it."""
    graph.hang_next(1, seconds=hang_s)
    with pytest.raises(httpx.ReadTimeout):
        await client.post(PATH, json=text(body), timeout=READ_TIMEOUT)


async def test_hang_times_out_but_the_message_is_accepted(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    await _send_given_up(graph, client, "slow", hang_s=0.5)
    assert graph.sent_texts() == []  # still "in flight" at Meta
    record = graph.requests[0]
    assert record.status is None
    sent = await graph.await_for(graph.sent_texts, timeout=2)
    assert [m.body for m in sent] == ["slow"]  # Meta did accept it: a blind retry duplicates
    assert record.status == 200


async def test_a_dropped_answer_after_the_send_was_accepted(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    """Sends only, by default; `kinds` takes read receipts too. Each is carried out."""
    graph.drop_next(1)
    assert (await client.post(PATH, json=READ)).status_code == 200
    with pytest.raises(httpx.RemoteProtocolError):
        await client.post(PATH, json=text("cut"))
    assert [m.body for m in graph.sent_texts()] == ["cut"]

    graph.drop_next(1, kinds=["read"])
    with pytest.raises(httpx.RemoteProtocolError):
        await client.post(PATH, json=READ)
    assert len(graph.read_receipts()) == 2
    assert [r.status for r in graph.requests] == [200, 200, 200]


async def test_hang_then_error(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    graph.hang_next(1, seconds=0.3, code=131000)
    started = time.monotonic()
    assert_meta_error(await client.post(PATH, json=text()), 500, 131000)
    assert time.monotonic() - started >= 0.3
    assert graph.sent_texts() == []


async def test_stop_interrupts_a_hang() -> None:
    standin = GraphApiStandIn().start()
    standin.hang_next(1, seconds=60)
    async with httpx.AsyncClient(base_url=standin.url) as c:
        headers = {"Authorization": "Bearer test-token"}
        with pytest.raises(httpx.ReadTimeout):
            await c.post(PATH, json=text(), headers=headers, timeout=READ_TIMEOUT)
    started = time.monotonic()
    standin.stop()
    assert time.monotonic() - started < 3


async def test_add_fault_and_remove(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    fault = graph.add_fault(GraphFault(code=131000, count=None))
    assert graph.faults == [fault]
    assert (await client.post(PATH, json=text())).status_code == 500
    assert (await client.post(PATH, json=text())).status_code == 500
    assert fault.hits == 2
    graph.remove_fault(fault)
    assert (await client.post(PATH, json=text())).status_code == 200


# ---------------------------------------------------------------------- HTTP control


async def test_control_over_http(graph: GraphApiStandIn, client: httpx.AsyncClient) -> None:
    async def control(payload: dict[str, Any]) -> httpx.Response:
        return await client.post("/_control", json=payload)

    r = await control({"op": "fail", "code": 130429, "count": 2})
    assert r.status_code == 200 and r.json()["ok"] is True
    assert r.json()["state"]["faults"][0]["code"] == 130429
    statuses = [(await client.post(PATH, json=text())).status_code for _ in range(3)]
    assert statuses == [429, 429, 200]

    await control({"op": "fail", "code": 131047, "to": OTHER, "count": None})
    assert (await client.post(PATH, json=text(to=OTHER))).status_code == 400
    assert (await client.post(PATH, json=text(to=OTHER))).status_code == 400
    await control({"op": "fail", "raw_body": "Bad Gateway"})
    assert (await client.post(PATH, json=text())).status_code == 502
    await control({"op": "fail", "code": 131000, "probability": 1.0, "seed": 3, "kinds": ["read"]})
    assert (await client.post(PATH, json=READ)).status_code == 500
    await control({"op": "reset"})
    assert (await client.post(PATH, json=text(to=OTHER))).status_code == 200

    await control({"op": "latency", "seconds": 0.2})
    started = time.monotonic()
    await client.post(PATH, json=text())
    assert time.monotonic() - started >= 0.2
    await control({"op": "hang", "seconds": 0.3, "count": 1})
    with pytest.raises(httpx.ReadTimeout):
        await client.post(PATH, json=text(), timeout=READ_TIMEOUT)
    await control({"op": "reset"})

    dump = (await client.get("/_requests")).json()
    assert len(dump["requests"]) == len(graph.requests)
    assert dump["requests"][0]["status"] == 429
    assert any("sent" in r for r in dump["requests"])
    state = (await client.get("/_control")).json()
    assert state["faults"] == [] and state["latency"] == 0

    await control({"op": "clear"})
    assert graph.requests == []
    r = await control({"op": "fly"})
    assert r.status_code == 400 and r.json()["ok"] is False
    assert (await client.post("/_control", content=b"{")).status_code == 400
    assert (await control({"op": "fail"})).status_code == 400
    assert graph.faults == []


async def test_a_send_hung_across_reset_is_dropped(
    graph: GraphApiStandIn, client: httpx.AsyncClient
) -> None:
    await _send_given_up(graph, client, "old", hang_s=0.3)
    graph.reset()
    await asyncio.sleep(0.4)
    assert graph.requests == [] and graph.sent_texts() == []
