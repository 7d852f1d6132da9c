"""The review list: the batches a worker must not answer on its own, and what a person does
with them (requeue, drop). The CLI (worker/review.py) and the ops page both use `ReviewList`.

Items live in the tenant's review hash (`HGETALL 'wa:{<tenant>}:review'`); see worker/review.py
for their shape and what requeue and drop do. Every change goes through one script
(review_act.lua), which keeps the list's index (shared/ops/review_index.py) in step and lifts
only a pause the review itself set, never one a person set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from shared.conversation.review_journal import current_names
from shared.fleet import wake
from shared.keys import Keys
from shared.storage.scripts import Scripts

# review_act.lua's answer per item.
GONE, IN_FLIGHT, DONE, DONE_DUE = 0, -1, 1, 2
ACTIONS = ("requeue", "drop")


class ReviewError(Exception):
    """An operation on the review list that cannot be done; the message says why."""


@dataclass(frozen=True)
class Outcome:
    """What became of one item of an action: done, or why it was left on the list."""

    item: dict[str, Any]
    done: bool
    why: str = ""


def refusal(action: str, item: dict[str, Any]) -> str | None:
    """Why `action` cannot be done to `item` whatever Redis holds, else None."""
    if action == "requeue" and not item.get("messages"):
        return f"review item {item.get('id')!r} has no messages to answer; drop it"
    return None


class ReviewList:
    def __init__(self, redis: Any, keys: Keys, scripts: Scripts) -> None:
        self._redis = redis
        self._keys = keys
        self._scripts = scripts

    async def items(self, tenant: str, reason: str | None = None) -> list[dict[str, Any]]:
        raw = await self._redis.hgetall(self._keys.tenant(tenant).review)
        items = [current_names(orjson.loads(v)) for v in raw.values()]
        if reason:
            items = [i for i in items if i.get("reason") == reason]
        return sorted(items, key=lambda i: (i.get("reviewed_ms", 0), i.get("id", "")))

    async def get(self, tenant: str, item_id: str) -> dict[str, Any]:
        raw = await self._redis.hget(self._keys.tenant(tenant).review, item_id)
        if raw is None:
            raise ReviewError(f"no review item {item_id!r} for tenant {tenant!r}")
        return current_names(orjson.loads(raw))

    async def requeue(self, tenant: str, item_id: str) -> None:
        await self._one("requeue", tenant, item_id)

    async def drop(self, tenant: str, item_id: str) -> None:
        await self._one("drop", tenant, item_id)

    async def _one(self, action: str, tenant: str, item_id: str) -> None:
        item = await self.get(tenant, item_id)
        (outcome,) = await self.act(action, tenant, [item])
        if not outcome.done:
            raise ReviewError(outcome.why)

    async def act(self, action: str, tenant: str, items: Sequence[dict[str, Any]]) -> list[Outcome]:
        """Requeue or drop `items` (as read, with `id` and `person`) of `tenant` in one script
        call; what became of each. Keep a call's items to a few hundred: Redis does nothing
        else meanwhile."""
        if action not in ACTIONS:
            raise ReviewError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        outcomes: list[Outcome | None] = []
        sent: list[tuple[str, str, bytes, bytes]] = []
        for item in items:
            why = refusal(action, item)
            outcomes.append(Outcome(item, False, why) if why else None)
            if why is None:
                sent.append(_script_item(action, item))
        codes = (
            await self._scripts.review_act(
                self._redis, self._keys.tenant(tenant), action=action, items=sent
            )
            if sent
            else []
        )
        found = iter(int(c) for c in codes)
        result = [
            o if o is not None else _outcome(action, i, next(found))
            for o, i in zip(outcomes, items, strict=True)
        ]
        # A requeued batch is due now, as are messages a lifted pause held: relay the tenant to
        # a worker with a free slot rather than wait for the safety sweep.
        due = DONE_DUE if action == "drop" else DONE
        if any(int(c) == due for c in codes):
            await wake.add(self._redis, self._keys.relay_queue, [tenant])
        return result


def _script_item(action: str, item: dict[str, Any]) -> tuple[str, str, bytes, bytes]:
    person = item.get("person")
    person = person if isinstance(person, str) else ""
    if action == "drop":
        return str(item["id"]), person, b"", b""
    return (
        str(item["id"]),
        person,
        orjson.dumps(item["messages"]),
        # The reactions, edits, ... the parked batch had taken, for the fresh one.
        orjson.dumps(item["context"]) if item.get("context") else b"",
    )


def _outcome(action: str, item: dict[str, Any], code: int) -> Outcome:
    if code in (DONE, DONE_DUE):
        return Outcome(item, True)
    if code == IN_FLIGHT:
        why = f"person {item.get('person')} has a batch in flight; requeue again once it ended"
        return Outcome(item, False, why)
    return Outcome(item, False, f"review item {item.get('id')!r} was removed meanwhile")
