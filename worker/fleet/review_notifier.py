"""Being told: the workers POST a signed event for every new review item to
`REVIEW_WEBHOOK_URL` (docs/operating.md#being-told), at least once, retried with backoff.

Where the work comes from. shared/lua/lib/review.lua queues each new item's notification on
its tenant's queue (`review:notify`, due now) in the script that stores the item. A worker
learns which tenants have one due as it learns of conversations:

- the worker whose finish parked the batch looks at that tenant at once (`poke`);
- after each look it holds the tenant's next due notification (a retry's time, or the end of
  another worker's lease on one) and looks again then, as it holds due times of turns;
- the fleet's safety sweep (worker/fleet/sweep.py, every `POLL_INTERVAL_S`) finds a tenant with a
  notification due that nobody looked at (one queued by a status in the claim, a worker that
  died holding it) and puts it on the fleet-wide queue `review:notify`, which every worker
  takes from (`BZPOPMIN`, one worker per entry, as the wake queue); a worker's own sweep at
  start-up learns every tenant's next notification.

Sending. `review_notify_take.lua` takes the due notifications under a lease (timeout + 5 s);
each is POSTed with a timeout and settled by `review_notify_settle.lua`: sent (2xx); retried
after `REVIEW_WEBHOOK_RETRY_S` doubling up to 10 minutes, or the receiver's `Retry-After`
(a network error, 408, 429, 5xx); given up once `REVIEW_WEBHOOK_GIVE_UP_S` have passed since
the item was created, or at once on another answer (3xx, 4xx: resending would not change it).
A worker killed mid-POST never settles: the lease ends and another worker sends it. Given up
is counted (`review_webhook_gave_up`) and logged; the review item stays on the review list.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import secrets
import time
from typing import Any

import httpx
import orjson
from redis.exceptions import RedisClusterException, RedisError

from shared.fleet import wake
from shared.keys import KeyError_, Keys
from shared.ops import review_webhook
from shared.settings import Settings
from shared.storage.scripts import Scripts

log = logging.getLogger(__name__)

# POSTs in flight at once per worker, and notifications one take hands out.
MAX_SENDS = 8
# Tenants looked at at once per worker (a start-up sweep may find thousands).
MAX_LOOKS = 32
# Past the POST's timeout, how long a taker has to settle before another worker may send.
LEASE_MARGIN_S = 5.0
MAX_DELAY_S = 600.0  # the longest wait between two tries (a Retry-After is capped here too)
JITTER = 0.2  # + 0-20 % on each backoff: receivers back from an outage are not hit at once
BLOCK_S = 5.0  # one blocking pop of the fleet queue (see worker/fleet/listeners.py)
RETRY_REDIS_S = 1.0  # a tenant whose look failed on Redis is looked at again after this
# Answers worth trying again: the receiver may be overloaded, down or restarting.
RETRYABLE = frozenset({408, 429})
USER_AGENT = "wa-inbox-review-webhook/1"


class ReviewNotifier:
    """The review webhook's sender of one worker process."""

    def __init__(self, settings: Settings, keys: Keys, scripts: Scripts) -> None:
        self._settings = settings
        self._keys = keys
        self._scripts = scripts
        self._token_prefix = secrets.token_hex(4)
        self._seq = 0
        self._todo: set[str] = set()  # tenants to look at now
        self._next: dict[str, float] = {}  # tenant -> loop time of its next due notification
        self._busy: set[str] = set()  # tenants being looked at by this worker
        self._wake = asyncio.Event()
        self._room = asyncio.Event()  # set when a look ends: the listener may take more
        self._sends = asyncio.Semaphore(MAX_SENDS)
        self._looks: set[asyncio.Task[None]] = set()
        self._redis: Any = None
        self._client: httpx.AsyncClient | None = None
        self._runner: asyncio.Task[None] | None = None

    @property
    def _lease_s(self) -> float:
        return self._settings.review_webhook_timeout_s + LEASE_MARGIN_S

    @property
    def enabled(self) -> bool:
        return bool(self._settings.review_webhook_url)

    def start(self, redis: Any) -> None:
        """Start sending (the loop runs until `stop`); `listen` is started by the worker."""
        self._redis = redis
        self._client = httpx.AsyncClient(
            timeout=self._settings.review_webhook_timeout_s,
            headers={"User-Agent": USER_AGENT},
            follow_redirects=False,
        )
        self._runner = asyncio.create_task(self.run(), name="review-notifier")

    # --- where work comes from ----------------------------------------------------------
    def poke(self, tenant: str) -> None:
        """Look at this tenant's notifications now (a review item was just created)."""
        if self.enabled:
            self._todo.add(tenant)
            self._wake.set()

    async def swept(self, earliest: dict[str, int], now_ms: int, own: bool) -> None:
        """What a sweep found: tenant -> its earliest notification time (Redis clock). A sweep
        of this worker's own (`own`, at start-up) looks at each; the fleet's sweep gives those
        due now to the fleet, any worker may take them."""
        if own:
            for tenant in earliest:
                self.poke(tenant)
            return
        due = [t for t, at in earliest.items() if at <= now_ms]
        if due:
            async with asyncio.timeout(self._settings.redis_timeout_s):
                await wake.add(self._redis, self._keys.review_notify_queue, due)

    async def listen(self, listen_redis: Any) -> None:
        """Take tenants off the fleet queue (a client without socket_timeout); runs until
        cancelled."""
        queue = self._keys.review_notify_queue
        while True:
            # Take only what this worker can start soon: what waits in Redis is any worker's.
            while len(self._busy) + len(self._todo) >= MAX_LOOKS:
                self._room.clear()
                await self._room.wait()
            try:
                async with asyncio.timeout(BLOCK_S + self._settings.redis_timeout_s):
                    tenants = await wake.take(listen_redis, queue, MAX_SENDS, BLOCK_S)
            except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
                log.warning("review notification queue unreachable (%r)", exc)
                await asyncio.sleep(RETRY_REDIS_S)
                continue
            for tenant in tenants:
                try:
                    self._keys.tenant(tenant)
                except KeyError_:
                    log.warning("review notification for %r, not a tenant: dropped", tenant)
                    continue
                self.poke(tenant)

    # --- the loop -----------------------------------------------------------------------
    async def run(self) -> None:
        """Look at each tenant when it is due; runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            now = loop.time()
            due = {t for t, at in self._next.items() if at <= now} | self._todo
            self._todo = set()
            for tenant in sorted(due):
                self._next.pop(tenant, None)
                if tenant in self._busy or len(self._busy) >= MAX_LOOKS:
                    self._todo.add(tenant)  # once its current look (or another) ends
                    continue
                self._busy.add(tenant)
                task = asyncio.create_task(self._look(tenant))
                self._looks.add(task)
                task.add_done_callback(self._looks.discard)
            wait = min(self._next.values(), default=now + 60.0) - now
            if wait <= 0:
                await asyncio.sleep(0)
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        """At shutdown: stop sending (a notification in flight is sent again by another
        worker after its lease) and give the fleet every tenant this worker held."""
        held = set(self._next) | self._busy | self._todo
        for task in [*self._looks, *([self._runner] if self._runner else [])]:
            task.cancel()
        await asyncio.gather(*self._looks, return_exceptions=True)
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
        if held and self._redis is not None:
            try:
                async with asyncio.timeout(self._settings.redis_timeout_s):
                    await wake.add(self._redis, self._keys.review_notify_queue, held)
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning(
                    "could not hand over %d tenant(s)' review notifications: %r", len(held), exc
                )

    def _after(self, tenant: str, seconds: float) -> None:
        at = asyncio.get_running_loop().time() + max(seconds, 0.0)
        self._next[tenant] = min(at, self._next.get(tenant, at))
        self._wake.set()

    async def _look(self, tenant: str) -> None:
        """Send what is due for the tenant, then hold its next due time."""
        try:
            while True:
                now_ms, next_ms, taken = await self._take(tenant)
                if not taken:
                    break
                await asyncio.gather(*(self._deliver(tenant, i, e, now_ms) for i, e in taken))
            if next_ms >= 0:
                self._after(tenant, max((next_ms - now_ms) / 1000, 0.05))
        except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
            log.warning("review notifications of tenant=%s: redis failed (%r)", tenant, exc)
            self._after(tenant, RETRY_REDIS_S)
        except Exception:  # a bug must not stop the loop, nor the tenant's other events
            log.exception("review notifications of tenant=%s failed", tenant)
            self._after(tenant, self._lease_s)
        finally:
            self._busy.discard(tenant)
            self._room.set()
            if self._todo:  # this tenant again, or one waiting for room
                self._wake.set()

    async def _take(self, tenant: str) -> tuple[int, int, list[tuple[str, bytes]]]:
        self._seq += 1
        async with asyncio.timeout(self._settings.redis_timeout_s):
            row = await self._scripts.review_notify_take(
                self._redis,
                self._keys.tenant(tenant),
                most=MAX_SENDS,
                lease_ms=int(self._lease_s * 1000),
                token=f"{self._token_prefix}:{self._seq}",
            )
        flat = row[2:]
        taken = [(_text(flat[i]), _bytes(flat[i + 1])) for i in range(0, len(flat), 2)]
        return int(row[0]), int(row[1]), taken

    async def _deliver(self, tenant: str, item_id: str, raw: bytes, now_ms: int) -> None:
        """POST one notification and settle it."""
        s = self._settings
        note = orjson.loads(raw)
        created_ms, attempts = int(note["created_ms"]), int(note["attempts"])
        give_up_ms = s.review_webhook_give_up_s * 1000
        started = time.monotonic()
        # The last try is made at the bound; one taken later than that (its senders kept
        # dying with it: each lease ran out) is given up without another.
        if now_ms - created_ms >= give_up_ms + self._lease_s * 1000:
            last = str(note.get("error") or "no answer before the last lease ended")
            log.warning(
                "review event given up tenant=%s item=%s attempts=%d: %s",
                *(tenant, item_id, attempts - 1, last),
            )
            await self._settle(tenant, item_id, note, "gave_up", 0, last)
            return
        body = review_webhook.body_of(
            review_webhook.event(tenant, orjson.loads(note["item"]), created_ms)
        )
        async with self._sends:
            error, retryable, asked_s = await self._post(body)
        if error is None:
            log.info("review event sent tenant=%s item=%s attempt=%d", tenant, item_id, attempts)
            await self._settle(tenant, item_id, note, "sent", 0, "")
            return
        elapsed_ms = now_ms - created_ms + (time.monotonic() - started) * 1000
        if not retryable or elapsed_ms >= give_up_ms:
            log.warning(
                "review event given up tenant=%s item=%s attempts=%d after %.0fs: %s",
                *(tenant, item_id, attempts, elapsed_ms / 1000, error),
            )
            await self._settle(tenant, item_id, note, "gave_up", 0, error)
            return
        wait_s = backoff_s(s.review_webhook_retry_s, attempts) if asked_s is None else asked_s
        # The last try comes at the bound, not after it.
        delay_ms = int(min(wait_s, MAX_DELAY_S) * 1000)
        delay_ms = int(min(delay_ms, give_up_ms - elapsed_ms))
        log.info(
            "review event not delivered tenant=%s item=%s attempt=%d, again in %.1fs: %s",
            *(tenant, item_id, attempts, delay_ms / 1000, error),
        )
        await self._settle(tenant, item_id, note, "retry", delay_ms, error)
        self._after(tenant, delay_ms / 1000)

    async def _post(self, body: bytes) -> tuple[str | None, bool, float | None]:
        """POST the event: (None, ...) when the receiver took it; else what went wrong,
        whether to try again, and the wait the receiver asked for (`Retry-After`), if any."""
        s = self._settings
        assert self._client is not None
        headers = review_webhook.headers(s.review_webhook_secret, int(time.time()), body)
        try:
            response = await self._client.post(s.review_webhook_url, content=body, headers=headers)
        except httpx.HTTPError as exc:  # no connection, a timeout, a broken answer
            return f"{type(exc).__name__}: {exc}"[:500], True, None
        status = response.status_code
        if 200 <= status < 300:
            return None, False, None
        error = f"HTTP {status}: {response.text[:200]}"
        if status in RETRYABLE or status >= 500:
            return error, True, retry_after(response.headers)
        return error, False, None

    async def _settle(
        self, tenant: str, item_id: str, note: dict[str, Any], outcome: str, delay: int, error: str
    ) -> None:
        async with asyncio.timeout(self._settings.redis_timeout_s):
            settled = await self._scripts.review_notify_settle(
                self._redis,
                self._keys.tenant(tenant),
                item_id=item_id,
                token=str(note["token"]),
                outcome=outcome,
                delay_ms=delay,
                error=error[:500],
            )
        if not int(settled):
            log.info("review event tenant=%s item=%s was taken over meanwhile", tenant, item_id)


def retry_after(headers: httpx.Headers, now_s: float | None = None) -> float | None:
    """The seconds a receiver asked us to wait (`Retry-After`: seconds or an HTTP date);
    None when it did not say, or said something unreadable."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        seconds = email.utils.mktime_tz(parsed) - (time.time() if now_s is None else now_s)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_DELAY_S)


def backoff_s(first_s: float, attempts: int) -> float:
    """The wait after failed try number `attempts` (1, 2, ...): doubling, capped, + jitter."""
    wait: float = min(first_s * 2 ** max(attempts - 1, 0), MAX_DELAY_S)
    return wait * (1 + random.random() * JITTER)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
