"""Run `python -m worker` with candidate optimisations patched in at run time, to size them.

    BENCH_VARIANTS=no_read_timeouts,cached_keys python -m scripts.bench.worker_variants

`scripts/bench_worker --variants no_read_timeouts,...` starts workers this way. Nothing in
worker/ or shared/ is edited: each patch replaces one function in memory, in the benchmark's
worker process only, to measure what the corresponding change to the product would gain.

Variants:
    no_read_timeouts  The group committer's client gets socket_timeout=None and each pipeline
                      runs under one asyncio.timeout(REDIS_TIMEOUT_S) instead: redis-py then
                      stops arming a timer per reply (it does, per command, when
                      socket_timeout is set), while every round trip stays bounded.
    cached_keys       ConversationStore computes each tenant's key names and window once
                      (not a TenantKeys dataclass, _check() and an f-string per key plus two
                      settings lookups on every claim/finish call).
    record_with_finish  Send the record of the reply's last part in the same group-commit round
                      as the turn's finish (record first), instead of one round trip each.
    merged_finish     Prototype: one script call records the reply's last part and finishes the
                      turn (record_part.lua's body ahead of finish.lua's), so a one-part reply
                      costs claim + save_reply + finish instead of four script calls. Only
                      valid for one-part replies (the benchmark's), as a measurement.
                      Obsolete from ee2bffc on: finish.lua records the last part itself (and
                      its patch of Script.queue fits only revisions before named script calls).
    claim_chunk=N     Claim at most N batches per claim call (default: all free slots).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any


def _no_read_timeouts() -> None:
    import shared.storage.group_commit as gc
    import shared.storage.redis_client as rc
    import worker.process as runner

    original_make = rc.make_redis

    def make_redis(settings: Any, **overrides: Any) -> Any:
        overrides.setdefault("socket_timeout", None)
        return original_make(settings, **overrides)

    # The worker's main client, used by the committer. worker.process imported the name, so its
    # own reference is the one to replace (mypy: not a re-export of worker.process, on purpose).
    runner.make_redis = make_redis  # type: ignore[attr-defined]
    timeout_s = float(os.environ.get("REDIS_TIMEOUT_S", "2"))

    async def _pipeline(self: Any, calls: list[Any]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for queue, _ in calls:
            queue(pipe)
        async with asyncio.timeout(timeout_s):
            return list(await pipe.execute(raise_on_error=False))

    # Revisions before the committer packed rounds itself (their `_pipeline`); later ones
    # have no per-reply timers to remove.
    setattr(gc.GroupCommitter, "_pipeline", _pipeline)  # noqa: B010


def _cached_keys() -> None:
    import worker.conversation_store as store

    cls = store.ConversationStore
    tenant_keys: dict[str, Any] = {}
    timing: dict[str, tuple[int, int]] = {}

    class _CachedTenantKeys:
        """A tenant's key names (string properties) computed once; methods pass through."""

        def __init__(self, real: Any) -> None:
            self._real = real

        def __getattr__(self, name: str) -> Any:
            value = getattr(self._real, name)
            if isinstance(value, str):
                self.__dict__[name] = value
            return value

    class _CachedKeys:
        def __init__(self, real: Any) -> None:
            self._real = real

        def tenant(self, tenant: str) -> Any:
            found = tenant_keys.get(tenant)
            if found is None:
                found = tenant_keys[tenant] = _CachedTenantKeys(self._real.tenant(tenant))
            return found

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

    # Revisions from shared/storage/script_settings.py on work the window out once already.
    original_timing: Any = getattr(cls, "_timing", None)
    original_init = cls.__init__

    def _timing(self: Any, tenant: str) -> tuple[int, int]:
        found = timing.get(tenant)
        if found is None:
            found = timing[tenant] = original_timing(self, tenant)
        return found

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.keys = _CachedKeys(self.keys)

    cls.__init__ = __init__  # type: ignore[method-assign]
    if original_timing is not None:
        cls._timing = _timing  # type: ignore[attr-defined]


