"""Retention: review items older than `REVIEW_RETENTION_S` are deleted by the fleet's sweeper.

The review hash is for people to empty (docs/operating.md#review-list); what nobody handled
within the retention is deleted, so a tenant's review list cannot grow forever. The audit log
trims itself whenever an entry is added (shared/ops/audit.py).

The cost stays bounded with many tenants: the worker that holds the sweep guard (one per
`POLL_INTERVAL_S` for the fleet, worker/fleet/sweep.py) looks at a slice of the registry, not all
of it. Each tenant has a fixed moment in a round of `round_s` (a tenth of the retention, at
most an hour), taken from a hash of its id; a sweep at time t visits the tenants whose moment
passed within the last two intervals. With N tenants a sweep visits about
N x 2 x POLL_INTERVAL_S / round_s of them (20 000 tenants, 1 s, an hour: about 11), every
tenant is visited about twice a round whichever worker sweeps, and a sweep that is late or
missed (its sweeper died) leaves a tenant at most one round more. A visit: one pipelined
`HLEN` for the slice, then for each tenant with items an `HSCAN` of its review hash and one
review_remove.lua call per 500 old items (the items go with their index entries). An item's
age is its `reviewed_ms` (else the creation time its batch id starts with); an item with
neither is kept.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import zlib
from collections.abc import Iterable
from typing import Any

import orjson
from redis.exceptions import RedisError

from shared.keys import Keys, TenantKeys
from shared.storage.scripts import shared_scripts

log = logging.getLogger(__name__)

MAX_ROUND_S = 3600.0
SCAN_COUNT = 500
_LEADING_MS = re.compile(rb"(\d{12,})")  # batch ids start with their creation ms


def round_s(retention_s: float) -> float:
    """How long it takes to visit every tenant once: a tenth of the retention, at most an
    hour, so an item outlives the retention by at most about a tenth of it."""
    return min(MAX_ROUND_S, retention_s / 10)


def visiting(tenant: str, now_s: float, round_s: float, window_s: float) -> bool:
    """True if `tenant`'s moment in the round passed within the last `window_s`."""
    if window_s >= round_s:
        return True
    moment = zlib.crc32(tenant.encode()) / 2**32 * round_s
    return (now_s - moment) % round_s < window_s


def reviewed_ms(item_id: bytes, raw: bytes) -> int | None:
    """When the item went to review, or None if it does not say."""
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        item = None
    at = item.get("reviewed_ms") if isinstance(item, dict) else None
    if isinstance(at, int | float) and not isinstance(at, bool):
        return int(at)
    found = _LEADING_MS.match(item_id)
    return int(found.group(1)) if found else None


class ReviewRetention:
    """Deletes old review items of a slice of the tenants on each sweep of the fleet."""

    def __init__(
        self, redis: Any, keys: Keys, retention_s: float, interval_s: float, timeout_s: float
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._retention_ms = int(retention_s * 1000)
        self._round_s = round_s(retention_s)
        self._window_s = 2 * interval_s
        self._timeout_s = timeout_s

    def slice(self, tenants: Iterable[str], now_s: float) -> list[str]:
        """The tenants this sweep visits."""
        return sorted(t for t in tenants if visiting(t, now_s, self._round_s, self._window_s))

    async def prune(self, tenants: Iterable[str], now_s: float | None = None) -> int:
        """Delete the old review items of this sweep's slice; returns how many. A Redis
        failure is logged, not raised: retention waits for a later round, the sweep goes on."""
        now_s = time.time() if now_s is None else now_s
        try:
            return await self._prune(self.slice(tenants, now_s), int(now_s * 1000))
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("review retention skipped this sweep: %s", exc)
            return 0

    async def _prune(self, tenants: list[str], now_ms: int) -> int:
        if not tenants:
            return 0
        reviews = [self._keys.tenant(t) for t in tenants]
        pipe = self._redis.pipeline(transaction=False)
        for k in reviews:
            pipe.hlen(k.review)
        async with asyncio.timeout(self._timeout_s):
            sizes = await pipe.execute()
        deleted = 0
        for k, size in zip(reviews, sizes, strict=True):
            if int(size):
                deleted += await self._prune_hash(k, now_ms - self._retention_ms)
        if deleted:
            log.info("review retention deleted %d items older than the retention", deleted)
        return deleted

    async def _prune_hash(self, k: TenantKeys, cutoff_ms: int) -> int:
        old: list[bytes] = []
        cursor = 0
        while True:
            async with asyncio.timeout(self._timeout_s):
                cursor, found = await self._redis.hscan(k.review, cursor, count=SCAN_COUNT)
            for item_id, raw in found.items():
                at = reviewed_ms(item_id, raw)
                if at is not None and at < cutoff_ms:
                    old.append(item_id)
            if int(cursor) == 0:
                break
        deleted = 0
        # With their index entries (review_remove.lua), a bounded chunk per call.
        for start in range(0, len(old), SCAN_COUNT):
            async with asyncio.timeout(self._timeout_s):
                deleted += int(
                    await shared_scripts().review_remove(
                        self._redis, k, item_ids=old[start : start + SCAN_COUNT]
                    )
                )
        return deleted
