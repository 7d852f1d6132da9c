"""The live state of the fleet, a tenant or one conversation, read from Redis for people.

Read-only and bounded: keys come from shared/keys.py only, conversations are found with SCAN
(never KEYS), long lists are cut at `limit` entries with their full size reported. Times are
Redis's clock (`TIME`), the one the scripts use for due times and leases. Message bodies and
replies are left out unless `with_text` is asked for: this is for finding where a
conversation is stuck, not for reading it.

Everything is returned as plain dicts and lists (JSON-ready); worker/inspect.py prints them.
"""

from __future__ import annotations

from typing import Any

import orjson

from shared.conversation.burst_shards import burst_shard_of
from shared.conversation.review_journal import current_names
from shared.fleet import dispatch_lag, heartbeats, stats_hash, turn_figures, wake
from shared.keys import PENDING, Keys, TenantKeys
from shared.ops import window
from shared.ops.live_rows import batch_row, message_row, review_summary

SCAN_COUNT = 1000


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


async def redis_now_ms(redis: Any) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def fleet(redis: Any, keys: Keys) -> dict[str, Any]:
    """Every registered tenant's queue sizes and main counters, the dead-letter list, the
    wake-up queues and how many workers are connected to them."""
    tenants = sorted(_text(t) for t in await redis.smembers(keys.tenants))
    rows = []
    for tenant in tenants:
        k = keys.tenant(tenant)
        pipe = redis.pipeline(transaction=False)
        pipe.llen(k.inbox)
        pipe.zcard(k.due)
        pipe.zcard(k.running)
        pipe.hlen(k.review)
        pipe.hgetall(k.stats)
        inbox, due, running, review, stats = await pipe.execute()
        counters = _counters(stats)
        rows.append(
            {
                "tenant": tenant,
                "inbox": int(inbox),
                "waiting": int(due),
                "running": int(running),
                "review": int(review),
                "messages": counters.get("messages", 0),
                "turns": counters.get("turns", 0),
                "unknown": sum(_unknown(counters).values()),
            }
        )
    return {
        "now_ms": await redis_now_ms(redis),
        "tenants": rows,
        "workers": await workers(redis, keys),
        "deadletter": int(await redis.llen(keys.deadletter)),
        "workers_listening": await wake.listening_workers(redis, keys),
        "wake_queue": int(await redis.zcard(keys.wake_queue)),
        # With the previous release's queue, drained too during a rolling deploy (remove
        # after one release).
        "relay_queue": int(await redis.zcard(keys.relay_queue))
        + int(await redis.zcard(keys.legacy_relay_queue)),
    }


async def workers(redis: Any, keys: Keys) -> dict[str, Any]:
    """The workers alive by their heartbeats (shared/fleet/heartbeats.py), oldest first, and how
    many dead workers' entries are still there (the live workers delete them)."""
    state = await heartbeats.read(redis, keys.workers)
    return {
        "live": [
            {
                "worker": b.worker,
                "host": b.host,
                "pid": b.pid,
                "started_ms": b.started_ms,
                "up_ms": state.now_ms - b.started_ms,
                "seen_ago_ms": state.now_ms - b.seen_ms,
                "running": b.running,
                "concurrency": b.concurrency,
            }
            for b in state.live
        ],
        "dead_entries": len(state.dead),
    }


async def tenant(redis: Any, keys: Keys, tenant_id: str, limit: int = 50) -> dict[str, Any]:
    """One tenant: inbox, waiting conversations and their due times, running turns and their
    leases, conversations with pending messages, review items, counters."""
    k = keys.tenant(tenant_id)
    now = await redis_now_ms(redis)
    pipe = redis.pipeline(transaction=False)
    pipe.llen(k.inbox)
    pipe.llen(k.unroutable)
    pipe.zcard(k.due)
    pipe.zrange(k.due, 0, limit - 1, withscores=True)
    pipe.zcard(k.running)
    pipe.zrange(k.running, 0, limit - 1, withscores=True)
    pipe.hlen(k.review)
    pipe.hgetall(k.stats)
    inbox, unroutable, n_due, due, n_running, running, n_review, stats = await pipe.execute()
    counters = _counters(stats)
    return {
        "tenant": tenant_id,
        "now_ms": now,
        "registered": bool(await redis.sismember(keys.tenants, tenant_id)),
        "inbox": int(inbox),
        "unroutable": int(unroutable),
        "waiting_total": int(n_due),
        "waiting": [
            {"person": _text(p), "due_ms": int(score), "due_in_ms": int(score) - now}
            for p, score in due
        ],
        "running_total": int(n_running),
        "running": await _running(redis, keys, tenant_id, running, now),
        "pending": await _pending(redis, keys, tenant_id, limit),
        "review_total": int(n_review),
        "review": [review_summary(item) for item in await _review_items(redis, k.review, limit)],
        "counters": counters,
        "deliveries_unknown": _unknown(counters),
        "dispatch_lag": _lag(counters),
    }


