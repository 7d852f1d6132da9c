"""The Messages API stand-in, driven by the real `anthropic` SDK (and raw httpx for the wire).

The SDK retries 408/409/429/5xx/529 and timeouts itself; tests that assert on one injected
failure build their client with `max_retries=0`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from scripts.standins import MessagesApiStandIn, MessagesFault, last_user_text, system_text
from tests.standins.support import sdk_client
from tests.support.helpers import API_KEY

MODEL = "claude-test-model"
SYSTEM = [{"type": "text", "text": "Sos el asistente.", "cache_control": {"type": "ephemeral"}}]
MESSAGES = [
    {"role": "user", "content": "hola"},
    {"role": "assistant", "content": "¡Hola! ¿En qué te ayudo?"},
    {"role": "user", "content": "una consulta\n¿tienen turno el sábado?"},
]


@pytest.fixture
async def client(ai: MessagesApiStandIn) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with sdk_client(ai) as c:
        yield c


async def create(client: anthropic.AsyncAnthropic, **overrides: Any) -> anthropic.types.Message:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 256,
        "system": SYSTEM,
        "messages": MESSAGES,
    }
    return await client.messages.create(**(kwargs | overrides))


async def test_scripted_reply_and_recorded_request(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    ai.queue_reply("Sí, el sábado a la tarde hay turno.")
    message = await create(client)
    assert message.content[0].type == "text"
    assert message.content[0].text == "Sí, el sábado a la tarde hay turno."
    assert message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.id.startswith("msg_")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0

    [body] = ai.bodies()
    assert body["system"] == SYSTEM
    assert body["messages"] == MESSAGES
    assert (body["model"], body["max_tokens"]) == (MODEL, 256)
    record = ai.requests[0]
    # older SDKs send `x-api-key`, this one `Authorization: Bearer`; the stand-in takes both
    key = record.headers.get("x-api-key") or record.headers["authorization"].removeprefix("Bearer ")
    assert key == API_KEY
    assert record.headers["anthropic-version"]
    assert record.status == 200 and record.path == "/v1/messages"
    assert system_text(body) == "Sos el asistente."
    assert ai.replies_sent() == ["Sí, el sábado a la tarde hay turno."]


async def test_default_reply_echoes_last_user_text(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    message = await create(client)
    assert message.content[0].text == "stand-in reply to: una consulta\n¿tienen turno el sábado?"
    blocks = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    message = await create(client, messages=blocks, system="plain system")
    # The default reply echoes the last block (a batch's messages, after its header block).
    assert message.content[0].text == "stand-in reply to: b"
    assert last_user_text(ai.last_body or {}) == "a\nb"
    assert system_text(ai.last_body or {}) == "plain system"


async def test_queue_order_callables_and_default(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    seen: list[dict[str, Any]] = []

    def by_request(body: dict[str, Any]) -> str:
        seen.append(body)
        return f"{len(body['messages'])} messages"

    ai.queue_reply("first", by_request)
    ai.set_default_reply("fallback")
    texts = [(await create(client)).content[0].text for _ in range(4)]
    assert texts == ["first", "3 messages", "fallback", "fallback"]
    assert seen[0]["messages"] == MESSAGES
    assert ai.pending_replies == 0


async def test_content_blocks_and_partial_message(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    ai.queue_reply(
        [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "agenda", "input": {"day": "sat"}},
        ],
        {"content": "cut sh", "stop_reason": "max_tokens", "usage": {"output_tokens": 256}},
    )
    message = await create(client)
    assert message.stop_reason == "tool_use"
    assert message.content[1].type == "tool_use"
    assert message.content[1].name == "agenda" and message.content[1].input == {"day": "sat"}
    message = await create(client)
    assert message.stop_reason == "max_tokens"
    assert message.content[0].text == "cut sh" and message.usage.output_tokens == 256


async def test_cut_at_max_tokens_cuts_the_text_as_the_api_does(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    text = "0123456789" * 5  # 50 bytes: 13 tokens at four bytes a token
    ai.set_default_reply(text)
    assert (await create(client, max_tokens=5)).content[0].text == text, "off by default"
    ai.control({"op": "config", "cut_at_max_tokens": True})
    cut = await create(client, max_tokens=5)
    assert cut.stop_reason == "max_tokens" and cut.content[0].text == text[:20]
    whole = await create(client, max_tokens=13)
    assert whole.stop_reason == "end_turn" and whole.content[0].text == text
    ai.queue_reply({"content": [], "stop_reason": "refusal"})
    refused = await create(client, max_tokens=5)
    assert refused.stop_reason == "refusal" and refused.content == [], "scripted wins"
    ai.reset()
    assert ai.state()["cut_at_max_tokens"] is False


TOOL_USE = {"type": "tool_use", "id": "toolu_01", "name": "agenda", "input": {}}
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "16:00"}


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        (
            [*MESSAGES, {"role": "assistant", "content": [TOOL_USE]}, MESSAGES[0]],
            "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_01",
        ),
        (
            [
                *MESSAGES,
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": [TOOL_RESULT]},
            ],
            "unexpected `tool_use_id` found in `tool_result` blocks: toolu_01",
        ),
        (
            [*MESSAGES, {"role": "assistant", "content": "half an answer "}],
            "final assistant content cannot end with trailing whitespace",
        ),
        (None, ""),  # tool_use answered in the next message: accepted
    ],
)
async def test_tool_use_is_paired_as_the_api_demands(
    client: anthropic.AsyncAnthropic, messages: list[Any] | None, problem: str
) -> None:
    if messages is None:
        answered = [*MESSAGES, {"role": "assistant", "content": [TOOL_USE]}]
        answered.append({"role": "user", "content": [TOOL_RESULT]})
        assert (await create(client, messages=answered)).content
        return
    with pytest.raises(anthropic.BadRequestError) as caught:
        await create(client, messages=messages)
    assert problem in caught.value.message


async def test_prompt_cache_usage(ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic) -> None:
    """The rules and the arithmetic in detail: tests/standins/test_prompt_cache.py."""
    long_system = [dict(SYSTEM[0], text="Sos el asistente. " * 300)]  # 1 350 tokens
    first = (await create(client, system=long_system)).usage
    second = (await create(client, system=long_system)).usage
    assert first.cache_creation_input_tokens == 1350 and not first.cache_read_input_tokens
    assert second.cache_read_input_tokens == 1350 and not second.cache_creation_input_tokens
    assert second.input_tokens == first.input_tokens > 0
    short = (await create(client)).usage  # marked, but far under the minimum: not cached
    assert short.cache_creation_input_tokens == 0 and short.cache_read_input_tokens == 0
    plain = (await create(client, system="no cache")).usage
    assert plain.cache_creation_input_tokens == 0 and plain.cache_read_input_tokens == 0


@pytest.mark.parametrize(
    ("error", "exc_class", "status", "error_type"),
    [
        ("overloaded", anthropic.OverloadedError, 529, "overloaded_error"),
        ("rate_limit", anthropic.RateLimitError, 429, "rate_limit_error"),
        ("api_error", anthropic.InternalServerError, 500, "api_error"),
        ("invalid_request", anthropic.BadRequestError, 400, "invalid_request_error"),
        ("authentication", anthropic.AuthenticationError, 401, "authentication_error"),
        ("permission_error", anthropic.PermissionDeniedError, 403, "permission_error"),
        ("not_found", anthropic.NotFoundError, 404, "not_found_error"),
    ],
)
async def test_injected_errors_raise_the_sdk_exception(
    ai: MessagesApiStandIn,
    client: anthropic.AsyncAnthropic,
    error: str,
    exc_class: type[anthropic.APIStatusError],
    status: int,
    error_type: str,
) -> None:
    ai.fail_next(1, error)
    with pytest.raises(exc_class) as raised:
        await create(client)
    exc = raised.value
    assert isinstance(exc, anthropic.APIStatusError)
    assert exc.status_code == status
    assert exc.type == error_type
    assert exc.request_id and exc.request_id.startswith("req_")
    assert isinstance(exc.body, dict) and exc.body["type"] == "error"
    assert exc.body["error"]["type"] == error_type and exc.body["error"]["message"]
    if status == 529:
        assert isinstance(exc, anthropic.InternalServerError)
    if status == 429:
        assert exc.response.headers["retry-after"] == "1"
    assert len(ai.requests) == 1  # max_retries=0: no retry
    # used up
    assert (await create(client)).content[0].text.startswith("stand-in reply to:")


async def test_error_wire_format(ai: MessagesApiStandIn) -> None:
    ai.fail_next(1, "rate_limit", retry_after=7, message="slow down")
    async with httpx.AsyncClient(base_url=ai.url) as c:
        headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
        body = {"model": MODEL, "max_tokens": 5, "messages": MESSAGES}
        response = await c.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    data = response.json()
    assert data == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
        "request_id": response.headers["request-id"],
    }


async def test_wrong_or_missing_key(ai: MessagesApiStandIn) -> None:
    wrong = anthropic.AsyncAnthropic(base_url=ai.url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        await create(wrong)
    await wrong.close()
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        "request_id": raised.value.request_id,
    }
    async with httpx.AsyncClient(base_url=ai.url) as c:
        response = await c.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 5, "messages": MESSAGES},
            headers={"anthropic-version": "2023-06-01"},
        )
        assert response.status_code == 401
        assert response.json()["error"]["message"] == "x-api-key header is required"
        # a bearer token (SDK `auth_token=`) is accepted too
        response = await c.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 5, "messages": MESSAGES},
            headers={"anthropic-version": "2023-06-01", "authorization": f"Bearer {API_KEY}"},
        )
        assert response.status_code == 200
    ai.configure(api_keys=None)
    anyone = anthropic.AsyncAnthropic(base_url=ai.url, api_key="whatever", max_retries=0)
    assert (await create(anyone)).content
    await anyone.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 5, "messages": MESSAGES}, "model: Field required"),
        ({"model": MODEL, "messages": MESSAGES}, "max_tokens: Field required"),
        ({"model": MODEL, "max_tokens": 5}, "messages: Field required"),
        ({"model": MODEL, "max_tokens": 0, "messages": MESSAGES}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 5, "messages": []}, "at least one message"),
        ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}, "role"),
        (
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": 3}]},
            "content",
        ),
        ({"model": MODEL, "max_tokens": 5, "messages": MESSAGES, "system": 3}, "system"),
        ({"model": MODEL, "max_tokens": 5, "messages": MESSAGES, "stream": True}, "stream"),
        ("not json", "not valid JSON"),
    ],
)
async def test_invalid_requests(ai: MessagesApiStandIn, body: Any, message: str) -> None:
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(base_url=ai.url) as c:
        if isinstance(body, str):
            response = await c.post("/v1/messages", content=body, headers=headers)
        else:
            response = await c.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert message in error["message"]


async def test_version_header_required(ai: MessagesApiStandIn) -> None:
    async with httpx.AsyncClient(base_url=ai.url) as c:
        response = await c.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 5, "messages": MESSAGES},
            headers={"x-api-key": API_KEY},
        )
    assert response.status_code == 400
    assert "anthropic-version" in response.json()["error"]["message"]


async def test_unknown_model_is_not_found(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    ai.configure(models=[MODEL])
    assert (await create(client)).model == MODEL
    with pytest.raises(anthropic.NotFoundError, match="claude-retired"):
        await create(client, model="claude-retired")


async def test_queued_fault_is_one_turn(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    ai.queue_reply("one", MessagesFault(error_type="overloaded_error"), "two")
    assert (await create(client)).content[0].text == "one"
    with pytest.raises(anthropic.APIStatusError) as raised:
        await create(client)
    assert raised.value.status_code == 529
    assert (await create(client)).content[0].text == "two"


async def test_raw_5xx(ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic) -> None:
    ai.fail_raw(1, status=502, body="<html>Bad Gateway</html>")
    with pytest.raises(anthropic.InternalServerError) as raised:
        await create(client)
    assert raised.value.status_code == 502 and raised.value.type is None


async def test_sdk_retries_by_default(ai: MessagesApiStandIn) -> None:
    # retry-after-ms keeps the SDK's backoff short; without it the SDK waits about 0.5 s
    ai.fail_next(2, "overloaded", headers={"retry-after-ms": "10"})
    retrying = anthropic.AsyncAnthropic(base_url=ai.url, api_key=API_KEY)  # max_retries=2
    try:
        message = await create(retrying)
    finally:
        await retrying.close()
    assert message.content[0].text.startswith("stand-in reply to:")
    assert [r.status for r in ai.requests] == [529, 529, 200]
    assert [r.headers["x-stainless-retry-count"] for r in ai.requests] == ["0", "1", "2"]


async def test_a_dropped_answer_is_a_connection_error_the_sdk_retries(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    """The reply was generated (recorded 200), the answer cut: without retries the SDK raises
    APIConnectionError; with them it asks again, so the model is called twice."""
    ai.queue_reply("primera", "segunda")
    ai.drop_next(1)
    with pytest.raises(anthropic.APIConnectionError):
        await create(client)
    assert ai.replies_sent() == ["primera"]

    ai.drop_next(1)
    retrying = anthropic.AsyncAnthropic(base_url=ai.url, api_key=API_KEY, max_retries=1)
    try:
        message = await create(retrying)
    finally:
        await retrying.close()
    assert message.content[0].text.startswith("stand-in reply to:")
    assert ai.replies_sent() == ["primera", "segunda", message.content[0].text]


async def test_fail_fraction_seeded(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    async def pattern() -> list[bool]:
        ai.reset()
        ai.fail_fraction(0.5, "api_error", seed=7)
        outcome = []
        for _ in range(12):
            try:
                await create(client)
                outcome.append(True)
            except anthropic.InternalServerError:
                outcome.append(False)
        return outcome

    first = await pattern()
    assert first == await pattern()
    assert True in first and False in first


async def test_an_outage_fails_every_call_for_its_time_then_the_api_answers(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    ai.fail_for(1.0, "overloaded", retry_after=3)
    for _ in range(3):  # not used up by a count: every call in the time fails
        with pytest.raises(anthropic.InternalServerError) as caught:
            await create(client)
        assert caught.value.status_code == 529
        assert caught.value.response.headers["retry-after"] == "3"
    await asyncio.sleep(1.1)
    assert (await create(client)).content[0].text.startswith("stand-in reply to:")
    assert [r.status for r in ai.requests] == [529, 529, 529, 200]
    assert ai.faults == [], "an outage that is over is gone"
    async with httpx.AsyncClient(base_url=ai.url) as c:
        answer = await c.post(
            "/_control", json={"op": "outage", "seconds": 30, "error": "rate_limit"}
        )
        assert answer.status_code == 200
        (fault,) = answer.json()["state"]["faults"]
        assert fault["error_type"] == "rate_limit_error" and fault["until"] > time.time() + 20
        # Without its length an outage is refused, and nothing is added.
        assert (await c.post("/_control", json={"op": "outage"})).status_code == 400
    with pytest.raises(anthropic.RateLimitError):
        await create(client)
    assert len(ai.faults) == 1


async def test_timeout_and_latency(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    ai.hang_next(1, seconds=2)
    impatient = client.with_options(timeout=0.2)
    started = time.monotonic()
    with pytest.raises(anthropic.APITimeoutError):
        await create(impatient)
    assert time.monotonic() - started < 1.8, "the 0.2 s timeout, not the 2 s hang"
    ai.set_latency(0.25)
    started = time.monotonic()
    await create(client)
    assert time.monotonic() - started >= 0.25
    record = ai.requests[-1]
    assert record.answered is not None and record.answered - record.time >= 0.25


async def test_count_tokens(ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic) -> None:
    count = await client.messages.count_tokens(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert count.input_tokens > 0
    assert ai.bodies() == []  # not a Messages call


async def test_control_over_http(ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic) -> None:
    async with httpx.AsyncClient(base_url=ai.url) as c:

        async def control(payload: dict[str, Any]) -> httpx.Response:
            return await c.post("/_control", json=payload)

        assert (await control({"op": "reply", "texts": ["a", "b"]})).json()["ok"]
        assert (await control({"op": "fail", "error": "rate_limit", "count": 1})).status_code == 200
        with pytest.raises(anthropic.RateLimitError):
            await create(client)
        assert [(await create(client)).content[0].text for _ in range(2)] == ["a", "b"]

        await control({"op": "reply", "content": [{"type": "text", "text": "blocks"}]})
        await control({"op": "reply", "message": {"content": "m", "stop_reason": "max_tokens"}})
        assert (await create(client)).content[0].text == "blocks"
        assert (await create(client)).stop_reason == "max_tokens"

        await control({"op": "default_reply", "text": "fixed"})
        assert (await create(client)).content[0].text == "fixed"
        await control({"op": "fail", "status": 500, "count": None})
        with pytest.raises(anthropic.InternalServerError):
            await create(client)
        await control({"op": "reset"})
        await control({"op": "hang", "seconds": 1, "count": 1})
        with pytest.raises(anthropic.APITimeoutError):
            await create(client.with_options(timeout=0.1))
        await control({"op": "config", "api_keys": ["other"]})
        with pytest.raises(anthropic.AuthenticationError):
            await create(client)

        state = (await c.get("/_control")).json()
        assert state["api_keys"] == ["other"] and state["faults"] == []
        dump = (await c.get("/_requests")).json()["requests"]
        assert dump[0]["status"] == 429 and dump[0]["body"]["model"] == MODEL

        await control({"op": "reset_all"})
        assert (await create(client)).content[0].text.startswith("stand-in reply to:")
        assert (await control({"op": "nope"})).status_code == 400
        assert (await control({"op": "fail"})).status_code == 400
        assert (await control({"op": "fail", "error": "bogus"})).status_code == 400
        response = await c.get("/v1/models")
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found_error"


async def test_a_request_hung_across_reset_takes_nothing(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    ai.hang_next(1, seconds=0.4)
    with pytest.raises(anthropic.APITimeoutError):
        await create(client.with_options(timeout=0.1))
    ai.reset()  # the next test begins while that request still waits
    ai.queue_reply("for the next test")
    await asyncio.sleep(0.5)
    assert ai.pending_replies == 1
    assert (await create(client)).content[0].text == "for the next test"
