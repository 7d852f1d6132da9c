"""Helpers for the worker tests: inject messages as the receiver does, run and watch workers.

`push_message` is the one way the tests put messages in: the same three steps as the receiver
(SADD the tenant into the registry, the `ingest` script's atomic dedupe + LPUSH, the tenant
added to the new-work wake-up queue). `WorkerFleet` starts real `python -m worker` processes and
always kills them.
The review list, as every directory's tests reach it: `park` puts a batch in review as a worker
would, `in_review` waits for items to land there, `review_items` reads them. `quick_store` is
a ConversationStore whose batches are due at once, for tests that claim by hand; `batch_of`
is a claimed batch built in memory, for code that only reads one.
The recording brain (tests/worker/brains.py) writes one JSON record per turn event to
`record_key(prefix)`; `Records` reads them back.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
from redis.asyncio import Redis

from shared import events
from shared.conversation.batch import Batch, Message
from shared.fleet import wake as shared_wake
from shared.keys import Keys, TenantKeys
from shared.settings import Settings, env_names
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.support.helpers import counters
from worker.conversation_store import ConversationStore

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
TENANT = "106540352242922"
RECORDING_BRAIN = "tests.worker.brains:RecordingBrain"
_SCRIPTS = Scripts()

# Variables of the Settings contract, and those the anthropic SDK reads itself: a developer's
# own environment must not leak into workers. Derived from what Settings.from_env reads.
_CONTRACT_VARS = frozenset(env_names() | {"ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"})


def now_ms() -> int:
    return int(time.time() * 1000)


def record_key(prefix: str) -> str:
    """Where the recording brain writes; outside `<prefix>:*` so keyspace scans ignore it."""
    return f"test:{prefix}:turns"


# --- injecting work, exactly as the receiver does ----------------------------------------------
async def push_message(
    redis: Redis,
    prefix: str,
    person: str,
    message_id: str,
    text: str,
    *,
    tenant: str = TENANT,
    dedupe_ttl_s: int = 3600,
    wake: bool = True,
    **fields: Any,
) -> bool:
    """Store one inbound message like the receiver, received now; True if stored, False if a
    duplicate. `fields`: `message_event`'s `type`, `ts` and `channel`.

    `wake=False` leaves out the wake-up: a lost one, which only the sweep can catch."""
    raw = {"id": message_id, "type": fields.get("type", "text")}
    event = message_event(tenant, person, message_id, text, received_ms=now_ms(), raw=raw, **fields)
    return await _store(redis, prefix, tenant, event, dedupe_ttl_s, wake)


def message_event(
    tenant: str,
    person: str,
    message_id: str,
    text: str,
    *,
    type: str = "text",
    ts: int | None = None,
    channel: str = "whatsapp",
    received_ms: int = 0,
    raw: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An inbound message's event as the receiver writes it (shared/events.py), sent at `ts`
    (now when None); by default one made up whole, received at 0 with nothing raw."""
    return events.message_event(
        channel=channel,
        person=person,
        message_id=message_id,
        type=type,
        text=text,
        ts=int(time.time()) if ts is None else ts,
        received_ms=received_ms,
        raw={} if raw is None else raw,
    )


async def push_status(
    redis: Redis,
    prefix: str,
    person: str,
    message_id: str,
    status: str,
    *,
    tenant: str = TENANT,
    channel: str = "whatsapp",
) -> bool:
    event = events.status_event(
        channel=channel,
        person=person,
        message_id=message_id,
        status=status,
        ts=int(time.time()),
        received_ms=now_ms(),
        raw={"id": message_id, "status": status},
    )
    return await _store(redis, prefix, tenant, event, 3600)


async def ingest_one(
    redis: Redis, k: TenantKeys, event: dict[str, Any], dedupe_ttl_s: int = 3600
) -> bool:
    """Store one event as the receiver does (dedupe marker and inbox push in one script call);
    False if it was a duplicate."""
    (stored,) = await _SCRIPTS.ingest(
        redis,
        k,
        seen=[k.seen(events.dedupe_id(event))],
        dedupe_ttl_s=dedupe_ttl_s,
        events=[events.encode(event)],
    )
    return bool(int(stored))


