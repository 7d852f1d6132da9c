"""A custom brain (`BRAIN=package.module:attr`) that calls a tool inside the turn runs under the
person's lease for the whole turn: the tool takes longer than LEASE_S, the lease is renewed,
no other worker starts that person meanwhile, and what the person writes during the turn
becomes the next batch, started only after this one ended. Two real worker processes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from tests.delivery.brains import record_key
from tests.worker.support import WorkerFleet, push_message, stats, wait_for

pytestmark = pytest.mark.slow
PERSON = "5491155550061"
# Renewed every 0.3 s, the 1.5 s lease survives a loaded machine's stalls (up to 1.2 s); the
# tool still runs well past it, with a second of room for its last sample.
TOOL_SECONDS = 4.0
LEASE_S = 1.5


async def test_a_tool_call_longer_than_the_lease_keeps_the_person_locked(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    ai.queue_reply(
        [
            {"type": "text", "text": "Reviso la agenda."},
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": "check_calendar",
                "input": {"day": "sábado", "seconds": TOOL_SECONDS},
            },
        ],
        "El sábado a las 16 hay turno.",
    )
    await fleet.start(
        2,
        **{
            **env,
            "BRAIN": "tests.delivery.brains:ToolBrain",
            "LEASE_S": str(LEASE_S),
            "LEASE_RENEW_S": "0.3",
        },
    )
    await push_message(redis, prefix, PERSON, "wamid.b1", "¿tienen turno el sábado?")

    async def records() -> list[dict[str, Any]]:
        return [json.loads(r) for r in await redis.lrange(record_key(prefix), 0, -1)]

    async def tool_running() -> bool:
        return any(r["event"] == "tool" for r in await records())

    await wait_for(tool_running, "the tool running")
    await push_message(redis, prefix, PERSON, "wamid.b2", "a la tarde")  # during the turn

    sent = await graph.await_for(
        lambda: len(graph.sent_texts(PERSON)) >= 2 and graph.sent_texts(PERSON), timeout=15
    )
    assert [m.body for m in sent] == [
        "El sábado a las 16 hay turno.",
        "stand-in reply to: a la tarde",
    ]

    seen = await records()
    starts = [r for r in seen if r["event"] == "start"]
    assert [r["texts"] for r in starts] == [["¿tienen turno el sábado?"], ["a la tarde"]]
    first, second = starts
    samples = [r for r in seen if r["event"] == "tool"]
    assert {r["batch"] for r in samples} == {first["batch"]}
    assert samples[-1]["ms"] - samples[0]["ms"] >= (TOOL_SECONDS - 1.0) * 1000 > LEASE_S * 1000
    assert all(r["holder"] == first["token"] and r["pttl"] > 0 for r in samples), (
        "the lock stays with the turn, renewed, for the whole tool call"
    )
    (end_first,) = [r for r in seen if r["event"] == "end" and r["batch"] == first["batch"]]
    assert second["ms"] >= end_first["ms"], "the next batch starts after this one ended"

    bodies = ai.bodies()
    assert len(bodies) == 3, "tool call, tool result, next batch"
    assert bodies[1]["messages"][-1]["content"][0]["type"] == "tool_result"
    assert "16:00 libre" in bodies[1]["messages"][-1]["content"][0]["content"]

    async def both_ended() -> dict[str, int] | None:
        counts = await stats(redis, prefix)
        return counts if counts.get("turns") == 2 else None

    counts = await wait_for(both_ended, "both turns ended")
    assert "leases_expired" not in counts and "retries" not in counts
