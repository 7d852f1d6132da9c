"""What a person can do from the ops page; each action done is one audit entry.

Every change goes through the code the CLIs and the worker use (worker/review.py's
ReviewList: the requeue script, HDEL for a drop), so the invariants hold whoever acts. An
action that cannot be done raises `ActionError` with a message for the page and changes
nothing; only an action done is recorded (`shared/ops/audit.py`: who, when, what, whom).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from receiver.ops import queries
from shared.keys import Keys
from shared.ops import audit
from shared.ops.review import ReviewError, ReviewList
from shared.settings import Settings


class ActionError(Exception):
    """An action that was not done; the message says why (the page shows it, 409)."""


@dataclass(frozen=True)
class BulkResult:
    requeued: int
    refused: list[str]  # "<tenant>/<item>: why" for each item left on the list


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

    async def bulk_requeue(self, who: str, reason: str, tenant: str = "") -> BulkResult:
        """Requeue every item of `reason` (of one tenant, or all): each is its own requeue,
        recorded on its own; those that cannot be requeued stay and are reported."""
        if not reason:
            raise ActionError("choose a reason to requeue in bulk")
        items = await queries.review_items(
            self._redis, self._keys, self._review, tenant=tenant, reason=reason
        )
        if not items:
            where = f" of tenant {tenant!r}" if tenant else ""
            raise ActionError(f"no review item with reason {reason!r}{where}")
        done, refused = 0, []
        for item in items:
            try:
                await self._review.requeue(item["tenant"], str(item["id"]))
            except ReviewError as exc:
                refused.append(f"{item['tenant']}/{item['id']}: {exc}")
                continue
            done += 1
            detail = f"bulk by reason {reason}"
            await self._record(who, "requeue", item["tenant"], str(item["person"]), item, detail)
        return BulkResult(done, refused)

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