async def person(
    redis: Any, keys: Keys, tenant_id: str, person_id: str, with_text: bool = False
) -> dict[str, Any]:
    """One conversation: pending messages, due time, burst, lease, the batch (attempt, last
    error, reply stored, parts sent), the 24-hour window, memory, the bot's silence (Chatwoot),
    a human's pause of the bot (`human`: by, why, since_ms, until_ms; None), and its review
    items."""
    k = keys.tenant(tenant_id)
    now = await redis_now_ms(redis)
    pipe = redis.pipeline(transaction=False)
    pipe.lrange(k.pending(person_id), 0, -1)
    pipe.zscore(k.due, person_id)
    pipe.hget(k.burst_shard(burst_shard_of(person_id)), person_id)
    pipe.hget(k.burst, person_id)  # where the release before kept it (lib/burst.lua)
    pipe.zscore(k.running, person_id)
    pipe.get(k.lock(person_id))
    pipe.pttl(k.lock(person_id))
    pipe.hgetall(k.batch(person_id))
    pipe.llen(k.memory(person_id))
    pipe.get(k.silent(person_id))
    pipe.get(k.human(person_id))
    (
        pending,
        due,
        burst,
        old_burst,
        lease_end,
        token,
        pttl,
        batch,
        memory,
        silent,
        human,
    ) = await pipe.execute()
    (lastin,) = await window.last_inbound(redis, k, [person_id])
    review = [
        item if with_text else review_summary(item)
        for item in await _person_review_items(redis, k, person_id)
    ]
    return {
        "tenant": tenant_id,
        "person": person_id,
        "now_ms": now,
        "pending": [message_row(raw, now, with_text) for raw in pending],
        "due": None if due is None else {"due_ms": int(due), "due_in_ms": int(due) - now},
        "burst": _burst(burst if burst is not None else old_burst),
        "lease": None
        if lease_end is None and token is None
        else {
            "lease_ends_ms": None if lease_end is None else int(lease_end),
            "lease_left_ms": None if lease_end is None else int(lease_end) - now,
            "token": None if token is None else _text(token),
            "lock_ttl_ms": int(pttl) if int(pttl) >= 0 else None,
        },
        "batch": batch_row(batch, now, with_text) if batch else None,
        "window": _window(lastin),
        "memory_exchanges": int(memory),
        # Chatwoot: a person of the business handles the conversation, the bot is silent
        # (shared/lua/lib/silence.lua): why, since_ms, by; None when the bot may speak.
        "silent": _json(silent),
        "human": None if human is None else orjson.loads(human),
        "review": review,
    }


async def _running(
    redis: Any, keys: Keys, tenant_id: str, running: list[Any], now: int
) -> list[dict[str, Any]]:
    k = keys.tenant(tenant_id)
    pipe = redis.pipeline(transaction=False)
    for p, _ in running:
        pipe.get(k.lock(_text(p)))
        pipe.hmget(k.batch(_text(p)), "id", "attempt", "size")
    answers = await pipe.execute() if running else []
    rows = []
    for i, (p, score) in enumerate(running):
        token, (batch_id, attempt, size) = answers[2 * i], answers[2 * i + 1]
        rows.append(
            {
                "person": _text(p),
                "lease_ends_ms": int(score),
                "lease_left_ms": int(score) - now,
                "token": None if token is None else _text(token),
                "batch": None if batch_id is None else _text(batch_id),
                "attempt": int(attempt or 0),
                "messages": int(size or 0),
            }
        )
    return rows


