"""Writes webhook items to Redis, many concurrent requests per round trip (group commit).

Requests in flight together join one *round*. Their items are merged per tenant, so a round
sends, in one pipeline and in this order:

1. `SADD tenants <tenant…>` for tenants this process has not registered in the last minute:
   the registry workers scan, written before any of the tenant's items can be seen;
2. one `ingest` script call per tenant (chunks of `max_items_per_call`) holding the items of
   every request of the round: each item's dedupe marker and its LPUSH, atomically;
3. one `deadletter` script call for bodies (or parts) that could not be understood: it
   pushes them and trims the list to its bounds in the same step (`DeadLetterBounds`);
4. one `ZADD wake NX <tenant…>` (shared/fleet/wake.py), so one worker takes those tenants in at once
   (on a Redis Cluster right after the pipeline, as a command of its own: see below).

On a cluster the pipeline is split per node and the nodes run their parts in parallel, so the
registry's `SADD` may land after the tenant's items. That is safe: the wake-up naming the
tenant follows the whole pipeline, and a sweep that missed the tenant sees it at the next one.
The wake-up must follow it: inside the pipeline it could reach its node before the items
reach theirs, and the worker taking it would find nothing yet.

Merging is what makes this fast: the Redis client's cost is per command, so one script call
for 32 requests' items costs a fraction of 32 calls. Each request still learns its own
outcome only after Redis answered the whole round; any error, or no answer within the
timeout, raises `StoreUnavailable`: the receiver holds the webhook and saves it again, and
answers a status the provider retries only if Redis still does not take it (receiver/app.py);
the dedupe markers make every repeat safe. Repeats cost the hot path nothing: they are the
caller's, on the failure path.

At most `rounds_in_flight` rounds are in flight at once, each on its own connection; while
every slot is busy the next round gathers, so a request waits at most for the rounds in
flight and its own. Two is the default: requests that arrive while a round is out go out at
once instead of waiting for its answer, 0.98-1.10 x a bare Starlette app against 0.95-1.00 x
with one (docs/benchmarks/receiver.md, 2026-12-05). Before the webhook was served from the
HTTP protocol (receiver/http_protocol.py) one measured best, and the flusher spun while a
round was out to keep a virtual CPU from halting; with the direct path the spin cost more CPU
than it saved (43 against 32 us a request) and was removed.

These tunables are `WriterTuning`'s fields; the defaults are what measured best, and a
benchmark passes others to compare (`InboxWriter(..., tuning=WriterTuning(...))`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from receiver.providers.parsing import Item
from shared.fleet.wake import now_ms, wake_command
from shared.keys import Keys, TenantKeys
from shared.settings import Settings
from shared.storage.raw_pipeline import RawPipeline
from shared.storage.redis_client import is_cluster
from shared.storage.scripts import Command, Scripts, is_noscript


@dataclass(frozen=True)
class WriterTuning:
    """How the writer groups and sends rounds (see the module docstring)."""

    max_items_per_call: int = 500  # bounds how long one script call holds Redis
    rounds_in_flight: int = 2  # rounds sent and not yet answered, at most (one connection each)
    answer_first: bool = True  # answer a round's requests before sending the next round
    max_cached_tenants: int = 10_000  # bounds the per-tenant key cache (bodies name tenants)
    registry_refresh_s: float = 60.0  # re-add known tenants this often (a reset registry)


@dataclass(frozen=True)
class DeadLetterBounds:
    """How much of the dead-letter list is kept: the newest `max_count` bodies and `max_bytes`
    bytes, the whole list expiring `ttl_s` after its last body (the DEADLETTER_* settings)."""

    max_count: int = 1000
    max_bytes: int = 64 * 1024 * 1024
    ttl_s: float = 7 * 24 * 3600.0

    @classmethod
    def of(cls, settings: Settings) -> DeadLetterBounds:
        max_count, max_bytes = settings.deadletter_max, settings.deadletter_max_bytes
        return cls(max_count, max_bytes, settings.deadletter_ttl_s)

    def command(self, scripts: Scripts, keys: Keys, bodies: list[bytes]) -> Command:
        """The `deadletter` script's call pushing `bodies` within these bounds."""
        return scripts.deadletter.command(
            None,
            deadletter=keys.deadletter,
            max_count=self.max_count,
            max_bytes=self.max_bytes,
            ttl_ms=max(1, round(self.ttl_s * 1000)),
            bodies=bodies,
        )


class StoreUnavailable(Exception):
    """Redis failed or did not confirm in time: nothing may be acknowledged."""


