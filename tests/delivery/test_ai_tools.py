"""The built-in brain's tool-use loop with plugin tools (`AI_TOOLS`): the handler gets the
model's input under the person's lease and its result reaches the next request; a handler's
error reaches the model as an error result; a loop past `AI_MAX_TOOL_ROUNDS` goes to review as
`ai_tool_rounds`; a slow tool is cut at `AI_TOOL_TIMEOUT_S` (the model hears of it; the lease
holds meanwhile, renewed) and at the
turn's deadline (`AI_TURN_TIMEOUT_S`: review as `ai_deadline`). Real worker processes."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from tests.delivery.ai_tools import CALENDAR_ANSWER, record_key
from tests.worker.support import WorkerFleet, in_review, push_message, stats, wait_for
from worker.brains.tools import HAND_OVER_TOOL

pytestmark = pytest.mark.slow
TOOLS = {"AI_TOOLS": "tests.delivery.ai_tools:tools"}


def tool_use(name: str, tool_id: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": args}


async def records(redis: Redis, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(r) for r in await redis.lrange(record_key(prefix), 0, -1)]


async def test_a_plugin_tool_gets_the_input_and_its_result_reaches_the_next_request(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550201"
    ai.queue_reply(
        [
            {"type": "text", "text": "Reviso la agenda."},
            tool_use("check_calendar", "toolu_01", day="sábado"),
            tool_use("broken_lookup", "toolu_02"),
        ],
        "El sábado hay turno a las 16.",
    )
    await fleet.start(1, **{**env, **TOOLS})
    await push_message(redis, prefix, person, "wamid.u1", "¿tienen turno el sábado?")

    sent = await graph.await_for(lambda: graph.sent_texts(person), timeout=15)
    assert [m.body for m in sent] == ["El sábado hay turno a las 16."], "not the preamble"
    calendar, broken = sorted(await records(redis, prefix), key=lambda r: r["event"] != "calendar")
    assert calendar["event"] == "calendar" and calendar["input"] == {"day": "sábado"}
    assert calendar["holder"] == calendar["token"], "the tool runs under the person's lease"
    assert broken["event"] == "broken" and broken["batch"] == calendar["batch"]

    first, second = ai.bodies()
    offered = [tool["name"] for tool in first["tools"]]
    assert offered == ["check_calendar", "broken_lookup", "slow_lookup", HAND_OVER_TOOL]
    assert second["tools"] == first["tools"]
    assert second["messages"][-2]["role"] == "assistant"
    assert [b["type"] for b in second["messages"][-2]["content"]] == [
        "text",
        "tool_use",
        "tool_use",
    ]
    assert second["messages"][-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01",
                "content": f"sábado: {CALENDAR_ANSWER}",
            },
            {
                "type": "tool_result",
                "tool_use_id": "toolu_02",
                "content": "RuntimeError: the lookup service is down",
                "is_error": True,
            },
        ],
    }, "a handler's error is the model's to handle, not a failed turn"

    async def done() -> bool:
        return (await stats(redis, prefix)).get("turns") == 1

    await wait_for(done, "the turn done")
    assert "retries" not in await stats(redis, prefix)


async def test_a_tool_loop_past_the_bound_goes_to_review(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550202"
    ids = itertools.count()
    # A model that never stops asking for the calendar.
    ai.set_default_reply(lambda body: [tool_use("check_calendar", f"toolu_{next(ids)}", day="x")])
    await fleet.start(1, **{**env, **TOOLS, "AI_MAX_TOOL_ROUNDS": "2"})
    await push_message(redis, prefix, person, "wamid.u2", "¿hay turno?")

    (item,) = await in_review(redis, prefix, timeout_s=20)
    assert item["reason"] == "ai_tool_rounds"
    assert "AI_MAX_TOOL_ROUNDS=2" in item["error"]
    assert len(ai.bodies()) == 3, "two rounds answered, the third tool call is not run"
    assert len(await records(redis, prefix)) == 2
    assert graph.sent_texts(person) == []


async def test_a_slow_tool_is_cut_at_its_timeout_and_the_model_is_told(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550203"
    ai.queue_reply([tool_use("slow_lookup", "toolu_s1", seconds=60)], "No pude revisarlo ahora.")
    # The tool's 3 s are twice the lease: renewed, it holds for the whole loop.
    lease = {"LEASE_S": "1.5", "LEASE_RENEW_S": "0.3"}
    await fleet.start(1, **{**env, **TOOLS, **lease, "AI_TOOL_TIMEOUT_S": "3"})
    await push_message(redis, prefix, person, "wamid.u3", "¿y el pedido?")

    sent = await graph.await_for(lambda: graph.sent_texts(person), timeout=15)
    assert [m.body for m in sent] == ["No pude revisarlo ahora."]
    second = ai.bodies()[1]
    assert second["messages"][-1]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_s1",
            "content": "no answer within 3 s",
            "is_error": True,
        }
    ]
    events = [r["event"] for r in await records(redis, prefix)]
    assert events == ["slow_start"], "the handler was cancelled, never finished"

    async def done() -> dict[str, int] | None:
        counts = await stats(redis, prefix)
        return counts if counts.get("turns") == 1 else None

    counts = await wait_for(done, "the turn done")
    assert "leases_expired" not in counts and "retries" not in counts


async def test_the_turn_deadline_cuts_a_slow_tool_and_parks_the_batch(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550204"
    ai.queue_reply([tool_use("slow_lookup", "toolu_s2", seconds=60)], "never asked for")
    settings = {"AI_TOOL_TIMEOUT_S": "60", "AI_TURN_TIMEOUT_S": "2", "AI_TIMEOUT_S": "2"}
    await fleet.start(1, **{**env, **TOOLS, **settings})
    await push_message(redis, prefix, person, "wamid.u4", "¿y el pedido?")

    started = time.monotonic()
    (item,) = await in_review(redis, prefix, timeout_s=20)
    # The turn ended a margin after its 2 s deadline, not after the tool's 60 s (generous
    # margin for a loaded machine).
    assert time.monotonic() - started < 20
    assert item["reason"] == "ai_deadline"
    assert "AI_TURN_TIMEOUT_S=2" in item["error"]
    assert len(ai.bodies()) == 1, "no time left to ask the model again"
    assert graph.sent_texts(person) == []
    assert [r["event"] for r in await records(redis, prefix)] == ["slow_start"]
