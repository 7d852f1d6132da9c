"""The dedupe markers of a tenant, for tools and tests: whether items are marked, how many
markers the tenant holds.

Markers live in the tenant's book (`TenantKeys.seen_book`, shared/lua/lib/book.lua and
lib/dedupe.lua): integers in small sets, one per stored provider item, never a key each.
"""

from __future__ import annotations

from typing import Any

from shared.keys import TenantKeys
from shared.storage.scripts import Scripts, shared_scripts

SCAN_COUNT = 1000


async def marked(
    redis: Any, k: TenantKeys, dedupe_ids: list[str], scripts: Scripts | None = None
) -> list[bool]:
    """Whether each item (by `shared.events.dedupe_id`) has a marker: a new delivery of it
    would be a duplicate."""
    if not dedupe_ids:
        return []
    script = (scripts or shared_scripts()).dedupe_marked
    found = await script(redis, k, seen=[k.seen(i) for i in dedupe_ids])
    return [bool(int(x)) for x in found]


async def count(redis: Any, k: TenantKeys) -> int:
    """How many markers the tenant's book holds (SCAN and SCARD: for tools and tests)."""
    total = 0
    gens = k.seen_gens
    async for key in redis.scan_iter(match=k.seen_book_pattern, count=SCAN_COUNT):
        name = key.decode() if isinstance(key, bytes) else key
        if name != gens:
            total += int(await redis.scard(key))
    return total
