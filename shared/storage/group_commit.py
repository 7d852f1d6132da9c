"""Group commit: many concurrent callers' Redis commands, one round trip.

Each caller submits its command and awaits its own result. The first caller of a round
schedules a flush; everything submitted until the flush runs goes out in one batch. While a
batch is in flight the next round keeps collecting, so under load each round trip carries
the work of many requests, and each caller still learns only after Redis confirmed *its*
command. With `eager_at`, a round is also written as soon as that many commands wait (on a
second connection while one round is out), so Redis starts on it while the loop turn goes on.
A Redis error fails only the call it hit; a lost connection fails the whole round.

Calls of one bound script whose header ends in a repeated group (finish.lua's `turns`) can
also be grouped (`submit_grouped`): those that meet in a round go as one command, each caller
getting its item of the script's array reply. The command's own cost in Redis (~7.5k
instructions), the values bound once and whatever the script does once per call are then paid
once per round instead of once per caller.

On one server a round is packed in one go by hiredis and sent on a connection held for it
(shared/storage/raw_pipeline.py): redis-py's pipeline packed each command in Python and took a
connection from the pool per round, a third of the worker's CPU per turn
(docs/benchmarks/worker.md). A cluster client routes each command by its keys' slot, so there
a round is a redis-py cluster pipeline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from shared.storage.raw_pipeline import Command, RawPipeline, Sent
from shared.storage.redis_client import is_cluster
from shared.storage.scripts import BoundCall, Scripts, is_noscript

# At most this many calls go in one grouped command: a script runs without a break, so one
# holding a whole round's turns would keep every other client of Redis waiting that long.
MAX_GROUP = 32


class _Grouped:
    """Calls of one bound script waiting in a round, to go as one command: each caller's item
    of the repeated group, and the future that gets that item of the reply. A round answers
    it as it answers a caller's future (`done`, `set_result`, `set_exception`)."""

    __slots__ = ("bound", "futures", "items")

    def __init__(self, bound: BoundCall) -> None:
        self.bound = bound
        self.items: list[tuple[Any, ...]] = []
        self.futures: list[asyncio.Future[Any]] = []

    def command(self) -> Command:
        """The one command for the callers still waiting (one that gave up is left out)."""
        if any(f.done() for f in self.futures):
            live = [(i, f) for i, f in zip(self.items, self.futures, strict=True) if not f.done()]
            self.items = [i for i, _ in live]
            self.futures = [f for _, f in live]
        return self.bound.command({self.bound.rest: self.items})

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def set_result(self, result: Any) -> None:
        """Each caller its element of the command's reply (an error element: its error)."""
        if not isinstance(result, list) or len(result) != len(self.futures):
            self.set_exception(TypeError(f"a grouped call of {len(self.futures)} got {result!r}"))
            return
        for caller, element in zip(self.futures, result, strict=True):
            _deliver(caller, element)

    def set_exception(self, error: BaseException) -> None:
        for caller in self.futures:
            if not caller.done():
                caller.set_exception(error)


# Who a round gives a command's reply to: its caller's future, or a group of calls.
_Receiver = asyncio.Future[Any] | _Grouped


def _deliver(receiver: _Receiver, reply: Any) -> None:
    """A reply to whoever waits for it (an error reply as its error), unless it gave up."""
    if receiver.done():
        return
    if isinstance(reply, Exception):
        receiver.set_exception(reply)
    else:
        receiver.set_result(reply)