def _record_with_finish() -> None:
    import worker.conversation_store as store

    cls = store.ConversationStore
    original_record, original_finish = cls.record_part, cls.finish_done
    pending: dict[int, asyncio.Task[bool]] = {}

    async def record_part(self: Any, batch: Any, part: int, provider_id: str) -> bool:
        # Queue the record now, without waiting for its round trip: it runs on the next loop
        # step, ahead of the finish below, so both go out in the same group-commit round, in
        # this order. Both scripts check the lock token, so a lost lease fails them both.
        pending[id(batch)] = asyncio.ensure_future(original_record(self, batch, part, provider_id))
        return True

    async def finish_done(self: Any, batch: Any, *args: Any, **kwargs: Any) -> bool:
        record = pending.pop(id(batch), None)
        if record is not None:
            await asyncio.sleep(0)  # let the record submit first
        done = await original_finish(self, batch, *args, **kwargs)
        if record is not None and not await record:
            return False
        return done

    cls.record_part = record_part  # type: ignore[method-assign]
    cls.finish_done = finish_done  # type: ignore[method-assign]


MERGED_RECORD = """
-- bench prototype: record the reply's last part, then finish (ARGV as finish.lua, plus
-- outbound prefix, part, provider id, TTL appended at the end).
-- uses: lib/keys.lua (conv_key, PENDING, BATCH, LOCK, MEMORY), lib/clock.lua (now_ms)
-- uses: lib/outbound.lua (record_outbound)
do
  local n = #ARGV
  local oprefix, part, pid, ttl = ARGV[n - 3], ARGV[n - 2], ARGV[n - 1], ARGV[n]
  local prefix, person, token = ARGV[1], ARGV[2], ARGV[3]
  if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return 0 end
  if pid ~= '' then
    local bkey = conv_key(prefix, person, BATCH)
    local t = redis.call('TIME')
    local okey = oprefix .. pid
    redis.call('HSET', okey, 'batch', redis.call('HGET', bkey, 'id'), 'person', person,
      'part', part, 'status', 'accepted',
      'sent_ms', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    redis.call('EXPIRE', okey, ttl)
    redis.call('HINCRBY', KEYS[5], 'parts_out', 1)
  end
end
"""


def _merged_finish() -> None:
    import hashlib

    import shared.storage.scripts as scripts
    import worker.conversation_store as store
    from shared.keys import OUTBOUND_TTL_S
    from shared.storage.lua_source import assemble

    finish_src = (scripts.LUA_DIR / "finish.lua").read_text()
    # MERGED_RECORD's header declares what it and finish.lua use.
    source = assemble(MERGED_RECORD.lstrip() + finish_src)
    sha = hashlib.sha1(source.encode()).hexdigest()
    stash: dict[str, list[Any]] = {}  # lock token -> the extra ARGV of the last part

    original_load = scripts.Scripts.load

    async def load(self: Any, redis: Any) -> None:
        await original_load(self, redis)
        await redis.script_load(source)

    original_queue: Any = scripts.Script.queue

    def queue(self: Any, pipe: Any, keys: Any, args: Any) -> None:
        extra = stash.pop(str(args[2]), None) if self.name == "finish" else None
        if extra is None:
            original_queue(self, pipe, keys, args)
        else:
            pipe.evalsha(sha, len(keys), *keys, *args, *extra)

    async def record_part(self: Any, batch: Any, part: int, provider_id: str) -> bool:
        # The reply's last part: recorded by the finish that follows, atomically with it.
        k = self.keys.tenant(batch.tenant)
        stash[batch.token] = [k.outbound_prefix, part, provider_id, OUTBOUND_TTL_S]
        return True

    scripts.Scripts.load = load  # type: ignore[method-assign]
    scripts.Script.queue = queue  # type: ignore[method-assign, assignment]
    store.ConversationStore.record_part = record_part  # type: ignore[method-assign]


def _claim_chunk(n: int) -> None:
    import worker.fleet.scheduler as scheduler

    original = scheduler.Scheduler._claim

    async def _claim(self: Any, tenant: str, max_batches: int) -> Any:
        return await original(self, tenant, min(n, max_batches))

    scheduler.Scheduler._claim = _claim  # type: ignore[method-assign]


def apply(spec: str) -> None:
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, _, value = item.partition("=")
        if name == "no_read_timeouts":
            _no_read_timeouts()
        elif name == "cached_keys":
            _cached_keys()
        elif name == "record_with_finish":
            _record_with_finish()
        elif name == "merged_finish":
            _merged_finish()
        elif name == "claim_chunk":
            _claim_chunk(int(value))
        else:
            raise SystemExit(f"unknown variant {name!r}")


if __name__ == "__main__":
    apply(os.environ.get("BENCH_VARIANTS", ""))
    from worker.__main__ import main

    sys.exit(main())