async def _store(
    redis: Redis,
    prefix: str,
    tenant: str,
    event: dict[str, Any],
    dedupe_ttl_s: int,
    wake: bool = True,
) -> bool:
    keys = Keys(prefix)
    k = keys.tenant(tenant)
    await redis.sadd(keys.tenants, tenant)
    stored = await ingest_one(redis, k, event, dedupe_ttl_s)
    if wake:
        await wake_up(redis, prefix, tenant)
    return stored


async def wake_up(redis: Redis, prefix: str, tenant: str = TENANT) -> None:
    """Tell the fleet a tenant has new work, as the receiver does after a round."""
    await shared_wake.add(redis, Keys(prefix).wake_queue, [tenant])


# --- waiting ----------------------------------------------------------------------------------
async def wait_for(
    probe: Callable[[], Awaitable[T | None]],
    what: str,
    timeout_s: float = 15.0,
    every_s: float = 0.05,
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(every_s)


def run_module(
    module: str,
    *args: str,
    env: dict[str, str],
    timeout_s: float = 30,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m <module> <args>` from the repository's root with exactly `env`, `stdin` as
    its input; what it wrote, as text. A CLI that outlives `timeout_s` fails the test."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


async def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            raise AssertionError(f"worker pid {proc.pid} still running after {timeout_s}s")
        await asyncio.sleep(0.02)
    return int(proc.returncode)


# --- what the recording brain saw -------------------------------------------------------------
@dataclass(frozen=True)
class Turn:
    """One brain call: its start record and, unless it never ended, its last record."""

    start: dict[str, Any]
    last: dict[str, Any] | None

    @property
    def person(self) -> str:
        return str(self.start["person"])

    @property
    def batch(self) -> str:
        return str(self.start["batch"])

    @property
    def ids(self) -> list[str]:
        return list(self.start["ids"])

    @property
    def outcome(self) -> str | None:
        return None if self.last is None else str(self.last["event"])


class Records:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self._redis = redis
        self._key = record_key(prefix)

    async def all(self) -> list[dict[str, Any]]:
        return [json.loads(r) for r in await self._redis.lrange(self._key, 0, -1)]

    async def turns(self, person: str | None = None) -> list[Turn]:
        """Brain calls in start order, pairing each start with the same call's last record."""
        open_: dict[str, dict[str, Any]] = {}
        closed: dict[str, dict[str, Any]] = {}
        for rec in await self.all():
            if person is not None and rec["person"] != person:
                continue
            if rec["event"] == "start":
                open_[rec["call"]] = rec
            else:
                closed[rec["call"]] = rec
        return sorted(
            (Turn(start, closed.get(call)) for call, start in open_.items()),
            key=lambda t: (t.start["ms"], t.start["call"]),
        )

    async def wait_turns(
        self, person: str, count: int, outcome: str | None = "end", timeout_s: float = 15.0
    ) -> list[Turn]:
        """Wait until `person` has `count` turns with `outcome` (None: started), return all."""

        async def probe() -> list[Turn] | None:
            turns = await self.turns(person)
            done = [t for t in turns if outcome is None or t.outcome == outcome]
            return turns if len(done) >= count else None

        return await wait_for(probe, f"{count} turn(s) of {person} ({outcome})", timeout_s)


async def outbox(redis: Redis, prefix: str, tenant: str = TENANT) -> list[dict[str, Any]]:
    """Replies the outbox sender recorded, oldest first."""
    raw = await redis.lrange(Keys(prefix).tenant(tenant).outbox, 0, -1)
    return [json.loads(r) for r in reversed(raw)]


async def review_items(redis: Redis, prefix: str, tenant: str = TENANT) -> list[dict[str, Any]]:
    raw = await redis.hgetall(Keys(prefix).tenant(tenant).review)
    return [json.loads(v) for v in raw.values()]


async def in_review(
    redis: Redis,
    prefix: str,
    *tenants: str,
    count: int = 1,
    what: str = "the batch in review",
    timeout_s: float = 15.0,
) -> list[dict[str, Any]]:
    """Wait until the review lists of `tenants` (TENANT when none) hold `count` items between
    them, and return those. Fails naming `what` at the deadline, and at once if more than
    `count` are there."""

    async def found() -> list[dict[str, Any]] | None:
        items = [i for t in tenants or (TENANT,) for i in await review_items(redis, prefix, t)]
        return items if len(items) >= count else None

    items = await wait_for(found, what, timeout_s)
    assert len(items) == count, f"{len(items)} review items, not {count}, for {what}: {items}"
    return items


async def claim_due_now(
    redis: Redis,
    store: ConversationStore,
    prefix: str,
    person: str,
    token: str,
    *,
    limit: int = 5,
    tenant: str = TENANT,
) -> Batch:
    """Take in what waits in the inbox, make `person`'s batch due now (not after the debounce)
    and claim as a worker whose lock tokens start with `token`; the one batch claimed."""
    await store.claim(tenant, 0, "intake")
    await redis.zadd(Keys(prefix).tenant(tenant).due, {person: 0})
    (batch,) = (await store.claim(tenant, limit, token)).batches
    return batch


def quick_store(redis: Redis, settings: Settings, **overrides: Any) -> ConversationStore:
    """A ConversationStore whose batches are due at once (a 10 ms debounce and wait), for the
    tests that claim batches by hand; `overrides` are more Settings fields."""
    scripts = Scripts()
    return ConversationStore(
        settings.with_overrides(debounce_window_s=0.01, max_wait_s=0.01, **overrides),
        scripts,
        GroupCommitter(redis, scripts),
    )


def windowed_store(
    redis: Redis, settings: Settings, prefix: str, window_ms: int, max_wait_ms: int
) -> ConversationStore:
    """A ConversationStore with this debounce window and cap, a 10 s lease renewed every
    second, for the tests that watch due times."""
    scripts = Scripts()
    s = settings.with_overrides(
        key_prefix=prefix,
        debounce_window_s=window_ms / 1000,
        max_wait_s=max_wait_ms / 1000,
        lease_s=10,
        lease_renew_s=1,
    )
    return ConversationStore(s, scripts, GroupCommitter(redis, scripts))


async def redis_ms(redis: Redis) -> int:
    """Redis's clock in ms, the one due times are on."""
    sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def close_window(redis: Redis, k: TenantKeys, person: str) -> None:
    """Close the person's 24-hour window as time would: its field in every shard of the book of
    windows (shared/lua/lib/lastin.lua) and the key of the release before go."""
    async for key in redis.scan_iter(match=f"{k.lastin_book}*"):
        if key.decode() != k.lastin_gens:
            await redis.hdel(key, person)
    await redis.delete(k.last_inbound(person))


async def park(
    redis: Redis,
    settings: Settings,
    texts: list[str],
    *,
    tenant: str,
    person: str,
    reason: str = "max_attempts",
    error: str = "boom",
    context: Sequence[dict[str, Any]] = (),
) -> str:
    """Store `texts` from `person` (the tenant registered as the receiver registers it), claim
    them as one batch and park it in review as the worker would; the review item's id (the
    batch id). `context`: events the batch takes along, as claim.lua keeps a reaction to an
    answered message. `max_attempts` also pauses the bot for the person
    (shared/ops/takeover.py)."""
    scripts = Scripts()
    await scripts.load(redis)
    keys = Keys(settings.key_prefix)
    k = keys.tenant(tenant)
    await redis.sadd(keys.tenants, tenant)
    for item in context:
        await redis.rpush(k.context(person), orjson.dumps(item))
    for i, text in enumerate(texts):
        event = message_event(tenant, person, f"wamid.{person}.{i}.{time.monotonic_ns()}", text)
        await ingest_one(redis, k, event, dedupe_ttl_s=60)
    store = quick_store(redis, settings)
    await store.claim(tenant, 0, "t")  # intake
    await asyncio.sleep(0.05)  # past the debounce
    claim = await store.claim(tenant, 5, "t")
    (batch,) = claim.batches
    assert await store.finish_review(batch, reason, error, claim.now_ms)
    return batch.id


def batch_of(
    messages: list[Message],
    *,
    tenant: str = TENANT,
    person: str = "5491155550001",
    id: str = "b1",
    claimed_ms: int = 0,
    history: list[dict[str, Any]] | None = None,
) -> Batch:
    """A batch as a first claim hands it over (attempt 0, not requeued), built in memory for
    the code that only reads one: a brain's request, the presentation, a sender."""
    return Batch(
        tenant=tenant,
        person=person,
        id=id,
        token="t",
        attempt=0,
        claimed_ms=claimed_ms,
        due_ms=0,
        requeued=False,
        messages=messages,
        history=history or [],
    )


async def stats(redis: Redis, prefix: str, tenant: str = TENANT) -> dict[str, int]:
    raw = await redis.hgetall(Keys(prefix).tenant(tenant).stats)
    return counters(raw)


async def listening(redis: Redis, prefix: str) -> int:
    """How many workers have their wake-up connection open (i.e. are up)."""
    return await shared_wake.listening_workers(redis, Keys(prefix))


async def scan_keys(redis: Redis, prefix: str) -> list[str]:
    return sorted([_text(k) async for k in redis.scan_iter(match=f"{prefix}:*", count=1000)])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- worker processes -------------------------------------------------------------------------
class WorkerFleet:
    """Starts `python -m worker` processes against the test Redis; `close()` kills them all."""

    def __init__(
        self, redis: Redis, redis_url: str, prefix: str, log_dir: Path, cluster: bool = False
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self._redis_url = redis_url
        self._cluster = cluster
        self._log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def env(self, **overrides: object) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _CONTRACT_VARS}
        env.update(
            REDIS_URL=self._redis_url,
            REDIS_CLUSTER="true" if self._cluster else "false",
            KEY_PREFIX=self.prefix,
            BRAIN=RECORDING_BRAIN,
            DEBOUNCE_WINDOW_S="0.3",
            MAX_WAIT_S="3",
            LEASE_S="5",
            LEASE_RENEW_S="1",
            RETRY_BASE_S="0.2",
            MAX_ATTEMPTS="4",
            SHUTDOWN_GRACE_S="5",
            # Far beyond every test's duration: turns must start from wake-ups and due times,
            # never from the safety sweep.
            POLL_INTERVAL_S="60",
            LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        env.update({k: str(v) for k, v in overrides.items()})
        return env

    async def start(self, count: int = 1, **overrides: object) -> list[subprocess.Popen[bytes]]:
        """Start `count` workers (env overrides by variable name) and wait until listening."""
        started = [self._spawn(self.env(**overrides)) for _ in range(count)]
        await self.wait_listening(sum(1 for p in self.procs if p.poll() is None))
        return started

    def launch(self, **overrides: object) -> subprocess.Popen[bytes]:
        """Start one worker without waiting for it (e.g. while its Redis is still down)."""
        return self._spawn(self.env(**overrides))

    def _spawn(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self._log_dir / f"worker-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    async def wait_listening(self, count: int) -> None:
        """Until `count` processes have their wake-up connection open (i.e. they are up)."""

        async def probe() -> bool:
            for proc in self.procs:
                if proc.poll() is not None and proc.returncode not in (0, -9, -15):
                    raise AssertionError(f"worker exited with {proc.returncode}: {self.dump()}")
            return await listening(self.redis, self.prefix) >= count

        await wait_for(probe, f"{count} worker(s) listening", timeout_s=15)

    def dump(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-6000:]}" for p in self.logs if p.exists())

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not time out
                pass
