"""The fleet's figures for `/metrics`: read from Redis in chunks, summed, cached, rendered.

The same on every receiver (they come from Redis), so they carry no per-receiver label: a
Prometheus that scrapes several receivers gets the same series from each (dedupe them with
`max`, docs/operating.md#metrics). What they cost stays bounded with many tenants:

- **Read at most every `METRICS_FLEET_MAX_AGE_S`** per receiver, and concurrent scrapes share
  one read (`FleetFigures`: one computation in flight, the others await it; a scrape that
  goes away does not cancel it). The rendered text is cached with it. A scrape that has
  figures to serve waits at most `SCRAPE_WAIT_S` for the read; a longer read (20 000 tenants
  on a busy machine: a second or more) finishes for the next scrape, so a scrape stays short
  and the figures are at most one scrape interval plus one read old.
- **In chunks**: the tenant registry (`SMEMBERS`), then `READ_CHUNK` tenants per pipeline
  (LLEN inbox, ZCARD due, ZCARD running, HLEN review, HGETALL stats each: what costs Redis
  least, about 7 µs a tenant), the next chunk already at Redis while this one is summed, so
  the event loop is never held for more than one chunk and webhooks keep flowing. On one
  server the pipeline is packed and parsed by hiredis (`Replies`); on a cluster it is
  redis-py's cluster pipeline. (Tried and dropped: a Lua script per tenant answering
  integers in a fixed order, 50 µs of Redis a tenant; HMGET of the known fields, 13 µs.)
- **Few series** (receiver/metrics/families.py): fleet totals, always; per-tenant series only
  for the `METRICS_TENANTS_TOP_N` tenants with the most messages and the `METRICS_TENANTS`.

A Redis failure during a read yields `wa_fleet_scrape_ok 0` and no fleet series (cached like
a good read, so a Redis that is down is not asked again at every scrape).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import hiredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA

from receiver.metrics.families import (
    FleetSnapshot,
    TenantFigures,
    families,
    render,
)
from shared.fleet import heartbeats, stats_hash
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.redis_client import is_cluster

log = logging.getLogger(__name__)

READ_CHUNK = 200  # tenants per pipeline: 1000 commands
# How long a scrape waits for a read in progress when it has older figures to serve.
SCRAPE_WAIT_S = 0.5

# --- reading ---------------------------------------------------------------------------------


async def read_fleet(
    redis: Any,
    keys: Keys,
    timeout_s: float,
    top_n: int = 0,
    named: Iterable[str] = (),
    chunk: int = READ_CHUNK,
    raw: Replies | None = None,
) -> FleetSnapshot:
    """Every tenant's queue sizes and stats, summed; kept whole for the `top_n` tenants with
    the most messages and the `named` ones. Each Redis call is bounded by `timeout_s`. On one
    server the chunks go through `raw` (made here if not given: a caller that reads again
    should keep one, as it holds its connections)."""
    if raw is None and not is_cluster(redis):
        raw = Replies(redis)
    async with asyncio.timeout(timeout_s):
        tenants = sorted(_text(t) for t in await redis.smembers(keys.tenants))
    sums = _Sums(top_n, frozenset(named))
    parts = [tenants[i : i + chunk] for i in range(0, len(tenants), chunk)]

    async def fetch(part: list[str]) -> list[Any]:
        async with asyncio.timeout(timeout_s):
            return await _read_chunk(redis, raw, keys, part)

    pending = asyncio.ensure_future(fetch(parts[0])) if parts else None
    try:
        for i, part in enumerate(parts):
            assert pending is not None
            replies = await pending
            # The next chunk goes to Redis while this one is summed.
            pending = asyncio.ensure_future(fetch(parts[i + 1])) if i + 1 < len(parts) else None
            sums.add(part, replies)
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
    async with asyncio.timeout(timeout_s):
        workers = await heartbeats.read(redis, keys.workers)
    totals, per_tenant = sums.result()
    return FleetSnapshot(len(tenants), totals, per_tenant, workers)


PER_TENANT = 5  # LLEN inbox, ZCARD due, ZCARD running, HLEN review, HGETALL stats


async def _read_chunk(redis: Any, raw: Replies | None, keys: Keys, part: list[str]) -> list[Any]:
    """The PER_TENANT answers of each tenant of `part`, pipelined, in order."""
    if raw is not None:
        commands: list[tuple[Any, ...]] = []
        for tenant in part:
            k = keys.tenant(tenant)
            commands += [
                ("LLEN", k.inbox),
                ("ZCARD", k.due),
                ("ZCARD", k.running),
                ("HLEN", k.review),
                ("HGETALL", k.stats),
            ]
        return await raw.exchange(commands)
    pipe = redis.pipeline(transaction=False)
    for tenant in part:
        k = keys.tenant(tenant)
        pipe.llen(k.inbox)
        pipe.zcard(k.due)
        pipe.zcard(k.running)
        pipe.hlen(k.review)
        pipe.hgetall(k.stats)
    return list(await pipe.execute())


class Replies:
    """Batches of commands on connections held from a single-server client's pool, their
    replies parsed by hiredis straight from the socket's buffer.

    Like shared/storage/raw_pipeline.py (hiredis packs the batch, the connection stays checked out),
    but without redis-py's reply-by-reply call. A failure disconnects the connection, so it
    never carries stale replies; an error reply is raised.
    """

    def __init__(self, redis: Any) -> None:
        self._pool = redis.connection_pool
        self._idle: list[Any] = []

    async def exchange(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        payload = b"".join([hiredis.pack_command(command) for command in commands])
        connection = self._idle.pop() if self._idle else await self._pool.get_connection()
        try:
            await connection.send_packed_command(payload, check_health=False)
            replies = await _read_replies(connection, len(commands))
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        finally:
            self._idle.append(connection)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies


async def _read_replies(connection: Any, count: int) -> list[Any]:
    parser = connection._parser  # redis-py's hiredis parser: its reader and socket
    reader = getattr(parser, "_reader", None)
    if not isinstance(reader, hiredis.Reader):
        return [await connection.read_response() for _ in range(count)]
    replies: list[Any] = []
    while len(replies) < count:
        reply = reader.gets()
        if reply is NOT_ENOUGH_DATA or reply is False:  # not all of it in the buffer yet
            await parser.read_from_socket()
        else:
            replies.append(reply)
    return replies


class _Sums:
    """The fleet totals, and the busiest tenants' figures, summed chunk by chunk."""

    def __init__(self, top_n: int, named: frozenset[str]) -> None:
        self.top_n = top_n
        self.named = named
        self.gauges = [0, 0, 0, 0]
        self.stats: dict[bytes, int] = {}
        self.busiest: list[tuple[int, str, TenantFigures]] = []  # a min-heap of top_n
        self.kept: dict[str, TenantFigures] = {}

    def add(self, part: Sequence[str], replies: Sequence[Any]) -> None:
        gauges, totals = self.gauges, self.stats
        for i, tenant in enumerate(part):
            inbox, due, running, review, stats = replies[i * PER_TENANT : (i + 1) * PER_TENANT]
            gauges[0] += inbox
            gauges[1] += due
            gauges[2] += running
            gauges[3] += review
            messages = 0
            for name, value in _pairs(stats):
                try:
                    n = int(value)
                except ValueError:
                    continue
                totals[name] = totals.get(name, 0) + n
                if name == _MESSAGES:
                    messages = n
            keep = tenant in self.named
            busy = self.top_n > 0 and (
                len(self.busiest) < self.top_n or (messages, tenant) > self.busiest[0][:2]
            )
            if not (keep or busy):
                continue
            figures = TenantFigures(
                int(inbox), int(due), int(running), int(review), _ints(_pairs(stats))
            )
            if keep:
                self.kept[tenant] = figures
            if busy:
                entry = (messages, tenant, figures)
                if len(self.busiest) < self.top_n:
                    heapq.heappush(self.busiest, entry)
                else:
                    heapq.heapreplace(self.busiest, entry)

    def result(self) -> tuple[TenantFigures, dict[str, TenantFigures]]:
        inbox, due, running, review = self.gauges
        totals = TenantFigures(inbox, due, running, review, _ints(self.stats.items()))
        per_tenant = {tenant: figures for _, tenant, figures in self.busiest}
        per_tenant.update(self.kept)
        return totals, dict(sorted(per_tenant.items()))


