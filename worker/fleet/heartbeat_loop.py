"""The worker's heartbeat: its entry in `wa:workers`, refreshed every `HEARTBEAT_INTERVAL_S`.

Each beat reads Redis's clock, writes this worker's entry (shared/fleet/heartbeats.py: since when it
runs, turns running, concurrency, host, pid) and deletes the entries of dead workers (silent
for three of their own intervals). A Redis that does not answer costs a beat, logged once
until it answers again; a worker that stops cleanly deletes its own entry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from shared.fleet import heartbeats
from shared.fleet.heartbeats import Beat
from shared.keys import Keys
from shared.settings import Settings

log = logging.getLogger(__name__)

_REDIS_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError)


class Heartbeat:
    def __init__(
        self,
        redis: Any,
        keys: Keys,
        worker_id: str,
        settings: Settings,
        running: Callable[[], int],
    ) -> None:
        self._redis = redis
        self._key = keys.workers
        self._worker_id = worker_id
        self._settings = settings
        self._running = running
        self._started_ms: int | None = None
        self._failing = False

    async def beat_forever(self) -> None:
        """Beat every interval until cancelled."""
        while True:
            try:
                async with asyncio.timeout(self._settings.redis_timeout_s):
                    await self.beat()
            except _REDIS_ERRORS as exc:
                if not self._failing:
                    log.warning("heartbeat not written: %r", exc)
                self._failing = True
            else:
                if self._failing:
                    log.info("heartbeat written again")
                self._failing = False
            await asyncio.sleep(self._settings.heartbeat_interval_s)

    async def beat(self) -> None:
        """Write this worker's entry and delete the dead workers' ones."""
        s = self._settings
        now = await heartbeats.redis_now_ms(self._redis)
        if self._started_ms is None:
            self._started_ms = now
        beat = Beat(
            worker=self._worker_id,
            started_ms=self._started_ms,
            seen_ms=now,
            interval_ms=int(s.heartbeat_interval_s * 1000),
            running=self._running(),
            concurrency=s.worker_concurrency,
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        await self._redis.hset(self._key, self._worker_id, beat.to_json())
        # A dead worker's entry read here could be refreshed before the HDEL only if that
        # worker was silent for three intervals and then beat within this instant; its next
        # beat writes it back.
        dead = (await heartbeats.read(self._redis, self._key)).dead
        if dead:
            await self._redis.hdel(self._key, *dead)
            log.info("heartbeats of %d dead worker(s) removed: %s", len(dead), ", ".join(dead))

    async def remove(self) -> None:
        """At a clean exit: this worker is gone (best effort)."""
        try:
            async with asyncio.timeout(self._settings.redis_timeout_s):
                await self._redis.hdel(self._key, self._worker_id)
        except _REDIS_ERRORS as exc:
            log.info("heartbeat not removed at exit: %r", exc)
