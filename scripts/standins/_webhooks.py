"""`WebhookStandIn`: a stand-in that posts webhooks back to the receiver, as the real service
does (Meta's status webhooks, Chatwoot's `message_created`), and records each delivery.

The posts run as tasks in the stand-in's own server loop on one HTTP client opened with the app
(its lifespan); stopping the app cancels the ones still waiting. `pending_webhooks` counts the
jobs not finished yet, so a test can wait until every delivery was made or given up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import Field, asdict
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import httpx
import orjson
from starlette.applications import Starlette

from scripts.standins._common import F, StandInBase


class Delivery(Protocol):
    """A delivery record: a dataclass (so `asdict` lists it) with the body it posted."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def body(self) -> bytes: ...


D = TypeVar("D", bound=Delivery)

log = logging.getLogger(__name__)


class WebhookStandIn(StandInBase[F], Generic[F, D]):
    """A stand-in with webhook jobs (`_spawn`) and their deliveries (`_deliver`, of type D)."""

    webhook_timeout = 5.0  # seconds per POST

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, seed: int | None = 0) -> None:
        super().__init__(host=host, port=port, seed=seed)
        self._deliveries: list[D] = []
        self._pending_webhooks = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, while it serves

    @property
    def webhook_deliveries(self) -> list[D]:
        """Every webhook POST attempt, oldest first."""
        with self._lock:
            return list(self._deliveries)

    @property
    def pending_webhooks(self) -> int:
        """Webhook jobs still running (delays, retries)."""
        with self._lock:
            return self._pending_webhooks

    def wait_for_webhooks(self, timeout: float = 5.0) -> None:
        """Block until every scheduled webhook was delivered or given up."""
        self.wait_for(lambda: self.pending_webhooks == 0, timeout)

    async def await_webhooks(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        await self.await_for(lambda: self.pending_webhooks == 0, timeout)

    def clear(self) -> None:
        """Forget records and webhook deliveries; webhooks still to come are dropped, and
        requests still waiting (latency, hang) are answered 503."""
        with self._lock:
            super().clear()
            self._deliveries.clear()

    def _listing(self) -> dict[str, Any]:
        with self._lock:
            deliveries = [{**asdict(d), "body": orjson.loads(d.body)} for d in self._deliveries]
            return {**super()._listing(), "webhooks": deliveries}

    # ------------------------------------------------------------------ the jobs

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._http = self._new_client()
        self._loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            self._loop = None
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._http.aclose()
            self._http = None

    def _new_client(self) -> httpx.AsyncClient:
        # No cap on connections: with a capped pool (httpx's default, 100), thousands of status
        # sequences retrying through Redis restarts met PoolTimeout on most attempts and kept
        # the stand-in busy for 40 s, slowing its sends and so every turn (chaos suite).
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
        return httpx.AsyncClient(timeout=self.webhook_timeout, limits=limits)

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:  # the app served without its lifespan
            self._http = self._new_client()
        return self._http

    def _spawn(self, job: Coroutine[Any, Any, None], what: str) -> None:
        """Run `job` (posting one message's webhooks) in the server's loop, counted in
        `pending_webhooks` until it ends; `what` names it in the log if it fails. Called from
        another thread (a test acting as a person in Chatwoot), the job is handed to the
        server's loop."""
        with self._lock:
            self._pending_webhooks += 1
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        server = self._loop
        if server is not None and running is not server:
            server.call_soon_threadsafe(self._start, job, what)
        else:
            self._start(job, what)

    def _start(self, job: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.get_running_loop().create_task(self._run(job, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, job: Coroutine[Any, Any, None], what: str) -> None:
        try:
            await job
        except Exception:
            log.exception("%s: webhook for %s failed", self.name, what)
        finally:
            with self._lock:
                self._pending_webhooks -= 1

    def _deliver(self, delivery: D, generation: int) -> bool:
        """Record one POST attempt; False (not recorded) when a `clear()` came since the job
        was scheduled at `generation`: the job belongs to an earlier test and stops."""
        with self._lock:
            if generation != self._generation:
                return False
            self._deliveries.append(delivery)
            return True
