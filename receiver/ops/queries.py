"""What the ops page shows, read from Redis: review items across tenants, one conversation.

Read-only. Review items are read with worker/review.py's ReviewList and a conversation's
live state with shared/ops/live_state.py (the same views `wa-review` and `wa-inspect` print);
this module adds what only the page needs: filters and counts across tenants, the memory's
exchanges, the outbound records of what was sent with their delivery statuses, and the AI
pause. Lists are bounded: the page shows `PAGE` items at a time, a conversation's outbox
entries are looked for among the tenant's newest `OUTBOX_LOOK`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.fleet.ai_pause import Pause
from shared.keys import KeyError_, Keys
from shared.ops import audit, live_state, outbound
from shared.ops.review import ReviewError, ReviewList

PAGE = 50
OUTBOX_LOOK = 500
MEMORY_SHOWN = 20
AUDIT_SHOWN = 100
# The age filter's choices: label -> at least this old (seconds).
AGES = {"": 0, "1h": 3600, "1d": 86400, "7d": 7 * 86400}


class NotFound(Exception):
    """An unknown tenant, item or person: the message says which (the page answers 404)."""


class BadFilter(Exception):
    """A filter value the page does not offer (the page answers 400)."""


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


@dataclass
class Overview:
    """One page of review items and the counts a person filters by."""

    items: list[dict[str, Any]]
    matched: int
    by_reason: dict[str, int]
    by_tenant: dict[str, int]
    tenants: list[str]
    now_ms: int
    offset: int
    filters: dict[str, str] = field(default_factory=dict)

    @property
    def next_offset(self) -> int | None:
        after = self.offset + len(self.items)
        return after if after < self.matched else None


async def tenants(redis: Any, keys: Keys) -> list[str]:
    return sorted(_text(t) for t in await redis.smembers(keys.tenants))


async def check_tenant(redis: Any, keys: Keys, tenant: str) -> None:
    try:
        keys.tenant(tenant)
    except KeyError_ as exc:
        raise NotFound(str(exc)) from None
    if not await redis.sismember(keys.tenants, tenant):
        raise NotFound(f"no tenant {tenant!r}: it has never received traffic")


async def check_person(redis: Any, keys: Keys, tenant: str, person: str) -> None:
    """A registered tenant and a person id usable in a key (the person may be unknown)."""
    await check_tenant(redis, keys, tenant)
    try:
        keys.tenant(tenant).pending(person)
    except KeyError_ as exc:
        raise NotFound(str(exc)) from None


async def review_items(
    redis: Any, keys: Keys, review: ReviewList, *, tenant: str = "", reason: str = ""
) -> list[dict[str, Any]]:
    """Every review item of `tenant` (all registered tenants when empty), oldest first, each
    with its `tenant`; only those of `reason` when given."""
    if tenant:
        await check_tenant(redis, keys, tenant)
    chosen = [tenant] if tenant else await tenants(redis, keys)
    pipe = redis.pipeline(transaction=False)
    for t in chosen:
        pipe.hlen(keys.tenant(t).review)
    sizes = await pipe.execute() if chosen else []
    found: list[dict[str, Any]] = []
    for t, size in zip(chosen, sizes, strict=True):
        if int(size):
            found += [{**i, "tenant": t} for i in await review.items(t, reason or None)]
    return sorted(found, key=lambda i: (i.get("reviewed_ms") or 0, i["tenant"], str(i.get("id"))))


async def overview(
    redis: Any,
    keys: Keys,
    review: ReviewList,
    *,
    reason: str = "",
    tenant: str = "",
    age: str = "",
    offset: int = 0,
) -> Overview:
    """The items matching every filter, `PAGE` of them from `offset`; counts per reason (of
    the items matching the tenant and age filters) and per tenant (reason and age)."""
    if age not in AGES:
        raise BadFilter(f"unknown age filter {age!r}; choose one of {', '.join(AGES)}")
    now = await live_state.redis_now_ms(redis)
    cutoff = now - AGES[age] * 1000
    every = [
        i
        for i in await review_items(redis, keys, review)
        if not AGES[age] or (i.get("reviewed_ms") or 0) <= cutoff
    ]
    if tenant:
        await check_tenant(redis, keys, tenant)
    by_reason = Counter(str(i.get("reason")) for i in every if not tenant or i["tenant"] == tenant)
    by_tenant = Counter(i["tenant"] for i in every if not reason or i.get("reason") == reason)
    matched = [
        i
        for i in every
        if (not reason or i.get("reason") == reason) and (not tenant or i["tenant"] == tenant)
    ]
    offset = max(0, offset)
    return Overview(
        items=matched[offset : offset + PAGE],
        matched=len(matched),
        by_reason=dict(sorted(by_reason.items())),
        by_tenant=dict(sorted(by_tenant.items())),
        tenants=await tenants(redis, keys),
        now_ms=now,
        offset=offset,
        filters={"reason": reason, "tenant": tenant, "age": age},
    )


async def item(
    redis: Any, keys: Keys, review: ReviewList, tenant: str, item_id: str
) -> dict[str, Any]:
    await check_tenant(redis, keys, tenant)
    try:
        return {**await review.get(tenant, item_id), "tenant": tenant}
    except ReviewError as exc:
        raise NotFound(str(exc)) from None


async def conversation(redis: Any, keys: Keys, tenant: str, person: str) -> dict[str, Any]:
    """live_state's view of the conversation (with the texts) and what only the page shows:
    the memory's exchanges, what was sent and its statuses, the AI pause, the audit."""
    await check_person(redis, keys, tenant, person)
    state = await live_state.person(redis, keys, tenant, person, with_text=True)
    k = keys.tenant(tenant)
    memory = [_exchange(raw) for raw in await redis.lrange(k.memory(person), -MEMORY_SHOWN, -1)]
    state["memory"] = memory
    in_flight = await _batch_parts(redis, keys, tenant, person) if state["batch"] else []
    state["sent"] = await _sent(redis, keys, tenant, _provider_ids(state, memory) + in_flight)
    state["outbox"] = await _outbox(redis, keys, tenant, person)
    state["human_pause"] = state["human"]  # the bot's pause for the person (shared/takeover)
    known = (
        state["human_pause"]
        or state["pending"]
        or state["batch"]
        or state["lease"]
        or state["due"]
        or state["window"]["open"]
        or memory
        or state["review"]
        or state["outbox"]
    )
    if not known:
        raise NotFound(f"nothing is known of person {person!r} of tenant {tenant!r}")
    state["ai_pause"] = await ai_pause(redis, keys)
    return state