_MESSAGES = b"messages"


def _pairs(stats: Any) -> Iterable[tuple[bytes, bytes]]:
    """HGETALL's answer as (field, value) pairs: a flat list (hiredis) or a dict (redis-py)."""
    if isinstance(stats, dict):
        return stats.items()
    it = iter(stats)
    return zip(it, it, strict=True)


def _ints(pairs: Iterable[tuple[bytes | str, Any]]) -> dict[str, int]:
    return stats_hash.counters(pairs)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- the cache ------------------------------------------------------------------------------


class FleetFigures:
    """The fleet part of `/metrics`, read at most every `METRICS_FLEET_MAX_AGE_S` and shared
    by concurrent scrapes."""

    def __init__(self, settings: Settings, keys: Keys) -> None:
        self._settings = settings
        self._keys = keys
        self._text: bytes | None = None
        self._read_at = 0.0  # loop time
        self._reading: asyncio.Task[bytes] | None = None
        self._raw: tuple[Any, Replies] | None = None  # (client, its reader)

    def age_s(self) -> float | None:
        """How old the cached figures are (None before the first read)."""
        if self._text is None:
            return None
        return asyncio.get_running_loop().time() - self._read_at

    async def text(self, redis: Any) -> bytes:
        """The exposition text of the fleet figures: the cached one if recent enough, else
        the one being read now (started here if no other scrape started it)."""
        age = self.age_s()
        if (
            self._text is not None
            and age is not None
            and age < self._settings.metrics_fleet_max_age_s
        ):
            return self._text
        if self._reading is None:
            self._reading = asyncio.create_task(self._read(redis), name="fleet-metrics")
        # Shielded: a scrape that goes away must not cancel the read the others await.
        reading = asyncio.shield(self._reading)
        if self._text is None:
            return await reading
        try:
            # Figures exist: wait a little for fresh ones, else serve those (the read goes on,
            # for the next scrape; wa_fleet_figures_age_seconds says how old they are).
            return await asyncio.wait_for(reading, SCRAPE_WAIT_S)
        except TimeoutError:
            return self._text

    def _raw_pipeline(self, redis: Any) -> Replies | None:
        """One reader per client: it keeps the connections it took from the pool."""
        if is_cluster(redis):
            return None
        if self._raw is None or self._raw[0] is not redis:
            self._raw = (redis, Replies(redis))
        return self._raw[1]

    async def _read(self, redis: Any) -> bytes:
        s = self._settings
        try:
            if redis is None:
                raise RuntimeError("no Redis client (outside the lifespan)")
            snapshot = await read_fleet(
                redis,
                self._keys,
                s.redis_timeout_s,
                s.metrics_tenants_top_n,
                s.metrics_tenants,
                raw=self._raw_pipeline(redis),
            )
            text = await render(families(snapshot))
        except Exception as exc:
            log.info("fleet metrics not read from Redis: %r", exc)
            text = await render(families(None))
        finally:
            self._reading = None
        self._text, self._read_at = text, asyncio.get_running_loop().time()
        return text
