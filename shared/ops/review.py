"""The review list: the batches a worker must not answer on its own, and what a person does
with them (requeue, drop). The CLI (worker/review.py) and the ops page both use `ReviewList`.

Items live in the tenant's review hash (`HGETALL 'wa:{<tenant>}:review'`); see worker/review.py
for their shape and what requeue and drop do.
"""

from __future__ import annotations

from typing import Any

import orjson

from shared.conversation.review_journal import current_names
from shared.fleet import wake
from shared.keys import Keys
from shared.ops import takeover
from shared.storage.scripts import Scripts


class ReviewError(Exception):
    """An operation on the review list that cannot be done; the message says why."""


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
        item = await self.get(tenant, item_id)
        if not item.get("messages"):
            raise ReviewError(f"review item {item_id!r} has no messages to answer; drop it")
        k = self._keys.tenant(tenant)
        result = await self._scripts.requeue(
            self._redis,
            k,
            item_id=item_id,
            person=item["person"],
            messages=orjson.dumps(item["messages"]),
            # The reactions, edits, ... the parked batch had taken, for the fresh one.
            context=orjson.dumps(item["context"]) if item.get("context") else b"",
        )
        if int(result) == 0:
            raise ReviewError(f"review item {item_id!r} was removed meanwhile")
        if int(result) == -1:
            raise ReviewError(
                f"person {item['person']} has a batch in flight; requeue again once it ended"
            )
        # The batch is due now: relay it to a worker with a free slot rather than wait for
        # the safety sweep.
        await wake.add(self._redis, self._keys.relay_queue, [tenant])

    async def drop(self, tenant: str, item_id: str) -> None:
        item = await self.get(tenant, item_id)
        if not await self._redis.hdel(self._keys.tenant(tenant).review, item_id):
            raise ReviewError(f"no review item {item_id!r} for tenant {tenant!r}")
        # Most dropped items left no pause: a plain read spares them the script.
        person = item.get("person")
        if isinstance(person, str) and person and await self._paused(tenant, person):
            await takeover.resume(self._redis, self._keys, tenant, person, by="review drop")

    async def _paused(self, tenant: str, person: str) -> bool:
        try:
            human = self._keys.tenant(tenant).human(person)
        except ValueError:  # an id no key can hold: it was never paused
            return False
        return bool(await self._redis.exists(human))
