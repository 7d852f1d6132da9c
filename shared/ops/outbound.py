"""The outbound records of sent reply parts: read by provider id (the ops page, the tools), and
deleted by person (forget).

A record is a field of a small hash in the tenant's book (`TenantKeys.outbound_book`,
shared/lua/lib/book.lua): field = the first 16 hex digits of the SHA-1 of the provider id, value
`<status code>|<sent_ms>|<part>|<error>|<person>|<batch>` (shared/lua/lib/outbound.lua writes
and moves them). Reading by id goes through `outbound_get.lua`, which finds the book's
generation as the statuses do; the hashes of the release before (`out:<wamid>`: batch, person,
part, status, sent_ms, error) are read and deleted too until they expire.
"""

from __future__ import annotations

from typing import Any

from shared.keys import TenantKeys
from shared.storage.scripts import Scripts, shared_scripts

# What a record holds, in the order outbound_get.lua answers.
FIELDS = ("status", "sent_ms", "part", "error", "person", "batch")
SCAN_COUNT = 1000  # keys or fields looked at per SCAN round trip


async def records(
    redis: Any, k: TenantKeys, provider_ids: list[str], scripts: Scripts | None = None
) -> list[dict[str, str]]:
    """The record of each id (`FIELDS` as keys), `{}` for an id with none (never sent, or
    expired), in the order given."""
    if not provider_ids:
        return []
    script = (scripts or shared_scripts()).outbound_get
    found = await script(redis, k, ids=provider_ids)
    return [dict(zip(FIELDS, (_text(v) for v in row), strict=True)) if row else {} for row in found]


def person_of(value: bytes | str) -> str:
    """The person of a record's value in the book ("" when it is not one)."""
    parts = _text(value).split("|", 5)
    return parts[4] if len(parts) == 6 else ""


async def forget(redis: Any, k: TenantKeys, person: str) -> int:
    """Delete every outbound record of `person`; how many. A `SCAN` of the whole keyspace for
    the tenant's book and for the keys of the release before."""
    return await _forget_in_book(redis, k, person) + await _forget_keys(redis, k, person)


async def _forget_in_book(redis: Any, k: TenantKeys, person: str) -> int:
    deleted = 0
    async for key in redis.scan_iter(match=k.outbound_book_pattern, count=SCAN_COUNT):
        if _text(key) == k.outbound_gens:
            continue
        fields = await redis.hgetall(key)
        mine = [f for f, value in fields.items() if person_of(value) == person]
        if mine:
            deleted += int(await redis.hdel(key, *mine))
    return deleted


async def _forget_keys(redis: Any, k: TenantKeys, person: str) -> int:
    """The records of the release before (`out:<wamid>`, a hash each): HGET person, DEL."""
    deleted = 0
    chunk: list[Any] = []

    async def flush() -> int:
        pipe = redis.pipeline(transaction=False)
        for key in chunk:
            pipe.hget(key, "person")
        owners = await pipe.execute()
        mine = [key for key, owner in zip(chunk, owners, strict=True) if _text(owner) == person]
        chunk.clear()
        return int(await redis.delete(*mine)) if mine else 0

    async for key in redis.scan_iter(match=k.outbound_pattern, count=SCAN_COUNT):
        chunk.append(key)
        if len(chunk) >= SCAN_COUNT:
            deleted += await flush()
    if chunk:
        deleted += await flush()
    return deleted


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)
