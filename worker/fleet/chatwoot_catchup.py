"""Chatwoot catch-up: take in, through Chatwoot's API, the messages whose webhook never arrived.

Chatwoot posts an account webhook once, whatever the answer (docs/providers/chatwoot.md), so a
message whose webhook the receiver could not store (Redis down longer than `WEBHOOK_HOLD_S`), or
that never reached a receiver, is only in Chatwoot. The catch-up reads it back from there.

- **Who, when.** One worker of the fleet at a time (`SET cw:catchup:lock NX PX`, renewed while
  it runs, released by its holder: shared/lua/catchup_lease.lua; a holder whose run Redis broke
  off, so that it could not release it, takes it back at once when it is owed the next run).
  A run happens when a receiver asked for one (`cw:catchup:wanted`: tenant -> when its webhook
  could not be stored; receiver/catchup_request.py), when this worker's own Redis calls failed
  and work again, and every `CHATWOOT_CATCHUP_INTERVAL_S` as the safety net (`SET
  cw:catchup:due NX PX interval`: one periodic run per interval fleet-wide).
  `ChatwootCatchUpLoop` polls for these once a second; nothing is added to the webhook's path.
- **What is read, per tenant** (an inbox of an account, `cw-<account>-<inbox>`, with the token
  the sender uses for it). The floor: the tenant's cursor (the last activity already read
  through) less `OVERLAP_S`, lowered to a receiver's request time less the hold and the
  overlap, never below `CHATWOOT_CATCHUP_HORIZON_S` ago. A tenant with neither a cursor nor a
  request starts its cursor now: the catch-up never takes in what came before it first looked.
  Conversations are listed newest activity first, page by page, down to the floor; each listed
  conversation's messages are read newest first (20 a call) down to the floor.
- **What is taken in.** Each message goes through the webhook's parser
  (receiver/providers/chatwoot_history.py): customers' messages and agents' messages from a
  `user` (the silence rules read those), never private notes, activity messages, templates or
  the agent bot's own. They go in through the same ingest script as a webhook, with the same
  dedupe id, so a message the webhook brought is a duplicate here and a webhook coming after
  the catch-up is one there: each message is stored once, answered once.
- **Bounded.** At most `CHATWOOT_CATCHUP_MAX_CALLS` calls a run; a 429 is waited out
  (`Retry-After`, at most `MAX_WAIT_S`, `RATE_LIMIT_TRIES` times), any other failure is counted,
  logged and left to the next run. A tenant's cursor moves only when everything above the floor
  was read; a tenant left unfinished keeps its request, retried after `RETRY_S`, and the next
  run goes on where it stopped (`cw:catchup:resume`).

Figures, in the tenant's stats (wa_catchup_*_total on /metrics): `catchup_runs`, `catchup_ms`
(time spent), `catchup_messages` (new messages taken in), `catchup_api_errors`. One log line
per run.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from receiver.providers.chatwoot_history import parse_message
from shared.chatwoot import TENANT_PREFIX
from shared.fleet import wake
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.scripts import Scripts
from worker.fleet.chatwoot_reader import (
    CONVERSATIONS_PER_PAGE,
    MESSAGES_PER_CALL,
    ChatwootReader,
    RateLimited,
    ReadFailed,
)

log = logging.getLogger(__name__)

OVERLAP_S = 120  # read back this far behind the cursor: clocks, same-second activity
LOCK_MS = 60_000  # the run's lock lives this long unless renewed (a dead holder's ends)
RATE_LIMIT_TRIES = 3  # a call answered 429 this many times ends the tenant's run
DEFAULT_WAIT_S = 5.0  # a 429 without a usable Retry-After
# A call (CHATWOOT_TIMEOUT_S, 15 s), a wait and the renewal's period (LOCK_MS / 4) fit in the
# lock's lease: the lock is renewed before every call.
MAX_WAIT_S = 25.0
RETRY_S = 10.0  # an unfinished request is tried again after this long


@dataclass
class TenantRun:
    tenant: str
    complete: bool = False
    calls: int = 0
    conversations: int = 0
    taken: int = 0
    errors: int = 0
    why: str = ""


@dataclass
class RunReport:
    tenants: list[TenantRun] = field(default_factory=list)
    seconds: float = 0.0
    lost_lock: bool = False

    @property
    def taken(self) -> int:
        return sum(t.taken for t in self.tenants)

    @property
    def unfinished(self) -> list[TenantRun]:
        return [t for t in self.tenants if not t.complete]


class LostLock(Exception):
    """Another worker holds the catch-up's lock now: stop."""


