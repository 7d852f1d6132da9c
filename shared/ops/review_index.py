"""Reading the review list one page at a time: the index the scripts keep with the items.

Every script that adds or removes a review item keeps, in the same call (shared/lua/lib/
review.lua), the tenant's time index (`review_ix`: members "<ms, 16 digits>:<id>", score 0),
one such index per reason, the id -> entry map, and the count per reason. So a page is a BYLEX
range of the index (O(log n + page)), a count is one hash or a ZLEXCOUNT, whatever the number
of items; nothing reads the whole list.

Fleet-wide views merge the tenants' indexes: a fleet-wide index could not be kept in the same
script as a tenant's items under Redis Cluster (another slot), and a tenant's page costs the
same at 200 or 200 000 items. A page is addressed by a cursor, the (member, tenant) of an item:
the items after it (newer) or before it (older), in (time, tenant, id) order.

Items parked by the previous release (which kept no index) are indexed by a bounded backfill
(`fill`, review_index_fill.lua) that any view starts when a tenant has more items than index
entries; an index entry whose item the previous release deleted is dropped when a page finds it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from shared.conversation.review_journal import current_names
from shared.keys import Keys, TenantKeys
from shared.storage.scripts import Scripts

FILL_STEP = 500  # items one backfill call scans (one short script call)
FILL_BUDGET_S = 2.0  # how long one view spends filling before it shows what is indexed
MS_DIGITS = 16


def at(ms: int) -> str:
    """The time part of an index member: sorts as time does."""
    return f"{max(0, int(ms)):0{MS_DIGITS}d}"


def ms_of(member: str) -> int:
    return int(member[:MS_DIGITS])


def id_of(member: str) -> str:
    return member[MS_DIGITS + 1 :]


@dataclass(frozen=True, order=True)
class Cursor:
    """An item's place in the fleet-wide order: (member, tenant)."""

    member: str
    tenant: str

    def encode(self) -> str:
        return base64.urlsafe_b64encode(orjson.dumps([self.member, self.tenant])).decode()

    @classmethod
    def decode(cls, text: str) -> Cursor | None:
        """The cursor, or None for one that is not ours (the first page is shown)."""
        try:
            member, tenant = orjson.loads(base64.urlsafe_b64decode(text.encode()))
        except (ValueError, binascii.Error, TypeError, orjson.JSONDecodeError):
            return None
        if not (isinstance(member, str) and isinstance(tenant, str)) or len(member) <= MS_DIGITS:
            return None
        return cls(member, tenant)


@dataclass
class Page:
    items: list[dict[str, Any]]  # oldest first, each with its `tenant`
    position: int  # how many matching items come before the first one shown
    matched: int  # how many items match in all

    @property
    def first(self) -> Cursor | None:
        return _cursor(self.items[0]) if self.items else None

    @property
    def last(self) -> Cursor | None:
        return _cursor(self.items[-1]) if self.items else None

    @property
    def has_older(self) -> bool:
        return self.position > 0

    @property
    def has_newer(self) -> bool:
        return self.position + len(self.items) < self.matched


def _cursor(item: dict[str, Any]) -> Cursor:
    return Cursor(item["_member"], item["tenant"])


def index_key(k: TenantKeys, reason: str) -> str:
    return k.review_ix_reason(reason) if reason else k.review_ix


def upper(max_ms: int | None) -> str:
    """The BYLEX bound of items parked at or before `max_ms` (None: all)."""
    return "+" if max_ms is None else f"({at(max_ms + 1)}"


@dataclass
class State:
    """What a view starts from (`ReviewIndex.state`)."""

    now_ms: int  # Redis's clock
    counts: dict[str, dict[str, int]]  # tenant -> reason -> items
    behind: list[str]  # tenants with items not indexed yet (the previous release's)