class Saved(NamedTuple):
    """What the ingest script answered for one request: new items and duplicates."""

    stored: int
    duplicates: int


class Waiter(Protocol):
    """What a round answers: a future of the request's results, or a `WebhookCall`
    (receiver/webhook_call.py), which answers its client from `set_result`."""

    def done(self) -> bool: ...
    def set_result(self, result: list[int]) -> None: ...
    def set_exception(self, exception: BaseException) -> None: ...
    def exception(self) -> BaseException | None: ...


@dataclass(slots=True)
class _Round:
    """Everything the requests of one round want written."""

    seen: dict[str, list[str]] = field(default_factory=dict)  # tenant -> dedupe keys
    data: dict[str, list[bytes]] = field(default_factory=dict)  # tenant -> encoded events
    deadletters: list[bytes] = field(default_factory=list)
    # each request: its waiter and, per tenant, where its items sit in that tenant's lists
    waiters: list[tuple[Waiter, list[tuple[str, int, int]]]] = field(default_factory=list)


# Stand-ins for the repeated groups of ingest.lua's call while its template is made: unique
# objects, found by identity (`InboxWriter._ingest_command`).
_SEEN, _EVENTS = object(), object()


def _expire(task: asyncio.Task[Any], expired: list[bool]) -> None:
    """A round's deadline passed: note it and cancel the flusher (`InboxWriter._commit`)."""
    expired.append(True)
    task.cancel()


def _fail(round_: _Round, exc: Exception) -> None:
    """The round failed: each of its requests gets `exc`."""
    for future, _ in round_.waiters:
        if not future.done():
            future.set_exception(exc)
            future.exception()  # a caller that timed out never reads it


