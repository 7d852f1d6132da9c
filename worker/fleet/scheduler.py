"""Which conversations a worker claims, and when: the main loop of `Worker`.

The worker learns about new work from the wake-up queues (shared/fleet/wake.py,
worker/fleet/listeners.py:
each wake-up reaches one worker) and about due times from the claim script's answer, so a
conversation's turn starts within milliseconds of its due time. A due time it holds but
cannot serve (no free slot, shutting down) it relays to a worker that can. The
`POLL_INTERVAL_S` sweep over the tenant registry is only a safety net (a lost wake-up, a
restarted Redis, a dead worker's lease or due time), done by one worker of the fleet per
interval and by each worker when its wake-up connection (re)connects (worker/fleet/sweep.py).

A claim whose answer never came (Redis froze or was too slow) may still run in Redis and
lock batches for tokens no turn holds: worker/fleet/unanswered_claims.py makes such a call claim
nothing, or hands back what it locked, so a Redis stall costs seconds, not `LEASE_S`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from shared.conversation.batch import Batch
from shared.fleet.wake import add as add_to_queue
from shared.keys import Keys
from shared.settings import Settings
from worker.conversation_store import Claim, ConversationStore
from worker.fleet.leases import Leases
from worker.fleet.listeners import WakeListener
from worker.fleet.retention import ReviewRetention
from worker.fleet.sweep import Sweep
from worker.fleet.unanswered_claims import HAND_BACK_EVERY_S, UnansweredClaims

if TYPE_CHECKING:
    from worker.fleet.review_notifier import ReviewNotifier

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, settings: Settings, keys: Keys, worker_id: str, leases: Leases) -> None:
        self._settings = settings
        self._keys = keys
        self._worker_id = worker_id
        self._leases = leases
        self._seq = itertools.count(1)
        self._dirty: set[str] = set()  # tenants to visit at once (woken, or to look again)
        self._next_wake: dict[str, float] = {}  # tenant -> loop time it is next due
        self.wake = asyncio.Event()  # ends the loop's sleep
        self.stopping = False
        self._next_sweep = 0.0  # loop time of this worker's next try at the fleet's sweep
        # A sweep of its own, whoever sweeps for the fleet: set whenever the wake-up
        # connection (re)connects, the first time included, to learn every due time and
        # lease end that no worker may hold (and what a lost connection may have missed).
        self._sweep_forced = False
        self.listening = asyncio.Event()  # wake-up connection up: start-up waits for it
        self._slow_sweep_warned = -math.inf  # loop time of the last "sweep too slow" warning
        # While the wake-up connection is lost this worker is told nothing, not even the
        # sweeper's relays: it then sweeps every interval on its own.
        self._deaf = True
        self._final_relays: list[asyncio.Task[None]] = []  # relays sent while shutting down
        self._unanswered = UnansweredClaims(settings)  # claims whose answer never came
        # Set by `connect` at start-up, once Redis answers.
        self._redis: Any = None
        self._store: ConversationStore
        self._sweep: Sweep
        self._retention: ReviewRetention
        self._wakeups: WakeListener
        self._start_turn: Callable[[Batch, float], None]
        self._notifier: ReviewNotifier | None = None

    def connect(
        self,
        redis: Any,
        store: ConversationStore,
        sweep: Sweep,
        wakeups: WakeListener,
        start_turn: Callable[[Batch, float], None],
        notifier: ReviewNotifier | None = None,
    ) -> None:
        """What the loop works with; `start_turn(batch, loop_now)` runs a claimed batch;
        `notifier` is told what the sweeps find of review notifications."""
        self._redis = redis
        self._store = store
        self._sweep = sweep
        s = self._settings
        self._retention = ReviewRetention(
            redis, self._keys, s.review_retention_s, s.poll_interval_s, s.redis_timeout_s
        )
        self._wakeups = wakeups
        self._start_turn = start_turn
        self._notifier = notifier

    @property
    def free_slots(self) -> int:
        return 0 if self.stopping else self._settings.worker_concurrency - len(self._leases)

    def stop(self) -> None:
        """Claim nothing more; the loop returns at once."""
        self.stopping = True
        self.wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._next_sweep = 0.0
        while not self.stopping:
            self.wake.clear()
            now = loop.time()
            todo: set[str] = set()
            unserved: set[str] = set()
            try:
                if self._unanswered:
                    # Before the claims: what a lost claim locked is then claimed at once.
                    self._dirty |= await self._unanswered.hand_back(self._store)
                if self._sweep_forced or now >= self._next_sweep:
                    # Both set before the await: a sweep asked for meanwhile must survive it.
                    forced = self._sweep_forced or self._deaf
                    self._sweep_forced = False
                    self._next_sweep = now + self._settings.poll_interval_s
                    await self._safety_sweep(forced)
                due = {t for t, at in self._next_wake.items() if at <= now}
                todo, self._dirty = self._dirty, set()
                if self.free_slots > 0:
                    todo |= due
                else:
                    # No slot: still take new events in (intake sets their due times), but
                    # give what is due to a worker that can start it.
                    unserved = due - todo
                if todo:
                    unserved |= self._unserved(await self._visit(todo))
                if unserved:
                    await self._relay(unserved)
            except (RedisError, OSError) as exc:
                log.warning("redis unavailable in main loop: %s", exc)
                self._dirty |= todo | unserved  # look at them again, not only at the next sweep
                await self.sleep(min(1.0, self._settings.poll_interval_s))
                continue
            if self.free_slots > 0:
                # After the claims, so that a relay is taken for a slot still free.
                self._wakeups.slots_free()
            await self.sleep(self._sleep_time(self._next_sweep))

    async def sleep(self, seconds: float) -> None:
        """Sleep, ended early by `wake` (a wake-up, a finished turn, a signal)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        try:
            await asyncio.wait_for(self.wake.wait(), seconds)
        except TimeoutError:
            pass

    def _sleep_time(self, next_sweep: float) -> float:
        if self._dirty:
            return 0.0
        until = next_sweep
        if self._unanswered:
            until = min(until, asyncio.get_running_loop().time() + HAND_BACK_EVERY_S)
        if self._next_wake:  # with no free slot too: it is then relayed
            until = min(until, min(self._next_wake.values()))
        return until - asyncio.get_running_loop().time()

    async def _safety_sweep(self, forced: bool) -> None:
        """Claim for every registered tenant that has something to do now (`forced`: that
        has anything at all); wake the fleet for those still due once this worker's slots
        are full. Unless `forced`, only the worker holding the fleet's sweep guard for this
        interval sweeps."""
        loop = asyncio.get_running_loop()
        try:
            if not forced and not await self._sweep.my_turn():
                return
            started = loop.time()
            registered = await self._sweep.registered()
            live = await self._sweep.live(registered)
            # A sweep of its own also learns every due time and lease end (see Sweep).
            tenants = set(live) if forced else await self._sweep.needing_a_look(live)
            if self._notifier is not None:
                await self._notifier.swept(*await self._sweep.notifications(live), own=forced)
        except BaseException:
            self._sweep_forced |= forced  # a forced sweep must still happen
            raise
        self._warn_if_slow(loop.time() - started, len(registered))
        if tenants:
            log.debug("sweep: %d tenants need a look", len(tenants))
            unserved = self._unserved(await self._visit(tenants))
            if unserved:
                await self._relay(unserved)
        if not forced:  # the fleet's sweep, after its claims: old review items of a slice
            await self._retention.prune(registered)

    def _warn_if_slow(self, took_s: float, tenants: int) -> None:
        """A probe taking much of the interval makes sweeps overlap: say so, once a minute."""
        interval = self._settings.poll_interval_s
        now = asyncio.get_running_loop().time()
        if took_s > interval / 2 and now - self._slow_sweep_warned > 60:
            self._slow_sweep_warned = now
            log.warning(
                "the safety sweep of %d tenants took %.2fs, over half of POLL_INTERVAL_S=%s: "
                "raise POLL_INTERVAL_S",
                tenants,
                took_s,
                interval,
            )

    async def _visit(self, tenants: set[str]) -> set[str]:
        """Take in new events of these tenants and claim what is due, up to the free slots;
        returns the tenants that still have a conversation due (no free slot for it)."""
        if len(tenants) == 1:
            (tenant,) = tenants
            claim = await self._claim(tenant, self.free_slots)
            self._apply(tenant, claim)
            return {tenant} if _still_due(claim) else set()
        # Many tenants: one pipelined pass takes their events in and claims an equal share
        # of the free slots each (none when there are fewer slots than tenants: it is then
        # intake only), then the slots left go to those still due, earliest first. The
        # share saves a second claim per tenant whenever the slots suffice, the usual case.
        ordered = sorted(tenants)
        share = self.free_slots // len(ordered)
        # Every claim that answered is applied even when another failed: its batches are
        # locked for this worker, and dropping them would leave them to wait out the lease.
        answers = await asyncio.gather(
            *(self._claim(t, share) for t in ordered), return_exceptions=True
        )
        ready, failed = [], None
        for tenant, answer in zip(ordered, answers, strict=True):
            if isinstance(answer, BaseException):
                failed = failed or answer
                continue
            self._apply(tenant, answer)
            if _still_due(answer):
                ready.append((answer.next_ms, tenant))
        if failed is not None:
            raise failed
        still_due = set()
        for _, tenant in sorted(ready):
            if self.free_slots <= 0:
                still_due.add(tenant)
                continue
            claim = await self._claim(tenant, self.free_slots)
            self._apply(tenant, claim)
            if _still_due(claim):
                still_due.add(tenant)
        return still_due

    async def _claim(self, tenant: str, max_batches: int) -> Claim:
        token = f"{self._worker_id}:{next(self._seq)}"
        return await self._unanswered.claim(self._store, tenant, max(0, max_batches), token)

    def _apply(self, tenant: str, claim: Claim) -> None:
        loop_now = asyncio.get_running_loop().time()
        if claim.more:
            self._dirty.add(tenant)
        if claim.next_ms < 0:
            self._next_wake.pop(tenant, None)
        else:
            wait_s = (claim.next_ms - claim.now_ms) / 1000
            if wait_s <= 0 and not claim.batches and self.free_slots > 0:
                wait_s = 0.05  # due but not claimable right now: look again shortly, no spin
            self._next_wake[tenant] = loop_now + wait_s
        for batch in claim.batches:
            self._start_turn(batch, loop_now)

    # --- wake-ups -------------------------------------------------------------------------
    def woken(self, tenants: list[str]) -> None:
        """WakeListener: these tenants were taken off a wake-up queue for this worker."""
        self._dirty.update(tenants)
        self.wake.set()

    def wake_connected(self) -> None:
        # Anything this worker may have missed while it was not connected: sweep now.
        self._deaf = False
        self._sweep_forced = True
        self.listening.set()
        self.wake.set()

    def wake_lost(self) -> None:
        self._deaf = True

    def turn_ended(self, tenant: str) -> None:
        """The finish may have made this tenant due sooner than the wake time held (a retry
        delay, messages that came during the turn): look again at once."""
        self._dirty.add(tenant)
        self.wake.set()
        if self.stopping:
            # This process claims nothing more: relay the tenant, in case the finish made
            # the person's next batch due (now or later).
            self._final_relays.append(asyncio.create_task(self._relay_one(tenant)))

    # --- relays ---------------------------------------------------------------------------
    def _unserved(self, still_due: set[str]) -> set[str]:
        """Of the tenants still due after a visit, those to relay: all of them once every
        slot is taken. With a slot still free a due conversation could not be claimed for
        another reason (its lock was held); this worker looks again shortly (see `_apply`),
        as relaying it would only move that wait elsewhere."""
        return still_due if self.free_slots <= 0 else set()

    async def _relay(self, tenants: set[str]) -> None:
        """Give due conversations this worker cannot start to a worker with a free slot; it
        then holds their due times, so this one forgets them."""
        async with asyncio.timeout(self._settings.redis_timeout_s):
            await add_to_queue(self._redis, self._keys.relay_queue, tenants)
        for tenant in tenants:
            self._next_wake.pop(tenant, None)
        log.debug("relayed %d tenant(s)", len(tenants))

    async def relay_at_shutdown(self) -> None:
        """Give the fleet what this worker held: the tenants it was woken for and not yet
        visited (new work: any worker takes their events in) and those whose due times it
        alone may know (relayed: another worker claims when due). The wake-up listeners are
        stopped first."""
        if self._redis is None:
            return
        woken, held = set(self._dirty), set(self._next_wake) - self._dirty
        try:
            async with asyncio.timeout(self._settings.redis_timeout_s):
                if woken:
                    await add_to_queue(self._redis, self._keys.wake_queue, woken)
                if held:
                    await add_to_queue(self._redis, self._keys.relay_queue, held)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not relay %d tenant(s) at shutdown: %r", len(woken | held), exc)

    async def _relay_one(self, tenant: str) -> None:
        try:
            async with asyncio.timeout(self._settings.redis_timeout_s):
                await add_to_queue(self._redis, self._keys.relay_queue, [tenant])
        except (RedisError, OSError, TimeoutError) as exc:
            log.info("could not relay tenant=%s: %r", tenant, exc)

    async def end_final_relays(self) -> None:
        """At exit: a second for the relays of turns that ended during shutdown, then stop
        what is left of them."""
        tasks = self._final_relays
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _still_due(claim: Claim) -> bool:
    """A conversation of the tenant is due now (or a lease ended) and was not claimed."""
    return 0 <= claim.next_ms <= claim.now_ms
