"""Asking the fleet for a Chatwoot catch-up after a webhook the receiver could not store.

Chatwoot never sends an account webhook again (docs/providers/chatwoot.md), so when the
receiver answers one 500 (Redis did not take it within `WEBHOOK_HOLD_S`) the message is only in
Chatwoot; a worker reads it back from there (worker/fleet/chatwoot_catchup.py). It has to be
told, through Redis, which just failed: the receiver remembers the tenant and when, in
process, and a background task writes it to `cw:catchup:wanted` (tenant -> ms, the earlier
time kept: shared/lua/catchup_want.lua), trying once a second until Redis takes it. Only the
failure path calls this; a webhook Redis took costs nothing more. A receiver that dies before
Redis answers loses its requests: the workers' own recovery and the periodic catch-up cover
that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from shared.chatwoot import TENANT_PREFIX
from shared.keys import Keys
from shared.storage.scripts import Scripts

logger = logging.getLogger(__name__)

RETRY_S = 1.0


class CatchUpRequests:
    def __init__(
        self, keys: Keys, scripts: Scripts, timeout_s: float, retry_s: float = RETRY_S
    ) -> None:
        self._keys = keys
        self._scripts = scripts
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._owed: dict[str, int] = {}  # tenant -> ms of its first webhook not stored
        self._task: asyncio.Task[None] | None = None
        self.redis: Any = None  # the receiver's client, set in its lifespan

    def remember(self, tenants: Iterable[str], since_ms: int) -> None:
        """Chatwoot webhooks of these tenants were not stored: ask for a catch-up."""
        for tenant in tenants:
            if tenant.startswith(TENANT_PREFIX):
                self._owed[tenant] = min(self._owed.get(tenant, since_ms), since_ms)
        if self._owed and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._deliver())

    async def _deliver(self) -> None:
        while self._owed:
            owed = dict(self._owed)
            try:
                async with asyncio.timeout(self._timeout_s):
                    await ask(self.redis, self._keys, self._scripts, owed)
            except (RedisError, RedisClusterException, OSError, TimeoutError):
                # Redis still down: the request stays owed and is asked again in a moment.
                await asyncio.sleep(self._retry_s)
                continue
            except Exception:
                # Not Redis being away (a script error, say): say so, but keep the request
                # owed and retrying, since a lost request is a customer's message never read.
                logger.exception("chatwoot catch-up request failed; retrying")
                await asyncio.sleep(self._retry_s)
                continue
            for tenant, since_ms in owed.items():
                if self._owed.get(tenant) == since_ms:
                    del self._owed[tenant]
            logger.info("chatwoot catch-up asked for %s", ", ".join(sorted(owed)))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def ask(redis: Any, keys: Keys, scripts: Scripts, owed: dict[str, int]) -> None:
    """Ask for a catch-up of these tenants (tenant -> ms to read back to); a tenant asked for
    already keeps the earlier time."""
    if owed:
        await scripts.catchup_want(
            redis, None, wanted=keys.chatwoot_catchup_wanted, asks=list(owed.items())
        )