async def _pending(redis: Any, keys: Keys, tenant_id: str, limit: int) -> dict[str, Any]:
    """Conversations holding messages for their next batch, found by SCAN (bounded)."""
    k = keys.tenant(tenant_id)
    people: list[str] = []
    truncated = False
    async for key in redis.scan_iter(match=k.conversations_pattern(PENDING), count=SCAN_COUNT):
        who = k.person_in(_text(key), PENDING)
        if who is None:
            continue
        if len(people) >= limit:
            truncated = True
            break
        people.append(who)
    people.sort()
    pipe = redis.pipeline(transaction=False)
    for who in people:
        pipe.llen(k.pending(who))
        pipe.exists(k.batch(who))
    answers = await pipe.execute() if people else []
    return {
        "truncated": truncated,
        "conversations": [
            {
                "person": who,
                "messages": int(answers[2 * i]),
                "batch_in_flight": bool(answers[2 * i + 1]),
            }
            for i, who in enumerate(people)
        ],
    }


async def _person_review_items(redis: Any, k: TenantKeys, person_id: str) -> list[dict[str, Any]]:
    """The person's review items, oldest first: from the person's index (shared/lua/lib/
    review.lua) when every item is indexed, else (items of the previous release not indexed
    yet: shared/ops/review_index.py) by a scan of the tenant's items."""
    pipe = redis.pipeline(transaction=False)
    pipe.hlen(k.review)
    pipe.hlen(k.review_ix_of)
    pipe.zrange(k.review_ix_person(person_id), 0, -1)
    items_n, indexed_n, members = await pipe.execute()
    if int(items_n) > int(indexed_n):
        return [
            item
            for item in await _review_items(redis, k.review, None)
            if item.get("person") == person_id
        ]
    ids = [_text(m)[17:] for m in members]
    found = await redis.hmget(k.review, ids) if ids else []
    items: list[dict[str, Any]] = []
    for item_id, raw in zip(ids, found, strict=True):
        if raw is None:
            continue
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            item = {"id": item_id, "reason": "(not JSON)", "raw": _text(raw)[:200]}
        items.append(current_names(item) if isinstance(item, dict) else {"id": item_id})
    return items


async def _review_items(redis: Any, key: str, limit: int | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    async for item_id, raw in redis.hscan_iter(key, count=SCAN_COUNT):
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            item = {"id": _text(item_id), "reason": "(not JSON)", "raw": _text(raw)[:200]}
        items.append(current_names(item) if isinstance(item, dict) else {"id": _text(item_id)})
        if limit is not None and len(items) >= limit:
            break
    return sorted(items, key=lambda i: (i.get("reviewed_ms") or 0, str(i.get("id"))))


def _burst(raw: bytes | None) -> dict[str, int] | None:
    if raw is None:
        return None
    first, _, last = _text(raw).partition(",")
    try:
        return {"first_ms": int(first), "last_ms": int(last)}
    except ValueError:
        return None


def _unknown(counters: dict[str, int]) -> dict[str, int]:
    """Sends nobody can confirm, by kind (part, template, note): stats unknown:<kind>."""
    return {name[8:]: n for name, n in counters.items() if name.startswith("unknown:")}


def _window(lastin: tuple[int, int]) -> dict[str, Any]:
    ts, closes_in_s = lastin
    if not ts:
        return {"open": False, "last_inbound_ts": None, "closes_in_s": None}
    return {"open": True, "last_inbound_ts": ts, "closes_in_s": closes_in_s}


def _counters(stats: dict[bytes, bytes]) -> dict[str, int]:
    """The stats hash's counters, without the fields no release adds to any more."""
    counters = stats_hash.counters(stats.items())
    for retired in turn_figures.RETIRED:
        counters.pop(retired, None)
    return dict(sorted(counters.items()))


def _lag(counters: dict[str, int]) -> dict[str, Any]:
    histogram = dispatch_lag.from_stats(counters)
    mean = histogram.sum_s * 1000 / histogram.count if histogram.count else None
    return {"claims": histogram.count, "mean_ms": mean}


def _json(raw: Any) -> dict[str, Any] | None:
    """A JSON object stored as a string, None when absent or unreadable."""
    if raw is None:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def duration(ms: int | float | None) -> str:
    """1234 -> '1.2s', 185000 -> '3m05s', 7800000 -> '2h10m'."""
    if ms is None:
        return "?"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1000:
        return f"{sign}{ms:.0f}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{sign}{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{sign}{hours}h{minutes:02d}m"
