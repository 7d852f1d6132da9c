"""The worker process: `Worker(settings).run()` = startup, main loop, graceful shutdown.

One process runs at most `WORKER_CONCURRENCY` turns at once. It learns about new work from
the wake-up queues (shared/wake.py, worker/wakeups.py: each wake-up reaches one worker) and
about due times from the claim script's answer, so a conversation's turn starts within
milliseconds of its due time. A due time it holds but cannot serve (no free slot, shutting
down) it hands off to a worker that can. The `POLL_INTERVAL_S` sweep over the tenant registry
is only a safety net (a lost wake-up, a restarted Redis, a dead worker's lease or due time),
done by one worker of the fleet per interval and by each worker when its wake-up connection
(re)connects (worker/sweep.py).

Every running turn holds its person's lock; one renewal loop extends all of this process's
leases every `LEASE_RENEW_S`. A turn whose lease cannot be proven any more (lost, or Redis
unreachable until the lease is about to end) is cancelled before another worker may take the
batch over, so two turns of one person never overlap. Signals only set flags, as in uvicorn:
the first stops claiming and lets running turns finish within `SHUTDOWN_GRACE_S` (leases still
renewed, never released early), the second exits at once.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.group_commit import GroupCommitter
from shared.keys import Keys
from shared.logs import log_startup, redact_person, warn_if_not_persistent
from shared.redis_client import make_redis
from shared.scripts import Scripts
from shared.settings import Settings
from shared.wake import add as add_to_queue
from worker.batch import Batch
from worker.brains import Brain, load_brain
from worker.errors import DELIVERY_UNKNOWN, DeliveryUnknown, LeaseLost, NeedsReview
from worker.handoff import HandOff
from worker.senders import Sender, load_senders
from worker.split import WHATSAPP_MAX_CHARS, split_reply
from worker.store import Claim, ConversationStore
from worker.sweep import Sweep
from worker.unknowns import UnknownDelivery, utc
from worker.wakeups import WakeListener

log = logging.getLogger(__name__)
T = TypeVar("T")

# Waiting for Redis at start-up: the first retry after this long, doubling up to the cap.
REDIS_WAIT_FIRST_S = 0.5
REDIS_WAIT_MAX_S = 5.0


@dataclass
class RunningTurn:
    batch: Batch
    lease_deadline: float  # loop time after which the lease may have ended in Redis
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Worker:
    def __init__(
        self,
        settings: Settings,
        *,
        brain: Brain | None = None,
        sender: Sender | None = None,
        senders: Mapping[str, Sender] | None = None,
        worker_id: str | None = None,
    ) -> None:
        """`sender` replaces the one `SENDER` names, `senders` the sender of a channel."""
        self.settings = settings
        self.worker_id = worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        )
        self.keys = Keys(settings.key_prefix)
        self._brain = brain
        self._sender = sender
        self._given_senders = dict(senders or {})
        self._senders: dict[str, Sender] = {}  # channel -> its sender, set at start-up
        self._owned: list[object] = []  # brain/sender loaded here: their clients close here
        self._seq = itertools.count(1)
        self._turns: dict[tuple[str, str], RunningTurn] = {}
        self._dirty: set[str] = set()
        self._next_wake: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._force_exit = asyncio.Event()
        self._stopping = False
        self._next_sweep = 0.0  # loop time of this worker's next try at the fleet's sweep
        # A sweep of its own, whoever sweeps for the fleet: set whenever the wake-up
        # connection (re)connects, the first time included, to learn every due time and
        # lease end that no worker may hold (and what a lost connection may have missed).
        self._sweep_forced = False
        self._listening = asyncio.Event()  # wake-up connection up: start-up waits for it
        self._slow_sweep_warned = -math.inf  # loop time of the last "sweep too slow" warning
        # While the wake-up connection is lost this worker is told nothing, not even the
        # sweeper's hand-offs: it then sweeps every interval on its own.
        self._deaf = True
        self._background: list[asyncio.Task[None]] = []
        self._listeners: list[asyncio.Task[None]] = []  # stopped first at shutdown
        self._farewells: list[asyncio.Task[None]] = []  # hand-offs sent while shutting down
        self.redis: Any = None
        self._commit_redis: Any = None
        self._listen_redis: Any = None

    # --- lifecycle ------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self.startup()
        except BaseException:
            await self._close_clients()
            raise
        try:
            await self.main_loop()
        finally:
            await self.shutdown()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.handle_exit, sig)

    def handle_exit(self, sig: int | None = None) -> None:
        if self._stopping:
            log.warning("second signal: exiting now, running turns resume after their lease")
            self._force_exit.set()
        else:
            log.info("signal %s: no new turns; waiting for %d running", sig, len(self._turns))
        self._stopping = True
        self._wake.set()

    async def startup(self) -> None:
        s = self.settings
        self.redis = make_redis(s)
        self.scripts = Scripts()
        log_startup(log, "worker", s)
        if not await self._wait_for_redis():
            return  # a signal came first: main_loop sees `_stopping` and returns at once
        await warn_if_not_persistent(self.redis, s.redis_timeout_s, log)
        # Turn traffic goes through the committer on its own connection pool, bounded per round
        # rather than per reply (see GroupCommitter).
        self._commit_redis = make_redis(s, socket_timeout=None)
        self.committer = GroupCommitter(
            self._commit_redis, self.scripts, timeout_s=s.redis_timeout_s
        )
        self.store = ConversationStore(s, self.scripts, self.committer)
        self.sweep = Sweep(
            self._commit_redis, self.keys, self.worker_id, s.poll_interval_s, s.redis_timeout_s
        )
        if self._brain is None:
            self._brain = load_brain(s)
            self._owned.append(self._brain)
        given = [self._sender, *self._given_senders.values()]
        self._senders = load_senders(
            s, self.keys, self.committer, self._sender, self._given_senders
        )
        for sender in {id(x): x for x in self._senders.values()}.values():
            if not any(sender is g for g in given):
                self._owned.append(sender)
        # The listeners block waiting, so no read timeout on their connections (each wait is
        # bounded by WakeListener instead); named, so `CLIENT LIST` shows the worker.
        self._listen_redis = make_redis(
            s, socket_timeout=None, client_name=self.keys.worker_client_name(self.worker_id)
        )
        self.wakeups = WakeListener(
            self._listen_redis,
            self.keys,
            free_slots=lambda: self.free_slots,
            deliver=self._woken,
            connected=self._wake_connected,
            lost=self._wake_lost,
            timeout_s=s.redis_timeout_s,
        )
        self._listeners = [
            asyncio.create_task(self.wakeups.new_work(), name="new-work"),
            asyncio.create_task(self.wakeups.handoffs(), name="handoffs"),
        ]
        self._background = [asyncio.create_task(self._renew_leases(), name="renew")]
        # Connected first, then one sweep of its own (set by the listener) covers everything
        # from before; without the wait the first sweep would run twice.
        try:
            await asyncio.wait_for(self._listening.wait(), s.redis_timeout_s)
        except TimeoutError:
            log.info("wake-up queue not reachable yet; sweeping every interval")
        log.info(
            "worker %s started: concurrency=%d brain=%s senders=%s",
            self.worker_id,
            s.worker_concurrency,
            s.brain,
            ",".join(f"{c}:{type(x).__name__}" for c, x in sorted(self._senders.items())),
        )

    async def _wait_for_redis(self) -> bool:
        """Load the scripts, retrying with capped backoff while Redis does not answer (a
        worker may start before its Redis, e.g. both deployed at once); one line per attempt.
        False if a signal came first."""
        url = self.settings.masked()["redis_url"]
        delay, attempt = REDIS_WAIT_FIRST_S, 1
        while True:
            try:
                await self.scripts.load(self.redis)
            except (RedisError, RedisClusterException, OSError) as exc:
                if self._stopping:
                    return False
                log.warning(
                    "redis not reachable at start-up (%s, attempt %d): %s; next try in %.1fs",
                    url,
                    attempt,
                    exc,
                    delay,
                )
                await self._sleep(delay)  # a signal sets `_wake`: it ends the wait at once
                if self._stopping:
                    return False
                delay, attempt = min(delay * 2, REDIS_WAIT_MAX_S), attempt + 1
            else:
                if attempt > 1:
                    log.info("redis answered after %d attempts", attempt)
                return True

    async def shutdown(self) -> None:
        await self._hand_back()
        running = [t.task for t in self._turns.values() if t.task]
        if running:
            force = asyncio.create_task(self._force_exit.wait())
            await self._wait_running(running, force)
            force.cancel()
            left = [t for t in running if not t.done()]
            if left:
                log.warning("%d turns still running at exit; their leases will expire", len(left))
                for task in left:
                    task.cancel()
                await asyncio.gather(*left, return_exceptions=True)
        if self._farewells:
            await asyncio.wait(self._farewells, timeout=1.0)
        for task in self._background + self._farewells:
            task.cancel()
        await asyncio.gather(*self._background, *self._farewells, return_exceptions=True)
        await self._close_owned()
        await self._close_clients()
        log.info("worker %s stopped", self.worker_id)

    async def _close_clients(self) -> None:
        for client in (self._listen_redis, self.redis, self._commit_redis):
            if client is not None:
                await client.aclose()
        self._listen_redis = self.redis = self._commit_redis = None

    async def _close_owned(self) -> None:
        """Close the HTTP clients of the brain and sender this worker loaded (`aclose()`)."""
        for plugin in self._owned:
            close = getattr(plugin, "aclose", None)
            if close is None:
                continue
            try:
                await close()
            except Exception as exc:
                log.warning("closing %s failed: %r", type(plugin).__name__, exc)

    async def _wait_running(
        self, running: list[asyncio.Task[None]], force: asyncio.Task[bool]
    ) -> None:
        """Wait until every turn ended, the grace period passed, or a second signal came."""
        deadline = asyncio.get_running_loop().time() + self.settings.shutdown_grace_s
        pending: set[asyncio.Task[Any]] = set(running)
        while pending and not force.done():
            timeout = deadline - asyncio.get_running_loop().time()
            if timeout <= 0:
                return
            _, pending_now = await asyncio.wait(
                [*pending, force], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            pending = {t for t in pending_now if t is not force}

    # --- main loop ------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return 0 if self._stopping else self.settings.worker_concurrency - len(self._turns)

    async def main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        self._next_sweep = 0.0
        while not self._stopping:
            self._wake.clear()
            now = loop.time()
            todo: set[str] = set()
            unserved: set[str] = set()
            try:
                if self._sweep_forced or now >= self._next_sweep:
                    # Both set before the await: a sweep asked for meanwhile must survive it.
                    forced = self._sweep_forced or self._deaf
                    self._sweep_forced = False
                    self._next_sweep = now + self.settings.poll_interval_s
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
                    await self._hand_off(unserved)
            except (RedisError, OSError) as exc:
                log.warning("redis unavailable in main loop: %s", exc)
                self._dirty |= todo | unserved  # look at them again, not only at the next sweep
                await self._sleep(min(1.0, self.settings.poll_interval_s))
                continue
            if self.free_slots > 0:
                # After the claims, so that a hand-off is taken for a slot still free.
                self.wakeups.slots_free()
            await self._sleep(self._sleep_time(self._next_sweep))

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass

    def _sleep_time(self, next_sweep: float) -> float:
        if self._dirty:
            return 0.0
        until = next_sweep
        if self._next_wake:  # with no free slot too: it is then handed off
            until = min(until, min(self._next_wake.values()))
        return until - asyncio.get_running_loop().time()

    async def _safety_sweep(self, forced: bool) -> None:
        """Claim for every registered tenant that has something to do now (`forced`: that
        has anything at all); wake the fleet for those still due once this worker's slots
        are full. Unless `forced`, only the worker holding the fleet's sweep guard for this
        interval sweeps."""
        loop = asyncio.get_running_loop()
        try:
            if not forced and not await self.sweep.my_turn():
                return
            started = loop.time()
            registered = await self.sweep.registered()
            live = await self.sweep.live(registered)
            # A sweep of its own also learns every due time and lease end (see Sweep).
            tenants = set(live) if forced else await self.sweep.needing_a_look(live)
        except BaseException:
            self._sweep_forced |= forced  # a forced sweep must still happen
            raise
        self._warn_if_slow(loop.time() - started, len(registered))
        if not tenants:
            return
        log.debug("sweep: %d tenants need a look", len(tenants))
        unserved = self._unserved(await self._visit(tenants))
        if unserved:
            await self._hand_off(unserved)

    def _warn_if_slow(self, took_s: float, tenants: int) -> None:
        """A probe taking much of the interval makes sweeps overlap: say so, once a minute."""
        interval = self.settings.poll_interval_s
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
        claims = await asyncio.gather(*(self._claim(t, share) for t in ordered))
        ready = []
        for tenant, claim in zip(ordered, claims, strict=True):
            self._apply(tenant, claim)
            if _still_due(claim):
                ready.append((claim.next_ms, tenant))
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
        token = f"{self.worker_id}:{next(self._seq)}"
        return await self.store.claim(tenant, max(0, max_batches), token)

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

    # --- turns ----------------------------------------------------------------------------
    def _start_turn(self, batch: Batch, loop_now: float) -> None:
        turn = RunningTurn(batch, lease_deadline=loop_now + self.settings.lease_s)
        self._turns[(batch.tenant, batch.person)] = turn
        turn.task = asyncio.create_task(self._run_turn(turn))

    async def _run_turn(self, turn: RunningTurn) -> None:
        batch = turn.batch
        try:
            await self._execute(batch)
        except asyncio.CancelledError:
            log.warning(
                "turn cancelled tenant=%s batch=%s: it resumes elsewhere after its lease",
                batch.tenant,
                batch.id,
            )
        except Exception:
            log.exception("turn could not be finished tenant=%s batch=%s", batch.tenant, batch.id)
        finally:
            self._turns.pop((batch.tenant, batch.person), None)
            # The finish may have made this tenant due sooner than the wake time we hold
            # (a retry delay, messages that came during the turn): look again at once.
            self._dirty.add(batch.tenant)
            self._wake.set()
            if self._stopping:
                # This process claims nothing more: hand the tenant off, in case the finish
                # made the person's next batch due (now or later).
                self._farewells.append(asyncio.create_task(self._farewell(batch.tenant)))

    async def _execute(self, batch: Batch) -> None:
        s = self.settings
        if batch.handoff is not None:
            # An earlier attempt decided on review and its worker stopped before the finish:
            # finish that review. Running the turn again could send what is not to be sent
            # (a part whose outcome is unknown) or hand the conversation over a second time.
            log.info(
                "finishing the review an earlier attempt began tenant=%s batch=%s reason=%s",
                batch.tenant,
                batch.id,
                batch.handoff.reason,
                extra=_fields(batch, "review"),
            )
            batch.delivery_unknown = batch.handoff.delivery_unknown
            await self._review(batch, batch.handoff.reason, batch.handoff.detail)
            return
        age_ms = batch.claimed_ms - batch.oldest_ts * 1000
        if not batch.requeued and batch.oldest_ts and age_ms > s.review_after_s * 1000:
            _log_review(batch, "too_old")
            await self._review(batch, "too_old", f"oldest message {age_ms / 1000:.0f}s old")
            return
        try:
            reply = await self._reply(batch)
        except NeedsReview as exc:
            _log_review(batch, exc.reason)
            await self._review(batch, exc.reason, exc.detail)
        except LeaseLost:
            log.warning("lease lost mid-turn tenant=%s batch=%s", batch.tenant, batch.id)
        except Exception as exc:
            await self._failed(batch, exc)
        else:
            remember = b""
            # A reply replaced by a template never reached the person: not part of the chat.
            if reply and not batch.template_sent:
                remember = orjson.dumps({"user": batch.user_text, "assistant": reply})
            await self._finish(lambda: self.store.finish_done(batch, remember), batch)
            log.debug("turn done batch=%s", batch.id, extra=_fields(batch, "done"))

    async def _reply(self, batch: Batch) -> str | None:
        """Ask the brain (unless an earlier attempt stored a reply) and send what is not sent.

        The reply is stored on the batch before the first part goes out, and each part the
        provider accepted is recorded with its id, so a resumed or retried turn neither asks
        the AI again nor re-sends an accepted part.
        """
        assert self._brain is not None
        sender = self._senders.get(batch.channel)
        if sender is None:
            raise NeedsReview("no_sender", f"no sender configured for channel {batch.channel!r}")
        reply = batch.reply
        if reply is None:
            begin = getattr(sender, "begin_turn", None)
            if begin is not None:
                await begin(batch)  # read receipt + typing indicator, where the provider has it
            answer = await self._brain.reply(batch)
            if not answer:
                return None
            reply = await self._while_leased(
                lambda: self.store.save_reply(batch, answer), batch, "store the reply"
            )
            if reply is None:
                raise LeaseLost
            batch.reply = reply
        limit = getattr(sender, "max_part_chars", WHATSAPP_MAX_CHARS)
        parts = split_reply(reply, limit)
        batch.parts_total = len(parts)
        batch.note_template = functools.partial(self._note_template, batch)
        for index, part in enumerate(parts):
            if index in batch.sent_parts:
                continue
            asked_ms = int(time.time() * 1000)
            try:
                provider_id = await sender.send(batch, part, index) or ""
            except DeliveryUnknown as exc:
                # Not retried (it may be a second copy), not counted as sent: a person is told.
                batch.delivery_unknown = UnknownDelivery(
                    what=exc.what,
                    part=index,
                    parts_total=len(parts),
                    at_ms=exc.at_ms or asked_ms,
                    error=exc.detail,
                    text=exc.label if exc.what == "template" else part,
                )
                raise NeedsReview(exc.reason, batch.delivery_unknown.sentence()) from exc
            if index == len(parts) - 1:
                # The finish records the last part in the same script call (one call fewer
                # per turn; a crash in between re-sends it, exactly as before recording).
                batch.unrecorded_part = (index, provider_id)
                break
            recorded = await self._while_leased(
                functools.partial(self.store.record_part, batch, index, provider_id),
                batch,
                "record a part",
            )
            if not recorded:
                raise LeaseLost
            batch.sent_parts[index] = provider_id
        return reply

    async def _note_template(self, batch: Batch, sending: bool, part: int) -> None:
        """`Batch.note_template`: persist, under the lease, whether the template went out."""
        noted = await self._while_leased(
            functools.partial(self.store.mark_template, batch, sending, part),
            batch,
            "note a template",
        )
        if not noted:
            raise LeaseLost
        batch.template_sent = sending
        batch.template_part = part if sending else None

    async def _failed(self, batch: Batch, exc: Exception) -> None:
        s = self.settings
        attempts = batch.attempt + 1
        error = f"{type(exc).__name__}: {exc}"
        if attempts >= s.max_attempts:
            log.warning(
                "batch failed %d times, to review tenant=%s batch=%s: %s",
                attempts,
                batch.tenant,
                batch.id,
                error,
                extra=_fields(batch, "review"),
            )
            await self._review(batch, "max_attempts", error)
        else:
            delay = s.retry_base_s * 2 ** (attempts - 1)
            log.warning(
                "turn failed (attempt %d), retry in %.1fs tenant=%s batch=%s: %s",
                attempts,
                delay,
                batch.tenant,
                batch.id,
                error,
                extra=_fields(batch, "retry"),
            )
            await self._finish(lambda: self.store.finish_retry(batch, delay, error), batch)

    async def _review(self, batch: Batch, reason: str, detail: str) -> None:
        """Park the batch for review, after handing the conversation to a person where the
        provider can (Chatwoot). The decision is journaled on the batch first, still under
        the lease (worker/handoff.py): a worker that dies meanwhile leaves the batch to be
        resumed by another, which finishes this same review and hands over at most once."""
        resumed = batch.handoff is not None
        try:
            if batch.handoff is None:
                now_ms = int(time.time() * 1000)
                batch.handoff = HandOff(reason, detail, now_ms, batch.delivery_unknown)
                await self._save_handoff(batch)
            batch.save_handoff = functools.partial(self._save_handoff, batch)
            handoff = await self._hand_over(batch, reason, detail, resumed)
        except LeaseLost:
            log.warning("lease lost during the review tenant=%s batch=%s", batch.tenant, batch.id)
            return
        await self._finish(
            lambda: self.store.finish_review(batch, reason, detail, batch.claimed_ms, handoff),
            batch,
        )

    async def _hand_over(self, batch: Batch, reason: str, detail: str, resumed: bool) -> str:
        """What the review item says of the hand-off: "done", "failed: <error>", "unknown:
        <why>" (best effort: the item is stored either way), or "" where the provider has none
        (WhatsApp). `resumed`: an earlier attempt's worker died after journaling the review.
        Raises LeaseLost if the journal cannot be written any more."""
        assert batch.handoff is not None
        sender = self._senders.get(batch.channel)
        hand_over = getattr(sender, "hand_over", None)
        if hand_over is None:
            return ""
        if resumed and not getattr(sender, "resumes_hand_over", False):
            # It may have told the provider already; at most once, so not again.
            outcome = (
                "unknown: a worker stopped during the hand-off begun at "
                f"{utc(batch.handoff.at_ms)}; it is not repeated"
            )
            batch.handoff.steps["hand_over"] = outcome  # counted with the other unknowns
            return outcome
        try:
            told = await hand_over(batch, reason, detail)
        except LeaseLost:
            raise
        except Exception as exc:
            log.warning(
                "hand-off failed tenant=%s batch=%s: %r",
                batch.tenant,
                batch.id,
                exc,
                extra=_fields(batch, "review"),
            )
            return f"failed: {type(exc).__name__}: {exc}"[:500]
        if isinstance(told, str):
            return told[:500]
        return "done" if told else ""

    async def _save_handoff(self, batch: Batch) -> None:
        """`Batch.save_handoff`: write the review journal on the batch, under the lease."""
        saved = await self._while_leased(
            functools.partial(self.store.save_handoff, batch), batch, "journal the review"
        )
        if not saved:
            raise LeaseLost

    async def _finish(self, call: Callable[[], Awaitable[bool]], batch: Batch) -> None:
        if not await self._while_leased(call, batch, "finish the turn"):
            log.warning("lease lost before finish tenant=%s batch=%s", batch.tenant, batch.id)

    async def _while_leased(self, call: Callable[[], Awaitable[T]], batch: Batch, what: str) -> T:
        """One of the turn's Redis calls; while Redis does not answer, try again for as long as
        the turn holds its lease.

        Giving up at the first error would abandon the turn: it would be resumed after the
        lease and re-send the part the provider accepted but Redis had not recorded yet (the
        chaos suite found this at Redis stalls and restarts). The calls are token-checked
        and idempotent, so repeating one that did run, its answer lost, changes nothing. The
        renewal loop cancels the turn before its lease can end, which also ends the retries.
        """
        delay = 0.05
        while True:
            try:
                return await call()
            # Redis away or slow; an error answer (a script error) would only repeat itself.
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                turn = self._turns.get((batch.tenant, batch.person))
                until = turn.lease_deadline - self._lease_margin_s if turn else 0.0
                if asyncio.get_running_loop().time() + delay >= until:
                    raise
                log.warning(
                    "redis did not %s, retrying within the lease tenant=%s batch=%s: %r",
                    what,
                    batch.tenant,
                    batch.id,
                    exc,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    @property
    def _lease_margin_s(self) -> float:
        """How long before its lease can end in Redis a turn is stopped."""
        return min(1.0, self.settings.lease_s * 0.1)

    # --- wake-ups -------------------------------------------------------------------------
    def _woken(self, tenants: list[str]) -> None:
        """WakeListener: these tenants were taken off a wake-up queue for this worker."""
        self._dirty.update(tenants)
        self._wake.set()

    def _wake_connected(self) -> None:
        # Anything this worker may have missed while it was not connected: sweep now.
        self._deaf = False
        self._sweep_forced = True
        self._listening.set()
        self._wake.set()

    def _wake_lost(self) -> None:
        self._deaf = True

    def _unserved(self, still_due: set[str]) -> set[str]:
        """Of the tenants still due after a visit, those to hand off: all of them once every
        slot is taken. With a slot still free a due conversation could not be claimed for
        another reason (its lock was held); this worker looks again shortly (see `_apply`),
        as handing it on would only move that wait elsewhere."""
        return still_due if self.free_slots <= 0 else set()

    async def _hand_off(self, tenants: set[str]) -> None:
        """Give due conversations this worker cannot start to a worker with a free slot; it
        then holds their due times, so this one forgets them."""
        async with asyncio.timeout(self.settings.redis_timeout_s):
            await add_to_queue(self.redis, self.keys.handoff_queue, tenants)
        for tenant in tenants:
            self._next_wake.pop(tenant, None)
        log.debug("handed off %d tenant(s)", len(tenants))

    async def _hand_back(self) -> None:
        """At shutdown: stop taking wake-ups, and give the fleet what this worker held, the
        tenants it was woken for and not yet visited (new work: any worker takes their events
        in) and those whose due times it alone may know (another worker claims when due)."""
        for task in self._listeners:
            task.cancel()
        await asyncio.gather(*self._listeners, return_exceptions=True)
        self._listeners = []
        if self.redis is None:
            return
        woken, held = set(self._dirty), set(self._next_wake) - self._dirty
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                if woken:
                    await add_to_queue(self.redis, self.keys.wake_queue, woken)
                if held:
                    await add_to_queue(self.redis, self.keys.handoff_queue, held)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not hand %d tenant(s) back: %r", len(woken | held), exc)

    async def _farewell(self, tenant: str) -> None:
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                await add_to_queue(self.redis, self.keys.handoff_queue, [tenant])
        except (RedisError, OSError, TimeoutError) as exc:
            log.info("could not hand tenant=%s off: %r", tenant, exc)

    # --- background loops -----------------------------------------------------------------
    async def _renew_leases(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        # Stop a turn a little before its lease can have ended in Redis.
        margin = self._lease_margin_s
        while True:
            await asyncio.sleep(self._next_renewal_in(margin))
            turns = list(self._turns.values())
            if not turns:
                continue
            started = loop.time()
            by_tenant: dict[str, list[RunningTurn]] = {}
            for turn in turns:
                by_tenant.setdefault(turn.batch.tenant, []).append(turn)
            try:
                results = await asyncio.gather(
                    *(
                        self.store.renew(t, [(x.batch.person, x.batch.token) for x in group])
                        for t, group in by_tenant.items()
                    )
                )
            except (RedisError, OSError) as exc:
                log.warning("lease renewal failed: %s", exc)
            else:
                for group, oks in zip(by_tenant.values(), results, strict=True):
                    for turn, ok in zip(group, oks, strict=True):
                        if ok:
                            turn.lease_deadline = started + s.lease_s
                        elif turn.task and not turn.task.done():
                            log.error(
                                "lease lost tenant=%s batch=%s: stopping the turn",
                                turn.batch.tenant,
                                turn.batch.id,
                            )
                            turn.task.cancel()
            now = loop.time()
            for turn in list(self._turns.values()):
                if now >= turn.lease_deadline - margin and turn.task and not turn.task.done():
                    log.error(
                        "lease about to end unrenewed tenant=%s batch=%s: stopping it",
                        turn.batch.tenant,
                        turn.batch.id,
                    )
                    turn.task.cancel()

    def _next_renewal_in(self, margin: float) -> float:
        delay = self.settings.lease_renew_s
        if self._turns:
            soonest = min(t.lease_deadline for t in self._turns.values())
            delay = min(delay, soonest - margin - asyncio.get_running_loop().time())
        return max(0.05, delay)


def _still_due(claim: Claim) -> bool:
    """A conversation of the tenant is due now (or a lease ended) and was not claimed."""
    return 0 <= claim.next_ms <= claim.now_ms


def _log_review(batch: Batch, reason: str) -> None:
    """The line of a batch going to review (a failed-too-often batch logs its own error)."""
    # A send nobody can confirm is what a person must act on: above INFO.
    log.log(
        logging.WARNING if reason == DELIVERY_UNKNOWN else logging.INFO,
        "batch to review tenant=%s batch=%s reason=%s",
        batch.tenant,
        batch.id,
        reason,
        extra=_fields(batch, "review"),
    )


def _fields(batch: Batch, outcome: str) -> dict[str, str]:
    """Structured log fields of a turn; the person only redacted."""
    return {
        "tenant": batch.tenant,
        "person": redact_person(batch.person),
        "batch": batch.id,
        "outcome": outcome,
    }
