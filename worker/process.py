"""The worker process: `Worker(settings).run()` = startup, main loop, graceful shutdown.

One process runs at most `WORKER_CONCURRENCY` turns at once. `Worker` wires the pieces and
owns the process's life; each job is a module of its own:

- worker/fleet/scheduler.py: the main loop, which conversations to claim and when (wake-ups, due
  times, the safety sweep, relaying what it cannot serve to the fleet);
- worker/turn/turn.py: one turn, from the brain to the finish, retry or review;
- worker/fleet/leases.py: the running turns' leases, renewed by one loop, a lost one cancelling
  its turn before another worker may take the batch over, so two turns of one person never
  overlap.

Signals only set flags, as in uvicorn: the first stops claiming and lets running turns finish
within `SHUTDOWN_GRACE_S` (leases still renewed, never released early), the second exits at
once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
from collections.abc import Mapping
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from shared.conversation.batch import Batch
from shared.keys import Keys
from shared.logs import log_startup, warn_if_not_persistent
from shared.senders.loading import PlainSender, Sender, load_senders, plugin_of
from shared.settings import Settings
from shared.storage.functions import note_and_prune
from shared.storage.group_commit import GroupCommitter
from shared.storage.redis_client import explain, make_redis
from shared.storage.scripts import Scripts
from worker.brains.ai_pause import AIPause
from worker.brains.loading import Brain, load_brain
from worker.conversation_store import ConversationStore
from worker.fleet.chatwoot_catchup_loop import ChatwootCatchUpLoop, enabled
from worker.fleet.heartbeat_loop import Heartbeat
from worker.fleet.leases import Leases, RunningTurn
from worker.fleet.listeners import WakeListener
from worker.fleet.review_notifier import ReviewNotifier
from worker.fleet.scheduler import Scheduler
from worker.fleet.sweep import Sweep
from worker.turn.turn import Turn, TurnTools

log = logging.getLogger(__name__)
# The turns' group committer (shared/storage/group_commit.py). A round written when the loop
# turn's callbacks were all through (the turns one round's replies woke) made worker and Redis
# take turns: Redis idle while the worker ran them, the worker idle while Redis ran the round
# (`perf sched timehist`: 1.5-3 ms each, in alternation). Written once EAGER_AT commands wait,
# with two rounds out at most, Redis starts on the first turns' commands while the worker runs
# the rest. Alternated (one process, 30 000 turns, docs/benchmarks/worker.md): rounds of 64
# written at the loop turn's end 12 150-13 000 turns/s, written at 32 waiting 14 400-14 900, at
# the same CPU per turn; at 16 (with rounds of 32) no gain, at 48 (rounds of 96) 13 700-14 100.
ROUND_MAX = 64
EAGER_AT = 32
ROUNDS_IN_FLIGHT = 2

# Waiting for Redis at start-up: the first retry after this long, doubling up to the cap.
REDIS_WAIT_FIRST_S = 0.5
REDIS_WAIT_MAX_S = 5.0


class Worker:
    def __init__(
        self,
        settings: Settings,
        *,
        brain: Brain | None = None,
        sender: Sender | PlainSender | None = None,
        senders: Mapping[str, Sender | PlainSender] | None = None,
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
        self._leases = Leases(settings)
        self._scheduler = Scheduler(settings, self.keys, self.worker_id, self._leases)
        self._turn_tools: TurnTools | None = None  # set at start-up
        self._heartbeat: Heartbeat | None = None  # set at start-up
        self.notifier: ReviewNotifier | None = None  # set at start-up, with a review webhook
        self._force_exit = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self._listeners: list[asyncio.Task[None]] = []  # stopped first at shutdown
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
        if self._scheduler.stopping:
            log.warning("second signal: exiting now, running turns resume after their lease")
            self._force_exit.set()
        else:
            log.info("signal %s: no new turns; waiting for %d running", sig, len(self._leases))
        self._scheduler.stop()

    async def startup(self) -> None:
        s = self.settings
        self.redis = make_redis(s)
        self.scripts = Scripts()
        log_startup(log, "worker", s)
        if not await self._wait_for_redis():
            return  # a signal came first: main_loop sees `stopping` and returns at once
        await warn_if_not_persistent(self.redis, s.redis_timeout_s, log)
        # Turn traffic goes through the committer on its own connection pool, bounded per round
        # rather than per reply (see GroupCommitter).
        self._commit_redis = make_redis(s, socket_timeout=None)
        self.committer = GroupCommitter(
            self._commit_redis,
            self.scripts,
            max_batch=ROUND_MAX,
            timeout_s=s.redis_timeout_s,
            eager_at=EAGER_AT,
            max_in_flight=ROUNDS_IN_FLIGHT,
        )
        self.store = ConversationStore(s, self.scripts, self.committer)
        made = ReviewNotifier(s, self.keys, self.scripts)
        notifier = self.notifier = made if made.enabled else None
        self.sweep = Sweep(
            self._commit_redis,
            self.keys,
            self.worker_id,
            s.poll_interval_s,
            s.redis_timeout_s,
            notify=notifier is not None,
        )
        if self._brain is None:
            self._brain = load_brain(s)
            self._owned.append(self._brain)
        brain = self._brain
        given = [self._sender, *self._given_senders.values()]
        self._senders = load_senders(
            s, self.keys, self.committer, self._sender, self._given_senders
        )
        for sender in {id(x): x for x in self._senders.values()}.values():
            if not any(plugin_of(sender) is g for g in given):
                self._owned.append(sender)
        # The listeners block waiting, so no read timeout on their connections (each wait is
        # bounded by WakeListener instead); named, so `CLIENT LIST` shows the worker.
        self._listen_redis = make_redis(
            s, socket_timeout=None, client_name=self.keys.worker_client_name(self.worker_id)
        )
        scheduler = self._scheduler
        self.wakeups = WakeListener(
            self._listen_redis,
            self.keys,
            free_slots=lambda: scheduler.free_slots,
            deliver=scheduler.woken,
            connected=scheduler.wake_connected,
            lost=scheduler.wake_lost,
            timeout_s=s.redis_timeout_s,
        )
        self._turn_tools = TurnTools(
            s,
            self.store,
            brain,
            self._senders,
            self._leases,
            AIPause(self.redis, self.keys, s, self.worker_id),
        )
        scheduler.connect(
            self.redis, self.store, self.sweep, self.wakeups, self._start_turn, notifier
        )
        self._listeners = [
            asyncio.create_task(self.wakeups.new_work(), name="new-work"),
            asyncio.create_task(self.wakeups.relays(), name="relays"),
            # Remove after one release (shared/fleet/wake.py: the rolling deploy of the rename).
            asyncio.create_task(self.wakeups.legacy_relays(), name="legacy-relays"),
        ]
        if notifier is not None:  # being told of review items (worker/fleet/review_notifier.py)
            notifier.start(self.redis)
            self.store.reviewed = notifier.poke
            self._listeners.append(
                asyncio.create_task(notifier.listen(self._listen_redis), name="review-notify")
            )
        self._heartbeat = Heartbeat(self.redis, self.keys, self.worker_id, s, self._leases.__len__)
        self._background = [
            asyncio.create_task(self._leases.renew_forever(self.store), name="renew"),
            asyncio.create_task(self._heartbeat.beat_forever(), name="heartbeat"),
        ]
        if enabled(s):  # messages whose webhook was lost (worker/fleet/chatwoot_catchup.py)
            self.catchup = ChatwootCatchUpLoop(s, self.redis, self.keys, self.scripts)
            self._owned.append(self.catchup)
            self._background.append(
                asyncio.create_task(self.catchup.run_forever(), name="chatwoot-catchup")
            )
        # Connected first, then one sweep of its own (set by the listener) covers everything
        # from before; without the wait the first sweep would run twice.
        try:
            await asyncio.wait_for(scheduler.listening.wait(), s.redis_timeout_s)
        except TimeoutError:
            log.info("wake-up queue not reachable yet; sweeping every interval")
        senders = self._senders
        log.info(
            "worker %s started: concurrency=%d brain=%s senders=%s",
            self.worker_id,
            s.worker_concurrency,
            s.brain,
            ",".join(f"{c}:{type(plugin_of(x)).__name__}" for c, x in sorted(senders.items())),
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
                if self._scheduler.stopping:
                    return False
                log.warning(
                    "redis not reachable at start-up (%s, attempt %d): %s; next try in %.1fs",
                    url,
                    attempt,
                    explain(exc),
                    delay,
                )
                await self._scheduler.sleep(delay)  # a signal ends the wait at once
                if self._scheduler.stopping:
                    return False
                delay, attempt = min(delay * 2, REDIS_WAIT_MAX_S), attempt + 1
            else:
                if attempt > 1:
                    log.info("redis answered after %d attempts", attempt)
                await self._note_functions()
                return True

    async def _note_functions(self) -> None:
        """The fleet's housekeeping of function libraries (shared/storage/functions.py), done by
        each worker as it starts; best effort: a failure only leaves old libraries longer."""
        if not self.scripts.mode.functions:
            return
        try:
            await note_and_prune(self.redis, self.scripts.all())
        except (RedisError, OSError) as exc:
            log.info("function libraries not noted: %r", exc)

    async def shutdown(self) -> None:
        # Stop taking wake-ups first, then give the fleet what this worker held.
        await _cancel_all(self._listeners)
        self._listeners = []
        await self._scheduler.relay_at_shutdown()
        running = self._leases.tasks()
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
        await self._scheduler.end_final_relays()
        if self.notifier is not None:
            await self.notifier.stop()
        await _cancel_all(self._background)
        if self._heartbeat is not None:
            await self._heartbeat.remove()
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

    # --- main loop and turns ---------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return self._scheduler.free_slots

    async def main_loop(self) -> None:
        """Claim and start turns until a signal (worker/fleet/scheduler.py)."""
        await self._scheduler.run()

    def _start_turn(self, batch: Batch, loop_now: float) -> None:
        turn = self._leases.add(batch, loop_now)
        # The loop's own create_task: asyncio.create_task is a Python call more per turn.
        turn.task = asyncio.get_running_loop().create_task(self._run_turn(turn))

    async def _run_turn(self, running: RunningTurn) -> None:
        batch = running.batch
        assert self._turn_tools is not None
        try:
            await Turn(batch, self._turn_tools).run()
        except asyncio.CancelledError:
            log.warning(
                "turn cancelled tenant=%s batch=%s: it resumes elsewhere after its lease",
                batch.tenant,
                batch.id,
            )
        except Exception:
            log.exception("turn could not be finished tenant=%s batch=%s", batch.tenant, batch.id)
        finally:
            self._leases.remove(batch)
            self._scheduler.turn_ended(batch.tenant)


# How long a cancelled task may take to end (its `finally`, e.g. releasing a lock) before it is
# cancelled again.
CANCEL_AGAIN_S = 2.0


async def _cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel these tasks and wait for them to end. One that goes on (on Python 3.11,
    `asyncio.wait_for` loses a cancellation that comes as what it waits for completes, and a
    loop that catches the `TimeoutError` of a timer expiring with it goes round again) is
    cancelled again at its next await, so a shutdown never hangs on it (the tests saw one
    wait forever on the Chatwoot catch-up loop)."""
    for task in tasks:
        task.cancel()
    pending = {task for task in tasks if not task.done()}
    while pending:
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
        for task in pending:
            log.info("task %s still running after its cancellation: cancelled again", task)
            task.cancel()
    for task in tasks:  # their errors were theirs to log; retrieved so asyncio says nothing
        if not task.cancelled():
            task.exception()
