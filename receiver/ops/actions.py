"""What a person can do from the ops page; each action done is one audit entry.

Every change goes through the code the CLIs and the worker use (worker/review.py's
ReviewList: one review_act.lua call per requeue or drop; bulk actions in
receiver/ops/bulk.py), so the invariants hold whoever acts. An
action that cannot be done raises `ActionError` with a message for the page and changes
nothing; only an action done is recorded (`shared/ops/audit.py`: who, when, what, whom).
"""

from __future__ import annotations

from typing import Any

from receiver.ops import queries
from shared.keys import Keys
from shared.ops import audit
from shared.ops.review import ReviewError, ReviewList
from shared.settings import Settings


class ActionError(Exception):
    """An action that was not done; the message says why (the page shows it, 409)."""


class Actions:
    def __init__(self, redis: Any, keys: Keys, review: ReviewList, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._review = review
        self._settings = settings

    async def requeue(self, who: str, tenant: str, item_id: str) -> dict[str, Any]:
        item = await queries.item(self._redis, self._keys, self._review, tenant, item_id)
        try:
            await self._review.requeue(tenant, item_id)
        except ReviewError as exc:
            raise ActionError(str(exc)) from None
        await self._record(who, "requeue", tenant, str(item.get("person", "")), item)
        return item

    async def drop(self, who: str, tenant: str, item_id: str) -> dict[str, Any]:
        item = await queries.item(self._redis, self._keys, self._review, tenant, item_id)
        try:
            await self._review.drop(tenant, item_id)
        except ReviewError as exc:
            raise ActionError(str(exc)) from None
        await self._record(who, "drop", tenant, str(item.get("person", "")), item)
        return item

    async def _record(
        self,
        who: str,
        action: str,
        tenant: str,
        person: str,
        item: dict[str, Any],
        detail: str = "",
    ) -> None:
        what = f"item {item.get('id')} ({item.get('reason')})"
        await audit.record(
            self._redis,
            self._keys,
            who=who,
            action=action,
            tenant=tenant,
            person=person,
            detail=f"{what}; {detail}" if detail else what,
            retention_s=self._settings.review_retention_s,
        )