class GroupCommitter:
    def __init__(
        self,
        redis: Any,
        scripts: Scripts,
        max_batch: int = 512,
        timeout_s: float | None = None,
        eager_at: int = 0,
        max_in_flight: int = 1,
    ) -> None:
        """`timeout_s` bounds each round. Give such a committer a client without
        `socket_timeout`: redis-py arms a timer per reply when it has one, which cost ~15% of
        the worker's CPU per turn (docs/benchmarks/worker.md); one deadline per round is enough.

        `eager_at` (0: never): once that many commands wait and fewer than `max_in_flight`
        rounds are out, they are written at once, as the submit that made them that many
        returns, instead of when the loop turn's callbacks are all through. Callers woken by
        one round's replies then keep Redis busy while the rest of them run, where a round
        written at the end of the loop turn left Redis idle while the worker ran them all and
        the worker idle while Redis ran the round (on one server only).
        """
        self._timeout_s = timeout_s
        self._redis = redis
        self._raw: RawPipeline | None = None  # made at the first round, on one server
        self._scripts = scripts
        self._max_batch = max_batch
        self._waiting: list[tuple[Command | _Grouped, _Receiver]] = []
        self._calls = 0  # calls waiting: a group's count each
        self._groups: dict[BoundCall, _Grouped] = {}  # grouped calls still open to more
        self._flusher: asyncio.Task[None] | None = None
        self._eager_at = eager_at if eager_at > 0 else max_batch + 1
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._eager: set[asyncio.Task[None]] = set()  # rounds written early, being answered

    def submit(self, command: Command) -> asyncio.Future[Any]:
        """Queue one command (name and arguments); the future gets its reply or error."""
        future = self._queue(command)
        self._dispatch()
        return future

    def submit_grouped(self, bound: BoundCall, item: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Queue one call of `bound` whose repeated group is this one `item`; the calls of the
        same `bound` queued for the same round go as one command (up to `MAX_GROUP`). The future
        gets this item's element of the script's reply (an array, one element per item)."""
        group = self._groups.get(bound)
        if group is None or len(group.items) >= MAX_GROUP:
            group = self._groups[bound] = _Grouped(bound)
            self._waiting.append((group, group))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        group.items.append(item)
        group.futures.append(future)
        self._calls += 1
        self._dispatch()
        return future

    async def run(self, commands: Sequence[Command]) -> list[Any]:
        """Submit several commands and wait for all their replies (raises the first error).
        They go in one round, in order, unless they are more than a round holds."""
        futures = [self._queue(c) for c in commands]
        self._dispatch()
        return list(await asyncio.gather(*futures))

    def _queue(self, command: Command) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((command, future))
        self._calls += 1
        return future

    def _dispatch(self) -> None:
        """Write the waiting commands now when there are enough of them (`eager_at`) and no
        more than a round, else have the flush send them once the loop turn's callbacks are
        through. Grouped calls count one each, as they cost Redis about that much work."""
        if (
            self._eager_at <= self._calls
            and len(self._waiting) <= self._max_batch
            and self._in_flight < self._max_in_flight
        ):
            self._send_eagerly()
        if self._flusher is None and self._waiting:
            self._flusher = asyncio.create_task(self._flush_loop())

    def _send_eagerly(self) -> None:
        """Write the waiting commands now, on a held connection that is idle (else leave them
        to the flush)."""
        raw = self._raw
        if raw is None:
            return
        round_ = self._commands(self._waiting)
        sent = raw.send_now([c for c, _ in round_])
        if sent is None:
            return
        self._waiting, self._calls = [], 0
        self._groups.clear()
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._execute(round_, sent))
        self._eager.add(task)
        task.add_done_callback(self._eager.discard)

    async def _flush_loop(self) -> None:
        try:
            # Yield once so every request already woken in this loop turn joins the round.
            await asyncio.sleep(0)
            while self._waiting:
                taken, self._waiting = (
                    self._waiting[: self._max_batch],
                    self._waiting[self._max_batch :],
                )
                for command, _ in taken:
                    if isinstance(command, _Grouped) and self._groups.get(command.bound) is command:
                        del self._groups[command.bound]
                self._calls = sum(
                    len(c.items) if isinstance(c, _Grouped) else 1 for c, _ in self._waiting
                )
                await self._execute(self._commands(taken))
        finally:
            self._flusher = None

    @staticmethod
    def _commands(
        entries: list[tuple[Command | _Grouped, _Receiver]],
    ) -> list[tuple[Command, _Receiver]]:
        """The round as commands: each group of calls made one."""
        return [(c.command() if isinstance(c, _Grouped) else c, f) for c, f in entries]

    async def _execute(
        self, round_: list[tuple[Command, _Receiver]], sent: Sent | None = None
    ) -> None:
        """Send a round (unless `sent` wrote it already) and give each caller its reply."""
        if sent is None:
            live = [(c, f) for c, f in round_ if not f.done()]  # a caller may have timed out
            self._in_flight += 1
        else:
            live = round_
        try:
            try:
                results = await self._exchange([c for c, _ in live], sent)
            finally:
                self._in_flight -= 1
            if any(is_noscript(r) for r in results):
                # Redis lost its script cache (restart or failover): load and repeat those.
                await self._scripts.load(self._redis)
                again = [i for i, r in enumerate(results) if is_noscript(r)]
                retried = await self._exchange([live[i][0] for i in again])
                for i, r in zip(again, retried, strict=True):
                    results[i] = r
        except Exception as exc:  # the whole round failed: every caller learns it
            for _, future in live:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, receiver), result in zip(live, results, strict=True):
            _deliver(receiver, result)

    async def _exchange(self, commands: list[Command], sent: Sent | None = None) -> list[Any]:
        async with asyncio.timeout(self._timeout_s):
            if sent is not None and self._raw is not None:
                return await self._raw.replies(sent, commands)
            if not is_cluster(self._redis):
                if self._raw is None:
                    self._raw = RawPipeline(self._redis, self._max_in_flight)
                return await self._raw.exchange(commands)
            pipe = self._redis.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))
