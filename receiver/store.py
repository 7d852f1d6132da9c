"""Writes one webhook's items to Redis in one group-committed round trip.

Per request, queued in this order on the shared pipeline round:

1. `SADD tenants <tenant…>`: the registry workers scan, before any item can be seen;
2. one `ingest` script call per tenant: each item's dedupe marker and its LPUSH, atomically;
3. `LPUSH deadletter <body>` when the body (or part of it) could not be understood;
4. `PUBLISH wake <tenant>` per tenant, so idle workers look at once.

The caller learns the outcome only after Redis answered all of them; any error, or no answer
within the timeout, raises `StoreUnavailable` (the webhook answers 503 and the provider retries,
which the dedupe markers make safe).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from typing import Any

from receiver.whatsapp import Item
from shared.group_commit import GroupCommitter
from shared.keys import Keys
from shared.scripts import Script


class StoreUnavailable(Exception):
    """Redis failed or did not confirm in time: nothing may be acknowledged."""


@dataclass(frozen=True, slots=True)
class Saved:
    """What the ingest script answered for one request: new items and duplicates."""

    stored: int
    duplicates: int


class InboxWriter:
    """Stores parsed events (and dead-letter bodies) through a `GroupCommitter`."""

    def __init__(
        self,
        keys: Keys,
        committer: GroupCommitter,
        ingest: Script,
        dedupe_ttl_s: int,
        timeout_s: float,
    ) -> None:
        self._keys = keys
        self._committer = committer
        self._ingest = ingest
        self._dedupe_ttl_s = dedupe_ttl_s
        self._timeout_s = timeout_s

    async def save(self, items: dict[str, list[Item]], deadletter: bytes | None = None) -> Saved:
        """Store every item (grouped by tenant) and the optional dead-letter body."""
        submit = self._committer.submit
        keys = self._keys
        required: list[asyncio.Future[Any]] = []
        if items:
            required.append(submit(partial(_sadd, keys.tenants, tuple(items))))
        ingests = [submit(self._ingest_call(tenant, batch)) for tenant, batch in items.items()]
        if deadletter is not None:
            required.append(submit(partial(_lpush, keys.deadletter, deadletter)))
        required.extend(submit(partial(_publish, keys.wake_channel, t)) for t in items)
        try:
            async with asyncio.timeout(self._timeout_s):
                results = [await future for future in ingests]
                for future in required:
                    await future
        except TimeoutError as exc:
            _settle(ingests, required)
            raise StoreUnavailable(f"Redis did not confirm within {self._timeout_s}s") from exc
        except Exception as exc:
            _settle(ingests, required)
            raise StoreUnavailable(f"Redis error: {exc!r}") from exc
        stored = sum(sum(r) for r in results)
        return Saved(stored, sum(len(batch) for batch in items.values()) - stored)

    def _ingest_call(self, tenant: str, batch: list[Item]) -> Any:
        tenant_keys = self._keys.tenant(tenant)
        script_keys = [tenant_keys.inbox]
        script_args: list[bytes | int] = [self._dedupe_ttl_s]
        for item_id, data in batch:
            script_keys.append(tenant_keys.seen(item_id))
            script_args.append(data)
        return partial(self._ingest.queue, keys=script_keys, args=script_args)


def _settle(*groups: list[asyncio.Future[Any]]) -> None:
    """After a failure: withdraw what is still queued, and mark the other errors as seen."""
    for futures in groups:
        for future in futures:
            if not future.done():
                future.cancel()  # the committer skips cancelled calls
            elif not future.cancelled():
                future.exception()


def _sadd(key: str, members: tuple[str, ...], pipe: Any) -> None:
    pipe.sadd(key, *members)


def _lpush(key: str, value: bytes, pipe: Any) -> None:
    pipe.lpush(key, value)


def _publish(channel: str, message: str, pipe: Any) -> None:
    pipe.publish(channel, message)