class InboxWriter:
    """Stores parsed events (and dead-letter bodies), group-committing concurrent requests."""

    def __init__(
        self,
        redis: Any,
        scripts: Scripts,
        keys: Keys,
        dedupe_ttl_s: int,
        timeout_s: float,
        tuning: WriterTuning = WriterTuning(),
        deadletters: DeadLetterBounds = DeadLetterBounds(),
        on_deadletters_dropped: Callable[[int], None] | None = None,
    ) -> None:
        self.tuning = tuning
        self.deadletters = deadletters
        # Told how many old dead letters a round's push dropped (the receiver's metric).
        self._on_dropped = on_deadletters_dropped
        # Read on every request: a plain attribute each, not a lookup through `tuning`.
        self._rounds_in_flight = tuning.rounds_in_flight
        self._redis = redis
        self._scripts = scripts
        self._ingest = scripts.ingest  # looked up once (`Scripts` finds a script by name)
        self._keys = keys
        self._dedupe_ttl_s = dedupe_ttl_s
        self._timeout_s = timeout_s
        self._round = _Round()
        # Each flusher has at most one round in flight. The set holds strong references: the
        # event loop keeps only weak ones, and a flusher lost mid-round would leave its
        # requests waiting forever.
        self._flushers: set[asyncio.Task[None]] = set()
        self._opening = False  # a new flusher waits one loop turn before taking the round
        self._registered: set[str] = set()
        self._registered_at = 0.0
        self._keys_by_tenant: dict[str, TenantKeys] = {}
        # tenant key base -> its ingest call's template (`_ingest_command`)
        self._ingest_parts: dict[str, tuple[Any, ...]] = {}
        self._cluster = is_cluster(redis)
        self._wire = None if self._cluster else RawPipeline(redis)
        # The loop the writer serves, looked up once: on Python 3.11 every
        # asyncio.get_running_loop() makes a getpid() system call (fork check), which cost ~2 %
        # of the receiver's CPU when done per request. A writer's Redis connections belong to
        # one loop anyway.
        self._loop: asyncio.AbstractEventLoop | None = None

    async def save(self, items: dict[str, list[Item]], deadletter: bytes | None = None) -> Saved:
        """Store every item (grouped by tenant) and the optional dead-letter body."""
        if not items and deadletter is None:
            return Saved(0, 0)
        try:
            results = await self.join(items, deadletter)
        except Exception as exc:
            raise self.unavailable(exc) from exc
        stored = sum(results)
        return Saved(stored, len(results) - stored)

    def unavailable(self, error: Exception) -> StoreUnavailable:
        """What a failed round (`join`'s future) means to a caller: nothing was acknowledged."""
        if isinstance(error, TimeoutError):
            return StoreUnavailable(f"Redis did not confirm within {self._timeout_s}s")
        return StoreUnavailable(f"Redis error: {error!r}")

    def join(
        self, items: dict[str, list[Item]], deadletter: bytes | None = None
    ) -> asyncio.Future[list[int]]:
        """`save` without its wrapper, for the receiver's hot path: a future of one result per
        item (1 stored, 0 duplicate), tenants in `items`' order; an error or no answer in
        time is its exception (`unavailable` says it as `StoreUnavailable`). Awaiting the
        future itself spares the request a coroutine that every resume would pass through."""
        future: asyncio.Future[list[int]] = self._running_loop().create_future()
        self.enter(items, deadletter, future)
        return future

    def enter(self, items: dict[str, list[Item]], deadletter: bytes | None, waiter: Waiter) -> None:
        """`join` with the caller's own `waiter`, told the results (or the error) once Redis
        answered the round; on the loop the writer serves."""
        round_ = self._round
        places = []
        for tenant, batch in items.items():
            tenant_keys = self._tenant_keys(tenant)
            seen = round_.seen.setdefault(tenant, [])
            data = round_.data.setdefault(tenant, [])
            places.append((tenant, len(seen), len(batch)))
            for item_id, encoded in batch:
                seen.append(tenant_keys.seen(item_id))
                data.append(encoded)
        if deadletter is not None:
            round_.deadletters.append(deadletter)
        round_.waiters.append((waiter, places))
        if not self._opening and len(self._flushers) < self._rounds_in_flight:
            self._opening = True
            self._flushers.add(self._running_loop().create_task(self._flush_rounds()))

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the writer serves, looked up once (see `_loop`)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def _flush_rounds(self) -> None:
        """Send the gathering round, and the next one each time Redis answered, until none."""
        task = asyncio.current_task()
        assert task is not None
        try:
            try:
                await asyncio.sleep(0)  # let every request woken in this loop turn join
            finally:
                self._opening = False
            while self._round.waiters:
                round_, self._round = self._round, _Round()
                await self._commit(round_, task)
                if self.tuning.answer_first:
                    # Let the requests just answered send their responses before the next
                    # round goes out: the client learns sooner, its next requests can still
                    # join that round, and Redis is not woken in the same instant as the
                    # client (on a shared core that left the receiver idle).
                    await asyncio.sleep(0)
        finally:
            # Leave the set in the same step as the last look at the round, not in a done
            # callback: a callback runs a loop turn later, and a request joining in between
            # would find every slot taken and wait for a flusher that has already stopped.
            self._flushers.discard(task)

    async def _commit(self, round_: _Round, task: asyncio.Task[None]) -> None:
        """Write the round (`task`: the flusher running this) and answer its requests."""
        # One deadline per round rather than per request (a timer each is a measurable cost):
        # a request waits for at most the round in flight and its own. A bare timer that
        # cancels this task, as `asyncio.timeout` would, without its context manager's two
        # coroutines and rescheduling (~19k instructions a round, docs/benchmarks/receiver.md).
        loop = self._running_loop()
        cancelling = task.cancelling()
        expired: list[bool] = []
        timer = loop.call_at(loop.time() + self._timeout_s, _expire, task, expired)
        try:
            per_tenant = await self._write(round_)
        except asyncio.CancelledError:
            # The deadline's cancel becomes a TimeoutError for the round's requests; anyone
            # else's (a shutdown) goes on, as `asyncio.timeout` does it.
            if not expired or task.uncancel() > cancelling:
                raise
            _fail(round_, TimeoutError())
            return
        except Exception as exc:
            _fail(round_, exc)
            return
        finally:
            timer.cancel()
        for future, places in round_.waiters:
            if not future.done():
                if len(places) == 1:  # one tenant: nearly every request (no comprehension)
                    tenant, start, count = places[0]
                    future.set_result(per_tenant[tenant][start : start + count])
                else:
                    future.set_result(
                        [r for t, start, n in places for r in per_tenant[t][start : start + n]]
                    )

    def _ingest_command(
        self, tenant_keys: TenantKeys, seen: list[str], events: list[bytes]
    ) -> Command:
        """`ingest.command(tenant_keys, seen=..., dedupe_ttl_s=..., events=...)`, from a
        template made once per tenant: that same command built with a stand-in for each
        repeated group, cut around them. Built name by name it cost ~20k instructions a call,
        the template ~4k (four calls a round at four tenants); the script's header still
        orders every value."""
        ingest = self._ingest
        functions = ingest.mode.functions  # FCALL or EVALSHA: decided when scripts load
        parts = self._ingest_parts.get(tenant_keys.base)
        if parts is None or parts[0] != functions:
            if len(self._ingest_parts) >= self.tuning.max_cached_tenants:
                self._ingest_parts.clear()
            whole = ingest.command(
                tenant_keys, seen=[_SEEN], dedupe_ttl_s=self._dedupe_ttl_s, events=[_EVENTS]
            )
            at_seen, at_events = whole.index(_SEEN), whole.index(_EVENTS)
            parts = self._ingest_parts[tenant_keys.base] = (
                functions,
                whole[:2],  # FCALL and the function (EVALSHA and the sha)
                int(whole[2]) - 1,  # the keys that are not `seen`
                whole[3:at_seen],
                whole[at_seen + 1 : at_events],
                whole[at_events + 1 :],
            )
        _, head, other_keys, keys, middle, tail = parts
        return (*head, other_keys + len(seen), *keys, *seen, *middle, *events, *tail)

    def _tenant_keys(self, tenant: str) -> TenantKeys:
        # Built once per tenant, not per request (a frozen dataclass and a key check each).
        tenant_keys = self._keys_by_tenant.get(tenant)
        if tenant_keys is None:
            if len(self._keys_by_tenant) >= self.tuning.max_cached_tenants:
                self._keys_by_tenant.clear()
            tenant_keys = self._keys_by_tenant[tenant] = self._keys.tenant(tenant)
        return tenant_keys

    def _unregistered(self, tenants: dict[str, list[str]]) -> list[str]:
        loop = self._running_loop()  # (the writer's: no getpid() call)
        now = loop.time()  # once per round
        if now - self._registered_at > self.tuning.registry_refresh_s:
            self._registered.clear()
            self._registered_at = now
        return [t for t in tenants if t not in self._registered]

    async def _write(self, round_: _Round) -> dict[str, list[int]]:
        """One pipeline for the round; returns each tenant's per-item results (1 new, 0 dup)."""
        keys = self._keys
        ingest = self._ingest
        calls: list[tuple[str, Command]] = []
        for tenant, seen in round_.seen.items():
            tenant_keys = self._tenant_keys(tenant)
            data = round_.data[tenant]
            per_call = self.tuning.max_items_per_call
            for i in range(0, len(seen), per_call):
                chunk = slice(i, i + per_call)
                calls.append((tenant, self._ingest_command(tenant_keys, seen[chunk], data[chunk])))
        commands: list[tuple[Any, ...]] = []
        unregistered = self._unregistered(round_.seen)
        if unregistered:
            commands.append(("SADD", keys.tenants, *unregistered))
        commands.extend(call for _, call in calls)
        bodies = round_.deadletters
        deadletter = self.deadletters.command(self._scripts, keys, bodies) if bodies else None
        if deadletter:
            commands.append(deadletter)
        wake = wake_command(keys, round_.seen, now_ms()) if round_.seen else None
        if wake and not self._cluster:
            commands.append(wake)
        if self._cluster:
            results = await self._send_pipeline(commands)
        else:
            assert self._wire is not None
            results = await self._wire.exchange(commands)
        offset = 1 if unregistered else 0
        replies = list(results[offset : offset + len(calls)])
        wake_after = self._cluster
        if any(is_noscript(r) for r in replies):
            # Redis lost its script cache (restart, failover): nothing ran; load and repeat.
            # The pipeline's wake-up went before these items: wake again once they are in.
            wake_after = True
            await self._scripts.load(self._redis)
            for i, reply in enumerate(replies):
                if is_noscript(reply):
                    replies[i] = await ingest.run(self._redis, calls[i][1])
            results[offset : offset + len(calls)] = replies
        if deadletter:
            await self._deadlettered(results, offset + len(calls), deadletter)
        for result in results:
            if isinstance(result, Exception):
                raise result
        if wake and wake_after:
            # After every node confirmed the round's items (see the module docstring).
            await self._redis.execute_command(*wake)
        self._registered.update(unregistered)
        per_tenant: dict[str, list[int]] = {}
        for (tenant, _), reply in zip(calls, replies, strict=True):
            per_tenant.setdefault(tenant, []).extend(map(int, reply))
        return per_tenant

    async def _deadlettered(self, results: list[Any], index: int, command: Command) -> None:
        """Check the dead-letter call's reply (run it again after a NOSCRIPT, which ran
        nothing) and report the old bodies it dropped."""
        reply = results[index]
        if is_noscript(reply):
            reply = results[index] = await self._scripts.deadletter.run(self._redis, command)
        if isinstance(reply, Exception):
            return  # raised with the round's other errors
        if int(reply) and self._on_dropped is not None:
            self._on_dropped(int(reply))

    async def _send_pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The cluster path: redis-py's cluster pipeline splits the round per node."""
        pipe = self._redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))
