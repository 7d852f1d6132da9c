"""The body-read deadline: a webhook whose body is not in `BODY_READ_TIMEOUT_S` after its
headers is cut off (408, connection closed).

Without it a client that sends headers and then trickles a body, or nothing, holds a request
task and what it has read (up to `MAX_BODY_BYTES`) for as long as it likes; a few dozen such
clients held 100 MiB for minutes (issue 21). uvicorn has no such deadline: `--timeout-keep-alive`
only closes connections idle between requests.

A timer per request (`asyncio.timeout`) cost ~7 µs a request under uvloop, several per cent of
the webhook's hot path. Instead a reading request only notes its task and start in a dict, and
one watcher wakes a few times per deadline and cancels the requests that overran: the cut
comes up to a quarter of the deadline late, which is what the deadline is for anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import Receive

# The watcher wakes this often per deadline, within these bounds (seconds).
TICKS_PER_DEADLINE = 4
TICK_BOUNDS_S = (0.01, 1.0)


class BodyTimeout(Exception):
    """The body did not arrive within the deadline."""


async def read_body(receive: Receive, limit: int, first: Any = None) -> bytes | None:
    """The raw body, or None once it exceeds `limit` bytes, whatever Content-Length claims;
    `first`: the request's first message when the caller has already received it."""
    chunks = []
    size = 0
    while True:
        message = await receive() if first is None else first
        first = None
        if message["type"] != "http.request":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class BodyDeadlines:
    """Reads request bodies under one deadline each, watched by one task (`start`/`stop`)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._reading: dict[asyncio.Task[Any], float] = {}  # task -> perf_counter at its start
        self._expired: set[asyncio.Task[Any]] = set()
        self._watcher: asyncio.Task[None] | None = None
        # The loop the watcher runs on: `current_task(loop)` with it skips the running-loop
        # look-up, which on Python 3.11 makes a getpid() system call (fork check) per request.
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watcher = self._loop.create_task(self._watch())

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
            self._loop = None

    async def read(self, receive: Receive, limit: int, started: float) -> bytes | None:
        """`read_body`, cut off `timeout_s` after `started` (`time.perf_counter()`) with
        `BodyTimeout`. Without a running watcher (outside the lifespan) there is no deadline."""
        task = asyncio.current_task(self._loop)
        assert task is not None, "read outside the loop the deadlines were started on"
        self._reading[task] = started
        try:
            # `read_body`'s commonest case inline (the body in one message): one coroutine
            # less per request.
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body: bytes = message.get("body", b"")
                return body if len(body) <= limit else None
            return await read_body(receive, limit, message)
        except asyncio.CancelledError:
            if task not in self._expired:
                raise  # a shutdown's cancel, not ours
            task.uncancel()
            raise BodyTimeout from None
        finally:
            del self._reading[task]
            if self._expired:
                self._expired.discard(task)

    async def _watch(self) -> None:
        low, high = TICK_BOUNDS_S
        tick_s = min(high, max(low, self.timeout_s / TICKS_PER_DEADLINE))
        while True:
            await asyncio.sleep(tick_s)
            if self._reading:
                self._cut_overdue(time.perf_counter() - self.timeout_s)

    def _cut_overdue(self, started_by: float) -> None:
        for task, started in list(self._reading.items()):
            if started <= started_by and task not in self._expired:
                self._expired.add(task)
                task.cancel()