class ReviewIndex:
    def __init__(self, redis: Any, keys: Keys, scripts: Scripts) -> None:
        self._redis = redis
        self._keys = keys
        self._scripts = scripts

    async def state(self, tenants: Sequence[str]) -> State:
        """Redis's clock, the kept counts of `tenants`, and which of them are not fully
        indexed: two round trips."""
        # TIME apart: a cluster pipeline takes only commands with a key.
        seconds, micros = await self._redis.time()
        pipe = self._redis.pipeline(transaction=False)
        for t in tenants:
            k = self._keys.tenant(t)
            pipe.hlen(k.review)
            pipe.hlen(k.review_ix_of)
            pipe.hgetall(k.review_counts)
        found = await pipe.execute() if tenants else []
        counts, behind = {}, []
        for i, t in enumerate(tenants):
            items, indexed, raw = found[3 * i : 3 * i + 3]
            counts[t] = {_text(r): int(n) for r, n in raw.items() if int(n) > 0}
            if int(items) > int(indexed):
                behind.append(t)
        return State(int(seconds) * 1000 + int(micros) // 1000, counts, behind)

    # --- keeping it complete -----------------------------------------------------------------
    async def fill(self, tenants: Sequence[str], budget_s: float = FILL_BUDGET_S) -> list[str]:
        """Index the items of `tenants` parked by the previous release, in bounded steps, for
        at most `budget_s`; the tenants still not fully indexed (a later view goes on)."""
        behind = (await self.state(tenants)).behind if tenants else []
        return await self.fill_behind(behind, budget_s)

    async def fill_behind(
        self, behind: Sequence[str], budget_s: float = FILL_BUDGET_S
    ) -> list[str]:
        """`fill` for tenants already known to be behind."""
        deadline = time.monotonic() + budget_s
        left = []
        for t in behind:
            k = self._keys.tenant(t)
            while True:
                cursor, _ = await self._scripts.review_index_fill(self._redis, k, count=FILL_STEP)
                if cursor in (b"0", "0", 0):
                    break
                if time.monotonic() > deadline:
                    left.append(t)
                    break
                await asyncio.sleep(0)
        return left

    # --- counts --------------------------------------------------------------------------------
    async def counts(
        self, tenants: Sequence[str], max_ms: int | None = None
    ) -> dict[str, dict[str, int]]:
        """Tenant -> reason -> how many items (parked at or before `max_ms` when given)."""
        counts = (await self.state(tenants)).counts if tenants else {}
        return await self.aged(counts, max_ms)

    async def aged(
        self, counts: dict[str, dict[str, int]], max_ms: int | None
    ) -> dict[str, dict[str, int]]:
        """`counts` narrowed to the items parked at or before `max_ms` (None: as they are)."""
        if max_ms is None:
            return counts
        tenants = list(counts)
        pipe = self._redis.pipeline(transaction=False)
        asked = [(t, r) for t, by_reason in counts.items() for r in by_reason]
        bound = upper(max_ms)
        for t, r in asked:
            pipe.zlexcount(self._keys.tenant(t).review_ix_reason(r), "-", bound)
        aged: dict[str, dict[str, int]] = {t: {} for t in tenants}
        for (t, r), n in zip(asked, await pipe.execute() if asked else [], strict=True):
            if int(n):
                aged[t][r] = int(n)
        return aged

    # --- one page ------------------------------------------------------------------------------
    async def page(
        self,
        tenants: Sequence[str],
        *,
        reason: str = "",
        max_ms: int | None = None,
        after: Cursor | None = None,
        before: Cursor | None = None,
        size: int = 50,
    ) -> Page:
        """`size` items matching `reason` and `max_ms` of `tenants`, oldest first: the first
        ones, those right after `after`, or those right before `before`."""
        tenants = sorted(tenants)
        top = upper(max_ms)
        pipe = self._redis.pipeline(transaction=False)
        for t in tenants:
            key = index_key(self._keys.tenant(t), reason)
            if before is not None:
                hi = _min_bound(top, ("[" if t < before.tenant else "(") + before.member)
                pipe.zrevrangebylex(key, hi, "-", 0, size)
            else:
                lo = "-" if after is None else ("[" if t > after.tenant else "(") + after.member
                pipe.zrangebylex(key, lo, top, 0, size)
            pipe.zlexcount(key, "-", top)
        found = await pipe.execute() if tenants else []
        matched = sum(int(n) for n in found[1::2])
        rows = [
            Cursor(_text(m), t)
            for t, members in zip(tenants, found[0::2], strict=True)
            for m in members
        ]
        rows = sorted(rows, reverse=before is not None)[:size]
        rows.sort()
        # The first page needs no position: nothing comes before it.
        first = rows[0] if rows and (after is not None or before is not None) else None
        items, position = await self._items(rows, tenants if first else (), reason, first)
        if not rows and after is not None:
            position = matched
        return Page(items, position, matched)

    async def _items(
        self,
        rows: list[Cursor],
        tenants: Sequence[str] = (),
        reason: str = "",
        first: Cursor | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """The items of `rows` (HMGET per tenant), and, with `first`, how many items of
        `tenants` come before it (in the same round trip)."""
        by_tenant: dict[str, list[str]] = {}
        for row in rows:
            by_tenant.setdefault(row.tenant, []).append(id_of(row.member))
        pipe = self._redis.pipeline(transaction=False)
        for t, ids in by_tenant.items():
            pipe.hmget(self._keys.tenant(t).review, ids)
        if first is not None:
            for t in tenants:
                bound = ("[" if t < first.tenant else "(") + first.member
                pipe.zlexcount(index_key(self._keys.tenant(t), reason), "-", bound)
        found = await pipe.execute() if len(pipe) else []
        raw_of = {
            (t, item_id): raw
            for (t, ids), values in zip(by_tenant.items(), found, strict=False)
            for item_id, raw in zip(ids, values, strict=True)
        }
        position = sum(int(n) for n in found[len(by_tenant) :])
        items, stale = [], []
        for row in rows:
            raw = raw_of.get((row.tenant, id_of(row.member)))
            if raw is None:  # deleted by the previous release, which kept no index
                stale.append(row)
                continue
            item = current_names(orjson.loads(raw))
            items.append({**item, "tenant": row.tenant, "_member": row.member})
        for row in stale:
            await self._scripts.review_remove(
                self._redis, self._keys.tenant(row.tenant), item_ids=[id_of(row.member)]
            )
        return items, position

    async def chunk(
        self, tenant: str, reason: str, max_ms: int | None, after: str | None, size: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Up to `size` items of one tenant after index member `after` (None: from the first),
        for a bulk action, each with its `tenant` and `_member`; and the last member read (None
        when there was none: the tenant is done)."""
        k = self._keys.tenant(tenant)
        lo = "-" if after is None else f"({after}"
        members = await self._redis.zrangebylex(index_key(k, reason), lo, upper(max_ms), 0, size)
        rows = [Cursor(_text(m), tenant) for m in members]
        items, _ = await self._items(rows)
        return items, rows[-1].member if rows else None


def _min_bound(a: str, b: str) -> str:
    """The lower of two BYLEX upper bounds ("+", "[x", "(x")."""
    if a == "+":
        return b
    if b == "+":
        return a
    if a[1:] != b[1:]:
        return a if a[1:] < b[1:] else b
    return a if a[0] == "(" else b


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
