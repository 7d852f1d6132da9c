"""A turn that ends done leaves nothing for the cycle collector.

Its objects go by reference counting the moment it ends. A reference cycle among them (an
`UnderLease` holding the `LeasedDelivery` that held it did) keeps the turn's batch, messages,
state and presentation alive until the collector runs, and the collector then walks every
running turn's objects: ~15 % of the worker's CPU in the throughput benchmark
(docs/benchmarks/worker.md, 2026-12-05).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import orjson

from shared import events
from shared.conversation.batch import Batch
from shared.keys import Keys
from shared.senders.loading import as_sender
from shared.settings import Settings
from worker.brains.ai_pause import AIPause
from worker.fleet.leases import Leases
from worker.turn.turn import Turn, TurnTools

PERSON = "5491155550001"


class _Brain:
    async def reply(self, batch: Batch) -> str:
        return "Hola, ¿en qué te ayudo?"


class _Sender:
    async def send(self, batch: Batch, text: str, part: int = 0) -> str:
        return f"wamid.OUT{part}"


class _Store:
    """What a done turn writes, answered at once as Redis would."""

    def __init__(self) -> None:
        self.finished: list[bytes] = []

    async def save_reply(self, batch: Batch, reply: str) -> str:
        return reply

    async def finish_done(self, batch: Batch, remember: bytes = b"", *args: Any, **kw: Any) -> bool:
        self.finished.append(remember)
        return True


class _NoPause:
    """Redis as the AI pause reads it: no pause set."""

    async def get(self, key: str) -> None:
        return None


def _claimed(n: int) -> Batch:
    event = events.message_event(
        channel="whatsapp",
        person=PERSON,
        message_id=f"wamid.IN{n}",
        type="text",
        text="¿Abren el domingo?",
        ts=1_764_500_000,
        received_ms=1_764_500_000_100,
        raw={"from": PERSON, "id": f"wamid.IN{n}", "type": "text"},
        name="Ana",
    )
    kept = {k: v for k, v in event.items() if k not in ("v", "kind", "person")}
    row = [PERSON, "w:1", "id", f"b{n}", "attempt", "0", "claimed_ms", "1764500001000"]
    row += ["due_ms", "1764500000900", "messages", orjson.dumps([kept]).decode()]
    return Batch.from_claim("t1", [x.encode() for x in row])


async def test_a_done_turn_leaves_no_reference_cycle() -> None:
    settings = Settings().with_overrides(redis_url="redis://127.0.0.1:1/0")
    store, leases = _Store(), Leases(settings)
    pause = AIPause(_NoPause(), Keys("wa"), settings, "w1")
    senders = {"whatsapp": as_sender(_Sender())}
    tools = TurnTools(settings, store, _Brain(), senders, leases, pause)
    loop = asyncio.get_running_loop()

    async def one_turn(n: int) -> None:
        batch = _claimed(n)
        leases.add(batch, loop.time())
        await Turn(batch, tools).run()
        leases.remove(batch)

    await one_turn(0)  # what a first turn sets up once (the pause's read, caches)
    gc.collect()
    gc.disable()
    try:
        for n in range(1, 4):
            await one_turn(n)
        left = gc.collect()
    finally:
        gc.enable()
    assert len(store.finished) == 4 and all(store.finished), "each turn ended done"
    assert left == 0, f"{left} objects of done turns waited for the cycle collector"
