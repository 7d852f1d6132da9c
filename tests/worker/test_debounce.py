"""Debounce, cap, order and dedupe, end to end: real worker processes, messages via ingest."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from tests.worker.support import (
    Records,
    WorkerFleet,
    now_ms,
    outbox,
    push_message,
    stats,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.mark.cluster
async def test_burst_within_the_window_is_one_turn_with_every_message_in_order(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(1, DEBOUNCE_WINDOW_S="0.5", MAX_WAIT_S="5")
    person = "5491100000001"
    burst = [
        ("text", "hola"),
        ("text", "una consulta"),
        ("image", ""),
        ("text", "¿tienen turno el sábado?"),
        ("location", ""),
        ("text", "a la tarde"),
    ]
    ids = [f"wamid.burst.{i}" for i in range(len(burst))]
    last_pushed = 0
    for message_id, (kind, text) in zip(ids, burst, strict=True):
        assert await push_message(redis, prefix, person, message_id, text, type=kind)
        last_pushed = now_ms()
        await asyncio.sleep(0.08)

    (turn,) = await records.wait_turns(person, 1)
    await asyncio.sleep(0.8)  # a second turn would have started by now
    assert len(await records.turns(person)) == 1
    assert turn.ids == ids
    assert turn.start["types"] == [kind for kind, _ in burst]
    assert turn.start["texts"] == [text for _, text in burst]
    # Debounced: not before `window` after the last message, and promptly after that.
    assert last_pushed + 500 - 30 <= turn.start["ms"] <= last_pushed + 500 + 700
    (reply,) = await outbox(redis, prefix)
    assert reply["batch_id"] == turn.batch and reply["message_ids"] == ids
    assert reply["person"] == person and "hola / una consulta" in reply["text"]


async def test_a_person_who_never_stops_typing_gets_a_turn_every_max_wait(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(1, DEBOUNCE_WINDOW_S="1", MAX_WAIT_S="3")
    person = "5491100000002"
    pushed: dict[str, int] = {}
    for i in range(15):  # one message every 0.5 s for 7 s: the window never elapses
        message_id = f"wamid.typing.{i:02d}"
        assert await push_message(redis, prefix, person, message_id, f"linea {i}")
        pushed[message_id] = now_ms()
        await asyncio.sleep(0.5)

    async def all_answered() -> bool:
        answered = [i for t in await records.turns(person) if t.outcome == "end" for i in t.ids]
        return len(answered) == len(pushed)

    await wait_for(all_answered, "every typed line answered", timeout_s=10)
    turns = await records.turns(person)
    assert [i for t in turns for i in t.ids] == list(pushed), "each line once, in order"
    assert len(turns) >= 3
    for turn in turns:
        waited = turn.start["ms"] - pushed[turn.ids[0]]
        assert waited <= 3000 + 600, f"capped at max_wait: waited {waited} ms"
    for turn in turns[:-1]:  # while typing, only the cap ends a batch
        waited = turn.start["ms"] - pushed[turn.ids[0]]
        assert waited >= 3000 - 600, f"not before max_wait while typing: waited {waited} ms"
    # After the last line the window (1 s) ends the final batch.
    last = turns[-1].start["ms"] - pushed[turns[-1].ids[-1]]
    assert 1000 - 30 <= last <= 1000 + 700


async def test_messages_sent_during_a_turn_form_the_next_batch_after_it_ended(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(2, DEBOUNCE_WINDOW_S="0.3")
    person = "5491100000003"
    await push_message(redis, prefix, person, "wamid.first", "hola !sleeponce=1.5")
    await records.wait_turns(person, 1, outcome=None)
    for i in range(3):
        await push_message(redis, prefix, person, f"wamid.during.{i}", f"durante {i}")
        await asyncio.sleep(0.1)

    first, second = await records.wait_turns(person, 2)
    assert first.ids == ["wamid.first"]
    assert second.ids == [f"wamid.during.{i}" for i in range(3)]
    assert first.batch != second.batch
    replies = await outbox(redis, prefix)
    assert [r["batch_id"] for r in replies] == [first.batch, second.batch]
    assert first.last is not None
    # Batch n+1 starts only after batch n ended (its reply sent)...
    assert second.start["ms"] >= first.last["ms"]
    assert second.start["ms"] >= replies[0]["sent_ms"]
    # ...and promptly: its messages were due long before the first turn ended.
    assert second.start["ms"] - replies[0]["sent_ms"] <= 700


@pytest.mark.cluster
async def test_duplicate_deliveries_are_one_message_in_one_turn(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(1)
    person = "5491100000004"
    assert await push_message(redis, prefix, person, "wamid.dup.a", "hola")
    assert not await push_message(redis, prefix, person, "wamid.dup.a", "hola")
    assert await push_message(redis, prefix, person, "wamid.dup.b", "otra")
    assert not await push_message(redis, prefix, person, "wamid.dup.a", "hola")
    (turn,) = await records.wait_turns(person, 1)
    assert turn.ids == ["wamid.dup.a", "wamid.dup.b"]

    # A delivery long after the turn is still a duplicate: no second turn.
    assert not await push_message(redis, prefix, person, "wamid.dup.a", "hola")
    assert not await push_message(redis, prefix, person, "wamid.dup.b", "otra")
    await asyncio.sleep(1.0)
    assert len(await records.turns(person)) == 1
    assert len(await outbox(redis, prefix)) == 1
    assert (await stats(redis, prefix))["messages"] == 2
