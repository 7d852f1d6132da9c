"""The safety sweep: which worker looks at every registered tenant, and how cheaply.

Wake-ups (shared/fleet/wake.py) and the due times that claims return start every turn; the sweep
only catches what they missed: a wake-up taken by a worker that died before its claim (or lost
with a Redis that restarted without it), a crashed worker's expired lease, a due time or retry
delay that the worker holding it died with. It therefore needs neither to run on every worker
nor to run the claim script on every tenant:

- **One sweeper per interval, fleet-wide.** Each worker tries `SET <prefix>:sweep <worker id>
  NX PX <0.9 x POLL_INTERVAL_S>` once per interval; the one that sets it sweeps (the guard of
  BullMQ's stalled-job checker). Nobody renews or deletes the guard: it expires, so a sweeper
  that dies is replaced by the next worker to try, at most about two intervals later. Each
  worker also sweeps on its own when its wake-up connection (re)connects, and every interval
  while that connection is lost (it would not get the sweeper's relays).
- **A probe of plain reads, pipelined.** One `EXISTS inbox due running` per tenant: a quiet
  tenant has none of these keys (Redis deletes an empty list or sorted set). For the few that
  have any, `LLEN inbox`, `ZCOUNT due -inf <now>` and `ZCOUNT running -inf <now>` on Redis's
  clock tell whether there is something to take in, a conversation due, or a lease that ended.
  Only those tenants get a claim. A worker's own sweep (start-up, reconnection) claims for
  every tenant with any of these keys instead: the claim's answer gives it their next due
  times and lease ends, which the worker that held them may have taken with it. Each
  command names one tenant's keys (one slot), so the probe runs unchanged on a cluster,
  where the pipeline is split per node.

- **Review notifications** (only with `REVIEW_WEBHOOK_URL` set: otherwise the probe is as
  above). The tenant's notification queue joins the `EXISTS`, and each live tenant's earliest
  notification time is read (`ZRANGE review:notify 0 0 WITHSCORES`): the fleet's sweep gives
  those due to the fleet, a worker's own sweep looks at all (worker/fleet/review_notifier.py).

The guard is a fleet-wide key and never goes into a tenant's script (invariant 9).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from shared.keys import KeyError_, Keys

log = logging.getLogger(__name__)

# Commands per pipeline: bounds one round trip's size with 10 000+ registered tenants.
PROBE_CHUNK = 1000
# The guard lives this share of POLL_INTERVAL_S (see Sweep.__init__).
GUARD_SHARE = 0.9


class Sweep:
    """The sweep guard and the probe of one worker.

    Give it a client without `socket_timeout`: redis-py arms a timer per reply when it has
    one, a large share of the probe's CPU (docs/benchmarks/fleet.md, "Idle tenants"); each
    call here is bounded by `timeout_s` instead.
    """

    def __init__(
        self,
        redis: Any,
        keys: Keys,
        worker_id: str,
        interval_s: float,
        timeout_s: float,
        notify: bool = False,
    ) -> None:
        """`notify`: a review webhook is configured; probe the notification queues too."""
        self._redis = redis
        self._notify = notify
        self._keys = keys
        self._worker_id = worker_id
        # A little shorter than the interval: the sweeper's own next try, one interval after
        # its last, must find the guard gone even if that SET reaches Redis a bit early.
        self._guard_ms = max(1, int(interval_s * GUARD_SHARE * 1000))
        self._timeout_s = timeout_s
        self._refused: set[str] = set()  # registry entries that cannot be keys, told once

    async def my_turn(self) -> bool:
        """True if this worker is the fleet's sweeper for the coming interval."""
        async with asyncio.timeout(self._timeout_s):
            return bool(
                await self._redis.set(
                    self._keys.sweep_guard, self._worker_id, nx=True, px=self._guard_ms
                )
            )

    async def registered(self) -> set[str]:
        """Every tenant in the registry (leaving out, with a warning, ids that cannot be
        part of a key: one bad entry must not stop the sweep of all the others)."""
        async with asyncio.timeout(self._timeout_s):
            members = await self._redis.smembers(self._keys.tenants)
        tenants = set()
        for member in members:
            tenant = member.decode() if isinstance(member, bytes) else member
            try:
                self._keys.tenant(tenant)
            except KeyError_:
                if tenant not in self._refused:
                    self._refused.add(tenant)
                    log.warning("tenant registry entry %r cannot be a key: left out", tenant)
                continue
            tenants.add(tenant)
        return tenants

    async def live(self, tenants: Iterable[str]) -> list[str]:
        """The tenants with anything in their inbox, due or running set (or review
        notification queue)."""
        ordered = sorted(tenants)
        return [t for t, n in zip(ordered, await self._exists(ordered), strict=True) if n]

    async def needing_a_look(self, live: Sequence[str]) -> set[str]:
        """Of these tenants, those with events in their inbox, a conversation due now, or an
        expired lease."""
        if not live:
            return set()
        now_ms = await self._now_ms()
        found = set()
        for tenant, (inbox, due, expired) in zip(
            live, await self._counts(live, now_ms), strict=True
        ):
            if inbox or due or expired:
                found.add(tenant)
        return found

    async def notifications(self, live: Sequence[str]) -> tuple[dict[str, int], int]:
        """Of these tenants, those with review notifications: tenant -> the earliest time
        one may be tried (ms), and Redis's clock now."""
        if not self._notify or not live:
            return {}, 0
        now_ms = await self._now_ms()

        def queue(pipe: Any, tenant: str) -> None:
            pipe.zrange(self._keys.tenant(tenant).review_notify, 0, 0, withscores=True)

        found = {}
        for tenant, first in zip(live, await self._pipelined(live, queue, 1), strict=True):
            if first:  # [(item id, score)]
                found[tenant] = int(first[0][1])
        return found, now_ms

    async def _exists(self, tenants: Sequence[str]) -> list[int]:
        def queue(pipe: Any, tenant: str) -> None:
            k = self._keys.tenant(tenant)
            extra = [k.review_notify] if self._notify else []
            pipe.execute_command("EXISTS", k.inbox, k.due, k.running, *extra)

        return [int(n) for n in await self._pipelined(tenants, queue, 1)]

    async def _counts(self, tenants: Sequence[str], now_ms: int) -> list[tuple[int, int, int]]:
        def queue(pipe: Any, tenant: str) -> None:
            k = self._keys.tenant(tenant)
            pipe.execute_command("LLEN", k.inbox)
            pipe.execute_command("ZCOUNT", k.due, "-inf", now_ms)
            pipe.execute_command("ZCOUNT", k.running, "-inf", now_ms)

        flat = [int(n) for n in await self._pipelined(tenants, queue, 3)]
        return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    async def _pipelined(self, tenants: Sequence[str], queue: Any, per_tenant: int) -> list[Any]:
        results: list[Any] = []
        step = max(1, PROBE_CHUNK // per_tenant)
        for start in range(0, len(tenants), step):
            pipe = self._redis.pipeline(transaction=False)
            for tenant in tenants[start : start + step]:
                queue(pipe, tenant)
            async with asyncio.timeout(self._timeout_s):
                results += await pipe.execute()
        return results

    async def _now_ms(self) -> int:
        async with asyncio.timeout(self._timeout_s):
            reply = await self._redis.time()
        if isinstance(reply, dict):  # a cluster client may answer per node: any node's clock
            reply = next(iter(reply.values()))
        seconds, micros = reply
        return int(seconds) * 1000 + int(micros) // 1000