async def ai_pause(redis: Any, keys: Keys) -> dict[str, Any] | None:
    """The fleet's pause of AI calls (worker/brains/ai_pause.py), while it lasts."""
    pause = Pause.parse(await redis.get(keys.ai_paused))
    now = await live_state.redis_now_ms(redis)
    if pause is None or pause.until_ms <= now:
        return None
    return {"until_ms": pause.until_ms, "left_ms": pause.until_ms - now, "why": pause.why}


async def audit_entries(
    redis: Any, keys: Keys, tenant: str | None = None, person: str | None = None
) -> list[audit.Entry]:
    return await audit.entries(redis, keys, limit=AUDIT_SHOWN, tenant=tenant, person=person)


def _exchange(raw: bytes) -> dict[str, Any]:
    try:
        found = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"user": _text(raw)[:500], "assistant": "", "out": []}
    if not isinstance(found, dict):
        return {"user": str(found)[:500], "assistant": "", "out": []}
    out = found.get("out")
    # The files' labels and transcripts are kept beside the text the model read before them
    # (shared/conversation/presentation.py `exchange`): shown with it.
    media = found.get("media")
    notes = [str(n) for n in media if n] if isinstance(media, list) else []
    said = [str(found.get("user") or ""), *notes]
    return {
        "user": "\n".join(s for s in said if s),
        "assistant": str(found.get("assistant") or ""),
        "out": [str(o) for o in out] if isinstance(out, list) else [],
    }


def _provider_ids(state: dict[str, Any], memory: list[dict[str, Any]]) -> list[str]:
    """The provider ids of the parts sent: remembered exchanges, review items' parts."""
    ids = [o for exchange in memory for o in exchange["out"]]
    for review_item in state["review"]:
        sent = review_item.get("parts_sent")
        if isinstance(sent, dict):
            ids += [str(v) for _, v in sorted(sent.items())]
    return ids


async def _batch_parts(redis: Any, keys: Keys, tenant: str, person: str) -> list[str]:
    """The provider ids of the parts of the batch in flight already sent (`part:<i>`)."""
    fields = await redis.hgetall(keys.tenant(tenant).batch(person))
    parts = {_text(n)[5:]: _text(v) for n, v in fields.items() if _text(n).startswith("part:")}
    return [parts[i] for i in sorted(parts, key=lambda i: int(i) if i.isdigit() else 0)]


async def _sent(redis: Any, keys: Keys, tenant: str, ids: list[str]) -> list[dict[str, Any]]:
    ids = list(dict.fromkeys(ids))
    if not ids:
        return []
    found = await outbound.records(redis, keys.tenant(tenant), ids)
    rows = []
    for provider_id, fields in zip(ids, found, strict=True):
        rows.append(
            {
                "id": provider_id,
                "status": fields.get("status", "(record expired)"),
                "part": fields.get("part", ""),
                "batch": fields.get("batch", ""),
                "sent_ms": int(fields.get("sent_ms") or 0) or None,
                "error": fields.get("error", ""),
            }
        )
    return rows


async def _outbox(redis: Any, keys: Keys, tenant: str, person: str) -> list[dict[str, Any]]:
    """What the outbox sender recorded for the person (local runs), newest first."""
    rows = []
    for raw in await redis.lrange(keys.tenant(tenant).outbox, 0, OUTBOX_LOOK - 1):
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("person") == person:
            rows.append(entry)
    return rows[:MEMORY_SHOWN]
