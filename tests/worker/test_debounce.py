"""Debounce, cap, order and dedupe, end to end: real worker processes, messages via ingest."""

from __future__ import annotations

import asyncio
from typing import Any

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
    # A 2 s window: a loaded machine's stall between two lines (0.08 s apart) must not end the
    # burst; the 10 s cap stays far from the window, so "debounced" and "capped" stay apart.
    await fleet.start(1, DEBOUNCE_WINDOW_S="2", MAX_WAIT_S="10")
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
    before_last = last_pushed = 0
    for message_id, (kind, text) in zip(ids, burst, strict=True):
        before_last = now_ms()
        assert await push_message(redis, prefix, person, message_id, text, type=kind)
        last_pushed = now_ms()
        await asyncio.sleep(0.08)

    (turn,) = await records.wait_turns(person, 1)
    await asyncio.sleep(0.8)  # a second turn would have started by now
    assert len(await records.turns(person)) == 1
    assert turn.ids == ids
    assert turn.start["types"] == [kind for kind, _ in burst]
    assert turn.start["texts"] == [text for _, text in burst]
    # Debounced: not before `window` after the last message (taken in after `before_last`),
    # and promptly after that: 3 s of room for a loaded machine, still ~5 s before the cap.
    assert before_last + 2000 - 30 <= turn.start["ms"] <= last_pushed + 2000 + 3000
    # The brain's "end" record comes before the sender's reply: wait for the reply itself.
    (reply,) = await wait_for(lambda: outbox(redis, prefix), "the reply")
    assert reply["batch_id"] == turn.batch and reply["message_ids"] == ids
    assert reply["person"] == person and "hola / una consulta" in reply["text"]


async def test_a_person_who_never_stops_typing_gets_a_turn_every_max_wait(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    # Lines 0.4 s apart against a 1.5 s window: a stall of a loaded machine (up to 1.1 s) does
    # not end a batch; the 4 s cap is far enough from the window to tell the two apart.
    await fleet.start(1, DEBOUNCE_WINDOW_S="1.5", MAX_WAIT_S="4")
    person = "5491100000002"
    before: dict[str, int] = {}  # just before each push: the message is taken in after it
    pushed: dict[str, int] = {}  # just after it
    for i in range(23):  # one message every 0.4 s for 8.8 s: the window never elapses
        message_id = f"wamid.typing.{i:02d}"
        before[message_id] = now_ms()
        assert await push_message(redis, prefix, person, message_id, f"linea {i}")
        pushed[message_id] = now_ms()
        await asyncio.sleep(0.4)

    async def all_answered() -> bool:
        answered = [i for t in await records.turns(person) if t.outcome == "end" for i in t.ids]
        return len(answered) == len(pushed)

    await wait_for(all_answered, "every typed line answered", timeout_s=30)
    turns = await records.turns(person)
    assert [i for t in turns for i in t.ids] == list(pushed), "each line once, in order"
    assert len(turns) >= 3
    for turn in turns:
        # Uncapped, the first two batches would wait for the typing to stop (>= 6.7 s).
        waited = turn.start["ms"] - pushed[turn.ids[0]]
        assert waited <= 4000 + 1500, f"capped at max_wait: waited {waited} ms"
    for turn in turns[:-1]:  # while typing, only the cap ends a batch
        waited = turn.start["ms"] - before[turn.ids[0]]
        assert waited >= 4000 - 50, f"not before max_wait while typing: waited {waited} ms"
    # After the last line the window (1.5 s) ends the final batch; the cap would be >= 3.2 s.
    last_id = turns[-1].ids[-1]
    assert turns[-1].start["ms"] - before[last_id] >= 1500 - 50
    assert turns[-1].start["ms"] - pushed[last_id] <= 1500 + 1000


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

    # The brain's "end" record comes before the sender's reply: wait for the replies themselves.
    async def both_replies() -> list[dict[str, Any]]:
        replies = await outbox(redis, prefix)
        return replies if len(replies) >= 2 else []

    replies = await wait_for(both_replies, "both replies in the outbox")
    assert [r["batch_id"] for r in replies] == [first.batch, second.batch]
    assert first.last is not None
    # Batch n+1 starts only after batch n ended (its reply sent)...
    assert second.start["ms"] >= first.last["ms"]
    assert second.start["ms"] >= replies[0]["sent_ms"]
    # ...and promptly: its messages were due long before the first turn ended (3 s of room
    # for a loaded machine; a sweep, the other way they could start, is 60 s away).
    assert second.start["ms"] - replies[0]["sent_ms"] <= 3000


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
    await wait_for(lambda: outbox(redis, prefix), "the reply")  # sent after the brain's record

    # A delivery long after the turn is still a duplicate: no second turn.
    assert not await push_message(redis, prefix, person, "wamid.dup.a", "hola")
    assert not await push_message(redis, prefix, person, "wamid.dup.b", "otra")
    await asyncio.sleep(1.0)
    assert len(await records.turns(person)) == 1
    assert len(await outbox(redis, prefix)) == 1
    assert (await stats(redis, prefix))["messages"] == 2
