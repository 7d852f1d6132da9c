"""Reading a finished run back: the stand-ins' records as `Call`s, and what Redis still holds."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import orjson

from scripts.chaos_harness.checks import Call, LeftKey
from scripts.chaos_harness.stack import CHATWOOT_TENANT, PREFIX, Stack, decoded
from scripts.chaos_harness.workload import TENANTS, Workload, tokens_in
from scripts.standins.messages_api import last_user_text
from shared.fleet.stats_hash import counters
from shared.keys import (
    BATCH,
    CONTEXT,
    FUNCTIONS,
    HUMAN,
    LASTIN,
    LATE,
    LOCK,
    MEMORY,
    PENDING,
    SENT,
    Keys,
)

CONVERSATION_KINDS = (PENDING, BATCH, LOCK, LASTIN, MEMORY, CONTEXT, HUMAN, SENT, LATE)
# The WhatsApp workload's tenants and the Chatwoot inbox (keys only in `chatwoot_outage`).
ALL_TENANTS = (*TENANTS, CHATWOOT_TENANT)


def calls_from(
    workload: Workload, ai_records: list[dict[str, Any]], graph_records: list[dict[str, Any]]
) -> list[Call]:
    """Every AI request, read receipt and text send, with the person and batch it names."""
    by_phone = workload.by_phone()
    by_wamid = {m.wamid: m for m in workload.messages.values()}
    calls: list[Call] = []
    for record in ai_records:
        body = record.get("body")
        if record.get("kind") != "messages" or not isinstance(body, dict):
            continue
        tokens = tuple(tokens_in(last_user_text(body)))
        if tokens:
            calls.append(_call("ai", tokens[0][0], record, tokens))
    for record in graph_records:
        body = record.get("body")
        if not isinstance(body, dict):
            continue
        kind = record.get("kind")
        if kind == "read":
            message = by_wamid.get(str(body.get("message_id")))
            if message is not None:
                calls.append(_call("read", message.person, record, (message.token,)))
        elif kind in ("text", "template"):
            person = by_phone.get(str(body.get("to")))
            text = str((body.get("text") or {}).get("body", "")) if kind == "text" else ""
            if person is not None:
                calls.append(_call("send", person.index, record, tuple(tokens_in(text)), text))
    return calls


def _call(kind: str, person: int, record: dict[str, Any], tokens: Any, text: str = "") -> Call:
    return Call(
        kind=kind,
        person=person,
        start=float(record["time"]),
        end=record.get("answered"),
        ok=record.get("status") == 200,
        tokens=tokens,
        text=text,
    )


def classify(key: str, keys: Keys) -> tuple[str, str | None]:
    """(kind, person or None) of one of the product's keys, from shared/keys.py's layout."""
    if key == keys.tenants:
        return "tenants", None
    if key == FUNCTIONS:  # the function libraries the workers loaded (server-wide)
        return "functions", None
    if key == keys.deadletter:
        return "deadletter", None
    if key == keys.sweep_guard:
        return "sweep", None
    if key in (keys.ai_paused, keys.ai_probe):
        return "ai_pause", None
    if key == keys.workers:
        return "workers", None
    if key in (keys.chatwoot_catchup_cursor, keys.chatwoot_catchup_resume):
        return "catchup", None
    if key in (keys.chatwoot_catchup_due, keys.chatwoot_catchup_lock):
        return "catchup_guard", None
    if key == keys.chatwoot_catchup_wanted:
        return "catchup_wanted", None
    for tenant in ALL_TENANTS:
        k = keys.tenant(tenant)
        exact = {
            k.inbox: "inbox",
            k.due: "due",
            k.running: "running",
            k.burst: "burst",
            k.review: "review",
            k.outbox: "outbox",
            k.stats: "stats",
            k.unroutable: "unroutable",
            k.users: "users",
            k.conversations: "convs",
        }
        if key in exact:
            return exact[key], None
        if key.startswith(f"{k.burst}:"):  # a shard of the bursts (lib/burst.lua)
            return "burst", None
        if key.startswith(k.review_ix):  # the ops page's index of review items: kept with them
            return "review", None
        if key.startswith((k.seen(""), k.seen_book)):
            return "seen", None
        if key.startswith((k.outbound_prefix, k.outbound_book)):
            return "out", None
        if key.startswith(k.lastin_book):  # the 24-hour windows (a key each before: `lastin`)
            return "lastin", None
        if key.startswith(k.conversation_prefix):
            person, _, kind = key[len(k.conversation_prefix) :].rpartition(":")
            if kind in CONVERSATION_KINDS:
                return kind, person
    return "other", None


async def leftover_keys(stack: Stack) -> tuple[list[LeftKey], dict[str, int]]:
    """Every key of the run (SCAN), classified, with its TTL; and bytes used per kind."""
    redis = stack.redis
    names = [decoded(k) async for k in redis.scan_iter(match=f"{PREFIX}:*", count=1000)]
    ttls: list[int] = []
    sizes: list[int] = []
    for i in range(0, len(names), 500):
        chunk = names[i : i + 500]
        pipe = redis.pipeline(transaction=False)
        for name in chunk:
            pipe.ttl(name)
            pipe.memory_usage(name)
        answers = await pipe.execute()
        ttls += [int(a) for a in answers[0::2]]
        sizes += [int(a or 0) for a in answers[1::2]]
    left: list[LeftKey] = []
    bytes_by_kind: Counter[str] = Counter()
    for name, ttl, size in zip(names, ttls, sizes, strict=True):
        kind, person = classify(name, stack.keys)
        left.append(LeftKey(name, kind, person, ttl))
        bytes_by_kind[kind] += size
    return left, dict(bytes_by_kind)


async def in_flight(stack: Stack) -> Counter[str]:
    """What is still under way, by kind: inbox entries, due/running/burst entries, pending,
    batch and lock keys, and status webhooks the Graph API stand-in has yet to deliver."""
    redis = stack.redis
    found: Counter[str] = Counter()
    for tenant in ALL_TENANTS:
        k = stack.keys.tenant(tenant)
        pipe = redis.pipeline(transaction=False)
        pipe.llen(k.inbox)
        pipe.zcard(k.due)
        pipe.zcard(k.running)
        pipe.hlen(k.burst)
        for kind, n in zip(("inbox", "due", "running", "burst"), await pipe.execute(), strict=True):
            found[kind] += int(n)
        async for name in redis.scan_iter(match=f"{k.burst}:*", count=1000):
            found["burst"] += int(await redis.hlen(name))  # its shards (lib/burst.lua)
        async for name in redis.scan_iter(match=f"{k.conversation_prefix}*", count=1000):
            kind = decoded(name).rpartition(":")[2]
            if kind in (PENDING, BATCH, LOCK):
                found[kind] += 1
    state = await stack.graph_state()
    found["status_webhooks"] = int(state.get("pending_webhooks", 0))
    if stack.chatwoot:  # a catch-up asked for and not yet run, webhooks the stand-in still posts
        found["catchup_wanted"] = int(await redis.exists(stack.keys.chatwoot_catchup_wanted))
        chatwoot = await stack.chatwoot_state()
        found["chatwoot_webhooks"] = int(chatwoot.get("pending_webhooks", 0))
    return +found  # only what is there


async def drain(stack: Stack, timeout_s: float) -> tuple[float, dict[str, int]]:
    """Wait until nothing is in flight twice in a row: the seconds it took, and what was still
    in flight at the last look (empty unless the timeout ended the wait)."""
    started = time.monotonic()
    quiet = 0
    last: dict[str, int] = {}
    while time.monotonic() - started < timeout_s:
        try:
            last = dict(await in_flight(stack))
        except Exception as exc:  # Redis restarting: keep waiting
            last = {f"error {exc!r}": 1}
        quiet = quiet + 1 if not last else 0
        if quiet >= 2:
            break
        await asyncio.sleep(0.25)
    return time.monotonic() - started, last


async def review_items(stack: Stack) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for tenant in ALL_TENANTS:
        for raw in (await stack.redis.hgetall(stack.keys.tenant(tenant).review)).values():
            items.append(orjson.loads(raw))
    return items


async def stats(stack: Stack) -> dict[str, int]:
    total: Counter[str] = Counter()
    for tenant in ALL_TENANTS:
        raw = await stack.redis.hgetall(stack.keys.tenant(tenant).stats)
        total.update(counters(raw.items()))
    return dict(total)


MEMORY_FIELDS = ("used_memory", "used_memory_dataset", "used_memory_scripts", "mem_clients_normal")


async def memory(stack: Stack) -> dict[str, int]:
    """Redis's own memory figures (INFO memory) that tell data from overhead."""
    info = await stack.redis.info("memory")
    return {name: int(info.get(name, 0)) for name in MEMORY_FIELDS}


async def reloaded_dataset(stack: Stack) -> dict[str, int]:
    """Stop every process, restart Redis from its AOF alone and read what it holds: the data
    the run left, without the buffers and caches a busy server keeps (INFO's used_memory)."""
    await stack.stop_processes()
    await stack.redis_restart(down_s=0.0)
    info = await stack.redis.info("memory")
    return {
        "keys": int(await stack.redis.dbsize()),
        "dataset_bytes": int(info["used_memory_dataset"]),
    }
