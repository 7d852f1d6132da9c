"""One worker's wake-up listeners: new work (always) and relays (with a free slot).

Each listener blocks on its queue (shared/fleet/wake.py) on a connection of its own, named after the
worker, and passes what it takes to the main loop, which claims. The new-work listener runs
whatever the worker's load, because the claim that follows is also the intake that sets due
times; the relay listeners wait while every slot is taken, so that a conversation another
worker could start is left to that worker. During a rolling deploy a second relay listener
drains the previous release's queue (shared/fleet/wake.py says why that is safe). Connection state
is reported to the worker: while the new-work connection is lost it sweeps on its own, and
when it is back it sweeps once (worker/fleet/sweep.py), for whatever it may have missed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from shared.fleet import wake
from shared.keys import KeyError_, Keys

log = logging.getLogger(__name__)

# How long one blocking pop waits before it is sent again: short enough for a connection that
# died silently to be noticed (the pop is bounded by this plus the Redis timeout), long enough
# to cost nothing (one command per interval per idle listener).
BLOCK_S = 5.0
# Tenants taken from the new-work queue at once; the claims for them share round trips.
NEW_WORK_BATCH = 100
RETRY_S = 1.0


class WakeListener:
    def __init__(
        self,
        redis: Any,
        keys: Keys,
        *,
        free_slots: Callable[[], int],
        deliver: Callable[[list[str]], None],
        connected: Callable[[], None],
        lost: Callable[[], None],
        timeout_s: float,
    ) -> None:
        """`redis` without `socket_timeout`; `deliver` gets the tenants taken; `connected` and
        `lost` tell the state of the new-work connection."""
        self._redis = redis
        self._keys = keys
        self._free_slots = free_slots
        self._deliver = deliver
        self._connected = connected
        self._lost = lost
        self._timeout_s = timeout_s
        self._slot_free = asyncio.Event()

    def slots_free(self) -> None:
        """The worker has a free slot after its claims: the relay listeners may take one."""
        self._slot_free.set()

    async def new_work(self) -> None:
        """Take tenants with new events, busy or not; runs until cancelled."""
        queue = self._keys.wake_queue
        while True:
            try:
                async with asyncio.timeout(self._timeout_s):
                    await self._redis.zcard(queue)  # connected: anything added from now on
                self._connected()
                while True:
                    self._pass_on(await self._take(queue, NEW_WORK_BATCH))
            except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
                self._lost()
                log.warning("wake-up queue unreachable (%r); sweeping until it is back", exc)
                await asyncio.sleep(RETRY_S)

    async def relays(self) -> None:
        """Take tenants that other workers could not start, while a slot is free; runs until
        cancelled."""
        await self._relays(self._keys.relay_queue)

    async def legacy_relays(self) -> None:
        """`relays` on the queue workers of the previous release relay to, so that what they
        relay during a rolling deploy is served. Remove after one release."""
        await self._relays(self._keys.legacy_relay_queue)

    async def _relays(self, queue: str) -> None:
        while True:
            await self._slot_free.wait()
            free = self._free_slots()
            if free <= 0:
                self._slot_free.clear()
                continue
            try:
                taken = await self._take(queue, free)
            except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
                log.warning("relay queue %s unreachable (%r)", queue, exc)
                await asyncio.sleep(RETRY_S)
                continue
            if taken:
                # Wait for the worker's next look at its slots: until it claimed for these,
                # `free` still counts the slots they will take.
                self._slot_free.clear()
                self._pass_on(taken)

    async def _take(self, queue: str, most: int) -> list[str]:
        async with asyncio.timeout(BLOCK_S + self._timeout_s):
            return await wake.take(self._redis, queue, most, BLOCK_S)

    def _pass_on(self, tenants: list[str]) -> None:
        valid = []
        for tenant in tenants:
            try:
                self._keys.tenant(tenant)
            except KeyError_:
                # Not from the receiver (it checks ids first): never let it reach a claim.
                log.warning("wake-up for %r, which cannot be a tenant: dropped", tenant)
                continue
            valid.append(tenant)
        if valid:
            self._deliver(valid)
