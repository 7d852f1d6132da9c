"""What the ops page shows, read from Redis: review items across tenants, one conversation.

Read-only. Review items are read with worker/review.py's ReviewList and a conversation's
live state with shared/ops/live_state.py (the same views `wa-review` and `wa-inspect` print);
this module adds what only the page needs: filters and counts across tenants, the memory's
exchanges, the outbound records of what was sent with their delivery statuses, and the AI
pause. Lists are bounded: the page shows `PAGE` items at a time, read from the review index
(shared/ops/review_index.py) so a view costs the same at any number of items; a
conversation's outbox entries are looked for among the tenant's newest `OUTBOX_LOOK`.
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
from shared.ops.review_index import Cursor, ReviewIndex

PAGE = 50
OUTBOX_LOOK = 500
MEMORY_SHOWN = 20
AUDIT_SHOWN = 100
AUDIT_SCANNED = 5_000  # newest audit entries a conversation's view looks through for its own
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
    position: int  # matching items before the first shown (they are older)
    by_reason: dict[str, int]
    by_tenant: dict[str, int]
    tenants: list[str]
    now_ms: int
    filters: dict[str, str] = field(default_factory=dict)
    filling: list[str] = field(default_factory=list)  # tenants whose old items are being indexed
    older: str = ""  # the cursor of the page before (older items), "" on the first page
    newer: str = ""  # the cursor of the page after (newer items), "" on the last page

    @property
    def shown_from(self) -> int:
        return self.position + 1 if self.items else 0

    @property
    def shown_to(self) -> int:
        return self.position + len(self.items)


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


async def overview(
    redis: Any,
    keys: Keys,
    index: ReviewIndex,
    *,
    reason: str = "",
    tenant: str = "",
    age: str = "",
    after: str = "",
    before: str = "",
) -> Overview:
    """The items matching every filter, `PAGE` of them, oldest first: the first page, or the
    one right after cursor `after` (newer items) or right before `before` (older items); the
    counts per reason (of the items matching the tenant and age filters) and per tenant
    (reason and age). Reads one page of the index and the kept counts, whatever the number
    of items (shared/ops/review_index.py)."""
    if age not in AGES:
        raise BadFilter(f"unknown age filter {age!r}; choose one of {', '.join(AGES)}")
    every = await tenants(redis, keys)
    if tenant and tenant not in every:
        await check_tenant(redis, keys, tenant)  # raises NotFound, saying why
    chosen = [tenant] if tenant else every
    state = await index.state(every)
    filling: list[str] = []
    if state.behind:  # items the previous release parked: index them first (bounded)
        filling = await index.fill_behind(state.behind)
        state = await index.state(every)
    now = state.now_ms
    max_ms = now - AGES[age] * 1000 if AGES[age] else None
    counts = await index.aged(state.counts, max_ms)
    by_reason: Counter[str] = Counter()
    for t in chosen:
        by_reason.update(counts.get(t, {}))
    by_tenant = {t: (n.get(reason, 0) if reason else sum(n.values())) for t, n in counts.items()}
    page = await index.page(
        chosen,
        reason=reason,
        max_ms=max_ms,
        after=Cursor.decode(after) if after else None,
        before=Cursor.decode(before) if before else None,
        size=PAGE,
    )
    return Overview(
        items=page.items,
        matched=page.matched,
        position=page.position,
        by_reason=dict(sorted(by_reason.items())),
        by_tenant={t: n for t, n in sorted(by_tenant.items()) if n},
        tenants=every,
        now_ms=now,
        filters={"reason": reason, "tenant": tenant, "age": age},
        filling=filling,
        older=page.first.encode() if page.has_older and page.first else "",
        newer=page.last.encode() if page.has_newer and page.last else "",
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
    redis: Any,
    keys: Keys,
    tenant: str | None = None,
    person: str | None = None,
    limit: int = AUDIT_SHOWN,
) -> list[audit.Entry]:
    """The newest entries; of one conversation, found among the newest `AUDIT_SCANNED` (the
    log is fleet-wide: a bulk action of 200 000 items would otherwise be read at each view)."""
    scan = AUDIT_SCANNED if person is not None else None
    return await audit.entries(redis, keys, limit=limit, tenant=tenant, person=person, scan=scan)


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