class ChatwootCatchUp:
    """One run of the catch-up over some tenants, by the holder of the lock."""

    def __init__(
        self,
        settings: Settings,
        redis: Any,
        keys: Keys,
        scripts: Scripts,
        reader: ChatwootReader,
        sleep: Any = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self._redis = redis
        self._keys = keys
        self._scripts = scripts
        self._reader = reader
        self._sleep = sleep
        self._token = secrets.token_hex(8)
        self._renewed = 0.0

    @property
    def horizon_s(self) -> float:
        """How far back a run reads: `CHATWOOT_CATCHUP_HORIZON_S`, but never beyond half of
        `DEDUPE_TTL_S`: an older message's marker may be gone, and it would be answered twice."""
        settings = self.settings
        return min(settings.chatwoot_catchup_horizon_s, settings.dedupe_ttl_s / 2)

    # --- the lock -------------------------------------------------------------------------
    async def acquire(self) -> bool:
        """Take the lock, or keep it if this worker holds it still: a run Redis broke off
        could not release it, and this worker is the one owed a run then."""
        got = await self._redis.set(
            self._keys.chatwoot_catchup_lock, self._token, nx=True, px=LOCK_MS
        )
        if not got:
            got = await self._lease(LOCK_MS)
        self._renewed = time.monotonic()
        return bool(got)

    async def release(self, hold_ms: int = 0) -> None:
        """Let the lock go, or (`hold_ms`) hold it that long as nobody's: no run before then,
        this worker's neither."""
        await self._lease(hold_ms, "backoff" if hold_ms else "")

    async def _renew(self) -> None:
        if time.monotonic() - self._renewed < LOCK_MS / 4000:
            return
        if not await self._lease(LOCK_MS):
            raise LostLock
        self._renewed = time.monotonic()

    async def _lease(self, lease_ms: int, hold_as: str = "") -> bool:
        return bool(
            await self._scripts.catchup_lease(
                self._redis,
                None,
                lock=self._keys.chatwoot_catchup_lock,
                token=self._token,
                lease_ms=lease_ms,
                hold_as=hold_as,
            )
        )

    # --- a run ----------------------------------------------------------------------------
    async def run(self, tenants: dict[str, int | None]) -> RunReport:
        """Catch up `tenants` (tenant -> ms a receiver asked from, or None); the caller holds
        the lock."""
        started = time.monotonic()
        report = RunReport()
        budget = [self.settings.chatwoot_catchup_max_calls]
        for tenant in sorted(tenants):
            if not self._reader.token(tenant):
                continue
            one = TenantRun(tenant)
            report.tenants.append(one)
            tenant_started = time.monotonic()
            try:
                await self._tenant(one, tenants[tenant], budget)
            except LostLock:
                report.lost_lock = True
                one.why = "lost the lock"
                break
            finally:
                await self._count(one, time.monotonic() - tenant_started)
        report.seconds = time.monotonic() - started
        return report

    async def _tenant(self, one: TenantRun, asked_ms: int | None, budget: list[int]) -> None:
        now_s = time.time()
        keys = self._keys
        raw = await self._redis.hget(keys.chatwoot_catchup_cursor, one.tenant)
        cursor = int(raw) if raw is not None else None
        resumed = await self._redis.hget(keys.chatwoot_catchup_resume, one.tenant)
        if cursor is None and asked_ms is None and resumed is None:
            # First look at this tenant: start from now, take in nothing from before.
            await self._set_cursor(one.tenant, int(now_s))
            one.complete, one.why = True, "cursor started"
            return
        wanted: list[float] = []
        if cursor is not None:
            wanted.append(cursor - OVERLAP_S)
        if asked_ms is not None:
            wanted.append(asked_ms / 1000 - self.settings.webhook_hold_s - OVERLAP_S)
        top: int | None = None
        position = 0  # in the list, newest activity first: the next conversation to read
        if resumed is not None:
            # A pass a run did not finish: on from where it stopped, down to its floor. The
            # list only moves conversations up to the top, so nothing below that place was
            # skipped (one may be read twice).
            position, old_floor, top = (int(x) for x in resumed.split())
            wanted.append(old_floor)
        floor = max(now_s - self.horizon_s, min(wanted))
        per_page = CONVERSATIONS_PER_PAGE
        while True:
            page = position // per_page + 1
            listed = await self._call(one, budget, self._reader.conversations, one.tenant, page)
            if listed is None:
                await self._resume_later(one.tenant, position, floor, top)
                return
            if top is None and listed:
                top = max(_activity(c) for c in listed)
            for conversation in listed[position % per_page :]:
                if _activity(conversation) < floor:
                    break
                if not await self._conversation(one, conversation, floor, budget):
                    await self._resume_later(one.tenant, position, floor, top)
                    return
                position += 1
            else:
                if len(listed) == per_page:
                    position = page * per_page
                    continue
            break
        # Read through `top`, the newest activity when this pass began: the next pass reads
        # from there (less the overlap), whatever came meanwhile included.
        new_cursor = max(x for x in (cursor, top, int(floor)) if x is not None)
        await self._set_cursor(one.tenant, new_cursor)
        await self._redis.hdel(keys.chatwoot_catchup_resume, one.tenant)
        one.complete = True

    async def _resume_later(
        self, tenant: str, position: int, floor: float, top: int | None
    ) -> None:
        """Where the next run goes on with this pass; its cursor stays where it was. (Stopped
        before the first page was read: the next pass starts afresh.)"""
        if top is not None:
            resume = f"{position} {int(floor)} {top}"
            await self._redis.hset(self._keys.chatwoot_catchup_resume, tenant, resume)

    async def _conversation(
        self, one: TenantRun, conversation: dict[str, Any], floor: float, budget: list[int]
    ) -> bool:
        """Read one conversation's messages down to `floor` and take them in; False when
        the run of this tenant must stop (budget, failure)."""
        conversation_id = conversation.get("id")
        if not isinstance(conversation_id, int):
            return True
        one.conversations += 1
        found: list[dict[str, Any]] = []
        before: int | None = None
        while True:
            messages = await self._call(
                one, budget, self._reader.messages, one.tenant, conversation_id, before
            )
            if messages is None:
                return False
            recent = [m for m in messages if _created(m) >= floor]
            found[:0] = recent
            ids = [m["id"] for m in messages if isinstance(m.get("id"), int)]
            if len(recent) < len(messages) or len(messages) < MESSAGES_PER_CALL or not ids:
                break
            before = min(ids)
        await self._take_in(one, conversation, found)
        return True

    async def _call(self, one: TenantRun, budget: list[int], read: Any, *args: Any) -> Any:
        """One read, counted against the run's budget; a 429 waited out. None: stop."""
        for _ in range(RATE_LIMIT_TRIES):
            await self._renew()
            if budget[0] <= 0:
                one.why = "call budget used up"
                return None
            budget[0] -= 1
            one.calls += 1
            try:
                return await read(*args)
            except RateLimited as exc:
                wait_s = exc.retry_after_s if exc.retry_after_s is not None else DEFAULT_WAIT_S
                log.info("chatwoot catch-up tenant=%s: 429, waiting %.1fs", one.tenant, wait_s)
                await self._sleep(min(wait_s, MAX_WAIT_S))
            except ReadFailed as exc:
                one.errors += 1
                one.why = str(exc)[:200]
                log.warning("chatwoot catch-up tenant=%s: read failed: %s", one.tenant, exc)
                return None
        one.errors += 1
        one.why = "rate limited"
        return None

    async def _take_in(
        self, one: TenantRun, conversation: dict[str, Any], messages: list[dict[str, Any]]
    ) -> None:
        """The messages' events, through the webhook's ingest (same dedupe ids), in order."""
        account = _int(conversation.get("account_id"))
        if account is None:
            account = int(one.tenant[len(TENANT_PREFIX) :].split("-")[0])
        received_ms = int(time.time() * 1000)
        items: dict[str, list[tuple[str, bytes]]] = {}
        for message in sorted(messages, key=lambda m: m.get("id", 0)):
            parsed = parse_message(
                message, conversation, account, received_ms, self.settings.chatwoot_only_pending
            )
            for tenant, batch in parsed.items.items():
                items.setdefault(tenant, []).extend(batch)
        for tenant, batch in items.items():
            tenant_keys = self._keys.tenant(tenant)
            results = await self._scripts.ingest(
                self._redis,
                tenant_keys,
                seen=[tenant_keys.seen(item_id) for item_id, _ in batch],
                dedupe_ttl_s=self.settings.dedupe_ttl_s,
                events=[encoded for _, encoded in batch],
            )
            stored = sum(int(r) for r in results)
            if stored:
                one.taken += stored
                await self._redis.sadd(self._keys.tenants, tenant)
                await wake.add(self._redis, self._keys.wake_queue, [tenant])

    async def _set_cursor(self, tenant: str, cursor: int) -> None:
        await self._redis.hset(self._keys.chatwoot_catchup_cursor, tenant, cursor)

    async def _count(self, one: TenantRun, seconds: float) -> None:
        stats = self._keys.tenant(one.tenant).stats
        pipe = self._redis.pipeline(transaction=False)
        pipe.hincrby(stats, "catchup_runs", 1)
        pipe.hincrby(stats, "catchup_ms", int(seconds * 1000))
        if one.taken:
            pipe.hincrby(stats, "catchup_messages", one.taken)
        if one.errors:
            pipe.hincrby(stats, "catchup_api_errors", one.errors)
        await pipe.execute()


def _activity(conversation: dict[str, Any]) -> int:
    """A listed conversation's last activity (unix s); 0 when it does not say."""
    for name in ("last_activity_at", "timestamp"):
        value = _int(conversation.get(name))
        if value is not None:
            return value
    return 0


def _created(message: dict[str, Any]) -> int:
    value = _int(message.get("created_at"))
    return value if value is not None else 0


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):
        return int(value)
    return None
