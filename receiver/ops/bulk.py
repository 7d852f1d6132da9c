"""Bulk actions of the ops page: requeue or drop every review item matching a filter, whatever
their number, in the background, and what was done, exactly.

A bulk action is a job, kept in Redis (`wa:ops:bulk:<job>`, a day): its filter, the moment it
was asked (items parked later are not its), how many items matched then, what it did so far
(done, left on the list and why, gone meanwhile), each tenant's cursor in the review index,
its state. The process that took the request runs it (one at a time per job: `…:run`, SET NX
with a lease renewed per chunk), one chunk of `CHUNK` items at a time: one read of the index
page, one script call that acts on the chunk (review_act.lua), one audit round trip naming
each item done, then a short pause so the receiver's webhooks never wait behind it. The web
request that starts it answers at once; the job's page shows its progress (and reloads itself
while it runs: no script). A job whose process ended (a deploy, a crash) or that Redis failed
stops where its cursor is; "Continue" takes it up from there, never acting twice on an item.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from receiver.ops.actions import ActionError
from shared.keys import Keys
from shared.ops import audit
from shared.ops.review import ACTIONS, ReviewList
from shared.ops.review_index import ReviewIndex
from shared.settings import Settings
from shared.storage.redis_client import explain

log = logging.getLogger(__name__)

CHUNK = 100  # items per script call: ~1-2 ms of Redis
PAUSE_S = 0.005  # between chunks: the webhooks' turn
JOB_TTL_S = 86_400
RUN_LEASE_MS = 30_000
REFUSALS_KEPT = 50  # the first reasons items were left, shown on the job's page
VERB = {"requeue": "requeued", "drop": "dropped"}


@dataclass(frozen=True)
class Job:
    id: str
    action: str
    reason: str
    tenant: str
    age: str
    who: str
    started_ms: int
    max_ms: int
    tenants: list[str]
    matched: int
    done: int
    refused: int
    gone: int
    refusals: list[str]
    state: str  # running | finished | stopped
    error: str
    updated_ms: int
    running: bool  # a process holds the job's run lease now

    @property
    def handled(self) -> int:
        return self.done + self.refused + self.gone

    @property
    def verb(self) -> str:
        return VERB.get(self.action, self.action)

    @property
    def stalled(self) -> bool:
        """Running by its record, but no process runs it: it can be continued."""
        return self.state == "running" and not self.running

    @property
    def percent(self) -> int:
        return 100 if not self.matched else min(100, self.handled * 100 // self.matched)


class BulkJobs:
    def __init__(
        self,
        redis: Any,
        keys: Keys,
        review: ReviewList,
        index: ReviewIndex,
        settings: Settings,
        tasks: set[asyncio.Task[None]],
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._review = review
        self._index = index
        self._settings = settings
        self._tasks = tasks  # the process's running jobs, cancelled when it stops

    async def start(
        self,
        who: str,
        action: str,
        reason: str,
        tenant: str,
        tenants: list[str],
        max_ms: int,
        age: str,
    ) -> str:
        """Record the job, audit it, and run it in the background; its id."""
        if action not in ACTIONS:
            raise ActionError(f"unknown bulk action {action!r}")
        if not reason:
            raise ActionError(f"choose a reason to {action} in bulk")
        chosen = [tenant] if tenant else tenants
        counts = await self._index.counts(chosen, max_ms)
        matched = sum(n.get(reason, 0) for n in counts.values())
        if not matched:
            where = f" of tenant {tenant!r}" if tenant else ""
            raise ActionError(f"no review item with reason {reason!r}{where}")
        job = uuid.uuid4().hex[:16]
        now = int(time.time() * 1000)
        key = self._keys.ops_bulk(job)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(
            key,
            mapping={
                "action": action,
                "reason": reason,
                "tenant": tenant,
                "age": age,
                "who": who,
                "started_ms": now,
                "max_ms": max_ms,
                "tenants": orjson.dumps(chosen),
                "matched": matched,
                "done": 0,
                "refused": 0,
                "gone": 0,
                "refusals": b"[]",
                "state": "running",
                "error": "",
                "updated_ms": now,
            },
        )
        pipe.expire(key, JOB_TTL_S)
        await pipe.execute()
        where = f"tenant {tenant}" if tenant else "every tenant"
        await audit.record(
            self._redis,
            self._keys,
            who=who,
            action=f"bulk {action}",
            tenant=tenant,
            detail=f"started job {job}: {matched} {reason} item(s) of {where}",
            retention_s=self._settings.review_retention_s,
        )
        self.run_in_background(job)
        return job

    def run_in_background(self, job: str) -> None:
        task = asyncio.create_task(self.run(job), name=f"ops bulk {job}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def get(self, job: str) -> Job | None:
        key = self._keys.ops_bulk(job)
        pipe = self._redis.pipeline(transaction=False)
        pipe.hgetall(key)
        pipe.exists(self._keys.ops_bulk_run(job))
        raw, running = await pipe.execute()
        if not raw:
            return None
        f = {_text(k): _text(v) for k, v in raw.items()}
        return Job(
            id=job,
            action=f.get("action", ""),
            reason=f.get("reason", ""),
            tenant=f.get("tenant", ""),
            age=f.get("age", ""),
            who=f.get("who", ""),
            started_ms=int(f.get("started_ms") or 0),
            max_ms=int(f.get("max_ms") or 0),
            tenants=orjson.loads(f.get("tenants") or "[]"),
            matched=int(f.get("matched") or 0),
            done=int(f.get("done") or 0),
            refused=int(f.get("refused") or 0),
            gone=int(f.get("gone") or 0),
            refusals=orjson.loads(f.get("refusals") or "[]"),
            state=f.get("state", ""),
            error=f.get("error", ""),
            updated_ms=int(f.get("updated_ms") or 0),
            running=bool(running),
        )

    async def run(self, job_id: str) -> None:
        """Run the job to its end unless another process runs it; a failure stops it with its
        cause recorded (continue it later), nothing is acted on twice."""
        lease = self._keys.ops_bulk_run(job_id)
        token = uuid.uuid4().hex
        try:
            if not await self._redis.set(lease, token, nx=True, px=RUN_LEASE_MS):
                return
            job = await self.get(job_id)
            if job is None or job.state == "finished":
                return
            await self._redis.hset(
                self._keys.ops_bulk(job_id), mapping={"state": "running", "error": ""}
            )
            for tenant in job.tenants:
                await self._run_tenant(job, tenant, lease, token)
            await self._finish(job_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a Redis failure above all: stop, say why, continue later
            log.warning("ops bulk job %s stopped: %s", job_id, explain(exc))
            try:
                await self._redis.hset(
                    self._keys.ops_bulk(job_id),
                    mapping={"state": "stopped", "error": explain(exc)[:500]},
                )
            except Exception:
                # Best effort: without it the job still shows "running" with no runner (its
                # lease lapses in 30 s), which the page shows as stopped, with Continue.
                log.debug("ops bulk job %s: could not mark it stopped", job_id, exc_info=True)
        finally:
            try:
                if await self._redis.get(lease) in (token, token.encode()):
                    await self._redis.delete(lease)
            except Exception:
                # The lease lapses by itself (PX 30 s): Continue works after that.
                log.debug("ops bulk job %s: lease not released", job_id, exc_info=True)

    async def _run_tenant(self, job: Job, tenant: str, lease: str, token: str) -> None:
        key = self._keys.ops_bulk(job.id)
        cursor_field = f"cursor:{tenant}"
        raw = await self._redis.hget(key, cursor_field)
        cursor = _text(raw) if raw else None
        while True:
            items, last = await self._index.chunk(tenant, job.reason, job.max_ms, cursor, CHUNK)
            if last is None:
                return
            outcomes = await self._review.act(job.action, tenant, items)
            done = [o.item for o in outcomes if o.done]
            refused = [o for o in outcomes if not o.done and "removed meanwhile" not in o.why]
            gone = len(outcomes) - len(done) - len(refused)
            await audit.record_many(
                self._redis,
                self._keys,
                [
                    {
                        "who": job.who,
                        "action": job.action,
                        "tenant": tenant,
                        "person": str(item.get("person", "")),
                        "detail": f"item {item.get('id')} ({item.get('reason')}); "
                        f"bulk job {job.id} by reason {job.reason}",
                    }
                    for item in done
                ],
                retention_s=self._settings.review_retention_s,
            )
            await self._progress(job.id, cursor_field, last, len(done), refused, gone, lease, token)
            cursor = last
            await asyncio.sleep(PAUSE_S)

    async def _progress(
        self,
        job: str,
        cursor_field: str,
        last: str,
        done: int,
        refused: list[Any],
        gone: int,
        lease: str,
        token: str,
    ) -> None:
        key = self._keys.ops_bulk(job)
        if refused:
            kept = orjson.loads(await self._redis.hget(key, "refusals") or b"[]")
            room = REFUSALS_KEPT - len(kept)
            kept += [f"{o.item.get('tenant')}/{o.item.get('id')}: {o.why}" for o in refused[:room]]
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(key, mapping={cursor_field: last, "updated_ms": int(time.time() * 1000)})
        if refused:
            pipe.hset(key, "refusals", orjson.dumps(kept))
        pipe.hincrby(key, "done", done)
        pipe.hincrby(key, "refused", len(refused))
        pipe.hincrby(key, "gone", gone)
        pipe.pexpire(lease, RUN_LEASE_MS)
        await pipe.execute()

    async def _finish(self, job_id: str) -> None:
        await self._redis.hset(self._keys.ops_bulk(job_id), "state", "finished")
        job = await self.get(job_id)
        if job is None:
            return
        detail = (
            f"finished job {job.id}: {job.verb} {job.done} of {job.matched} {job.reason} "
            f"item(s), {job.refused} left on the list, {job.gone} gone meanwhile"
        )
        await audit.record(
            self._redis,
            self._keys,
            who=job.who,
            action=f"bulk {job.action}",
            tenant=job.tenant,
            detail=detail,
            retention_s=self._settings.review_retention_s,
        )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
