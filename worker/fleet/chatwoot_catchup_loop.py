"""When a worker runs the Chatwoot catch-up (worker/fleet/chatwoot_catchup.py says what a run
does): once a second it looks whether one is owed, and runs it if it gets the lock.

A run is owed when:
- a receiver could not store a Chatwoot webhook (`cw:catchup:wanted` is not empty: one
  `EXISTS` a second per worker, a fleet-wide key, nothing on the webhook's path);
- this worker's own Redis calls failed and answer again (the receivers that refused webhooks
  meanwhile may have died before they could ask): every Chatwoot tenant, from when they failed;
- `CHATWOOT_CATCHUP_INTERVAL_S` passed: the worker that sets `cw:catchup:due` (NX, PX the
  interval; each worker tries every `GUARD_TRY_S`, or a quarter of a shorter interval) runs
  the periodic one for every Chatwoot tenant (0: never).

The requests are taken atomically (`HGETALL` and `DEL` in one transaction) by the holder of the
lock, so a request made during the run waits for the next one; those of a tenant the run did
not finish (or all, when the run is cancelled) are put back, the earlier time kept
(shared/lua/catchup_want.lua), and after an unfinished run its worker keeps the lock for
`RETRY_S`: the fleet tries again that much later, not every second. A worker killed during a
run loses the requests it took: the other workers' own recovery and the periodic catch-up are
the net.
The Chatwoot tenants are those in the registry (`cw-…`) and in `TENANTS_FILE` with a token.
Only with Chatwoot configured (`CHATWOOT_API_ACCESS_TOKEN`, or a tenant's `access_token`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from redis.exceptions import RedisError

from receiver.catchup_request import ask
from shared.chatwoot import TENANT_PREFIX
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.scripts import Scripts
from worker.fleet.chatwoot_catchup import RETRY_S, ChatwootCatchUp, RunReport
from worker.fleet.chatwoot_reader import ChatwootReader

log = logging.getLogger(__name__)

TICK_S = 1.0
GUARD_TRY_S = 5.0


def enabled(settings: Settings) -> bool:
    """Chatwoot is configured: a global token, or a tenant's own."""
    if settings.chatwoot_api_access_token:
        return True
    return any(
        t.startswith(TENANT_PREFIX) and settings.tenant(t).chatwoot_api_access_token
        for t in settings.tenants
    )


class ChatwootCatchUpLoop:
    def __init__(
        self,
        settings: Settings,
        redis: Any,
        keys: Keys,
        scripts: Scripts,
        reader: ChatwootReader | None = None,
    ) -> None:
        self.settings = settings
        self._redis = redis
        self._keys = keys
        self._reader = reader or ChatwootReader(settings)
        self._scripts = scripts
        self.catchup = ChatwootCatchUp(settings, redis, keys, scripts, self._reader)
        self._failed_since_ms: int | None = None  # this worker's Redis calls fail since then
        self._owed_since_ms: int | None = None  # they failed, then answered: a run is owed
        self._guard_tried = -GUARD_TRY_S  # when this worker last tried the periodic guard

    async def aclose(self) -> None:
        await self._reader.aclose()

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                # Each Redis call is bounded by the client's timeout, each API call by
                # CHATWOOT_TIMEOUT_S, and a run by its budget of calls.
                await self.tick()
            except (RedisError, OSError) as exc:
                if self._failed_since_ms is None:
                    self._failed_since_ms = int(time.time() * 1000)
                    log.info(
                        "chatwoot catch-up: Redis failed (%r); catching up once it answers", exc
                    )
            except Exception:
                log.exception("chatwoot catch-up failed")

    async def tick(self) -> RunReport | None:
        """Run the catch-up if one is owed and this worker gets the lock."""
        redis, keys = self._redis, self._keys
        wanted = await redis.exists(keys.chatwoot_catchup_wanted)
        if self._failed_since_ms is not None:  # Redis answered again
            self._owed_since_ms = min(
                self._owed_since_ms or self._failed_since_ms, self._failed_since_ms
            )
            self._failed_since_ms = None
        periodic = False
        interval_s = self.settings.chatwoot_catchup_interval_s
        if not wanted and self._owed_since_ms is None:
            # The guard is tried a few times an interval (at most every GUARD_TRY_S), not at
            # every tick: the periodic run starts at most that late.
            now = time.monotonic()
            if interval_s <= 0 or now - self._guard_tried < min(interval_s / 4, GUARD_TRY_S):
                return None
            self._guard_tried = now
            periodic = bool(
                await redis.set(keys.chatwoot_catchup_due, "1", nx=True, px=int(interval_s * 1000))
            )
            if not periodic:
                return None
        if not await self.catchup.acquire():
            return None
        report = None
        try:
            report = await self._run(periodic)
            return report
        finally:
            if report is not None and report.unfinished:
                await self.catchup.release(hold_ms=int(RETRY_S * 1000))
            else:
                await self.catchup.release()

    async def _run(self, periodic: bool) -> RunReport:
        redis, keys = self._redis, self._keys
        pipe = redis.pipeline(transaction=True)
        pipe.hgetall(keys.chatwoot_catchup_wanted)
        pipe.delete(keys.chatwoot_catchup_wanted)
        asked_raw, _ = await pipe.execute()
        tenants: dict[str, int | None] = {}
        for name, value in asked_raw.items():
            tenant = name.decode() if isinstance(name, bytes) else str(name)
            if tenant.startswith(TENANT_PREFIX):
                tenants[tenant] = int(value)
        owed_ms, self._owed_since_ms = self._owed_since_ms, None
        if periodic or owed_ms is not None:
            for tenant in await self._known_tenants():
                asked = tenants.get(tenant)
                if owed_ms is not None:
                    asked = owed_ms if asked is None else min(asked, owed_ms)
                tenants[tenant] = asked
        try:
            report = await self.catchup.run(tenants)
        except BaseException:
            # Cancelled (a shutdown) or failed (Redis, mid-run): whatever was asked for is
            # asked for again, in Redis if it answers, else by this worker once it does.
            again = {t: ms for t, ms in tenants.items() if ms is not None}
            if again:
                earliest = min(again.values())
                self._owed_since_ms = min(self._owed_since_ms or earliest, earliest)
            with contextlib.suppress(Exception):
                await asyncio.shield(ask(redis, keys, self._scripts, again))
            raise
        # Unfinished: what the run left (budget, failure) or never reached (a lost lock);
        # a tenant without a token is never read, and never asked for again.
        done = {t.tenant for t in report.tenants if t.complete}
        unfinished = {t: ms for t, ms in tenants.items() if t not in done and self._reader.token(t)}
        await ask(redis, keys, self._scripts, {t: ms for t, ms in unfinished.items() if ms})
        log.info(
            "chatwoot catch-up: %s run, %d tenants (%d unfinished), %d conversations,"
            " %d calls, %d messages taken in, %d API errors, %.1fs%s",
            "periodic" if periodic else "requested",
            len(report.tenants),
            len(unfinished),
            sum(t.conversations for t in report.tenants),
            sum(t.calls for t in report.tenants),
            report.taken,
            sum(t.errors for t in report.tenants),
            report.seconds,
            "".join(f"; {t.tenant}: {t.why}" for t in report.unfinished),
        )
        return report

    async def _known_tenants(self) -> set[str]:
        members = await self._redis.smembers(self._keys.tenants)
        found = {m.decode() if isinstance(m, bytes) else str(m) for m in members}
        found.update(self.settings.tenants)
        return {t for t in found if t.startswith(TENANT_PREFIX)}
