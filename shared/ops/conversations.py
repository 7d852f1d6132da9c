"""A tenant's conversations as an inbox for people: the list by last activity, search, and the
overview of what waits and runs (one conversation as a thread: shared/ops/thread.py).

Read-only and bounded. The list reads one page of the tenant's index (`wa:{T}:convs`,
shared/conversation/index.py) and, per conversation on it, a few keys in one pipeline; search
looks at the newest `SEARCH_LOOK` conversations only (the page says so); who is in review and
the counts by reason come from the review index (shared/lua/lib/review.lua), or, while items of
the release before are not indexed yet, from reading up to `REVIEW_LOOK` items (the page says
so).

Nothing here sends a request anywhere or decides anything: shared/ops/media.py fetches files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from shared.conversation.kept_files import files_of_event
from shared.fleet.ai_pause import Pause
from shared.keys import Keys, TenantKeys
from shared.ops import live_state
from shared.ops.thread import (
    REVIEW_LOOK,
    customer_name,
    index_id,
    int_of,
    json_of,
    local,
    memory_bubbles,
    str_of,
    text_of,
)

PAGE = 50
# Search looks at this many of the tenant's newest conversations, read this many at a time.
SEARCH_LOOK = 200
SEARCH_CHUNK = 100
SCAN_COUNT = 1000
SNIPPET = 120


def snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET else text[: SNIPPET - 1] + "…"


# --- the list -------------------------------------------------------------------------------------
@dataclass
class Row:
    """One conversation of the list: who, when, what was said last, and its state."""

    person: str
    last_ms: int
    name: str = ""
    last_text: str = ""
    last_by: str = ""  # customer, bot, business
    waiting: int = 0  # messages waiting for the next batch
    due_in_ms: int | None = None  # the debounce: when the waiting messages are due
    running: bool = False  # a turn (or a reply by hand) holds the conversation
    batch: bool = False  # a batch in flight (in a turn, or waiting for a retry)
    paused: dict[str, Any] | None = None  # the bot's pause for the person (by, why, until_ms)
    silent: dict[str, Any] | None = None  # Chatwoot: a person of the business handles it
    review: list[str] = field(default_factory=list)  # the reasons of its review items
    when: str = ""  # last_ms in the tenant's time zone

    @property
    def paused_waiting(self) -> bool:
        """Paused, and the person wrote again: someone has to answer by hand."""
        return bool(self.paused) and self.waiting > 0


@dataclass
class Review:
    """Who is in review, from the tenant's review hash read up to `REVIEW_LOOK` items."""

    by_person: dict[str, list[str]]
    by_reason: dict[str, int]
    read: int
    total: int
    # person -> (reviewed_ms, the last message) of their newest item: a conversation whose
    # batch went to review has its words only there.
    last: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.read >= self.total


@dataclass
class Listing:
    tenant: str
    rows: list[Row]
    total: int  # conversations in the index
    offset: int
    now_ms: int
    review: Review
    query: str = ""
    looked: int = 0  # search: how many of the newest conversations were looked at
    by_number: bool = False  # search: the query was a number (every listed one looked at)

    @property
    def next_offset(self) -> int | None:
        after = self.offset + len(self.rows)
        return after if not self.query and after < self.total else None

    @property
    def previous_offset(self) -> int | None:
        return max(0, self.offset - PAGE) if self.offset > 0 and not self.query else None


async def listing(
    redis: Any, keys: Keys, tenant: str, offset: int = 0, zone: str = "UTC"
) -> Listing:
    """One page of the tenant's conversations, newest activity first, from `offset`."""
    k = keys.tenant(tenant)
    offset = max(0, offset)
    pipe = redis.pipeline(transaction=False)
    pipe.zcard(k.conversations)
    pipe.zrevrange(k.conversations, offset, offset + PAGE - 1, withscores=True)
    total, page = await pipe.execute()
    listed = [(text_of(p), int(ms)) for p, ms in page]
    review = await review_state(redis, k, {person for person, _ in listed})
    now = await live_state.redis_now_ms(redis)
    rows = await _rows(redis, k, listed, now, review, zone)
    return Listing(tenant, rows, int(total), offset, now, review)


async def search(redis: Any, keys: Keys, tenant: str, query: str, zone: str = "UTC") -> Listing:
    """A number (digits, with spaces, `+`, dashes or brackets): the conversations whose number
    holds it, among all the index lists. Anything else: those among the newest `SEARCH_LOOK`
    whose contact name or remembered or waiting text holds it, case-insensitive. Newest first."""
    k = keys.tenant(tenant)
    digits = re.sub(r"[\s+()\-.]", "", query)
    if digits.isdigit():
        # Redis matches the numbers (ZSCAN MATCH): only the matches come back.
        pattern = f"*{digits}*"
        matches = [
            (text_of(p), int(ms))
            async for p, ms in redis.zscan_iter(k.conversations, match=pattern, count=SCAN_COUNT)
        ]
        found = sorted(matches, key=lambda m: (-m[1], m[0]))
        looked = int(await redis.zcard(k.conversations))
    else:
        newest = await redis.zrevrange(k.conversations, 0, SEARCH_LOOK - 1, withscores=True)
        listed = [(text_of(p), int(ms)) for p, ms in newest]
        found = await _with_words(redis, k, listed, " ".join(query.split()).casefold())
        looked = len(listed)
    review = await review_state(redis, k, {person for person, _ in found[:PAGE]})
    now = await live_state.redis_now_ms(redis)
    rows = await _rows(redis, k, found[:PAGE], now, review, zone)
    return Listing(
        tenant,
        rows,
        looked,
        0,
        now,
        review,
        query=query,
        looked=looked,
        by_number=digits.isdigit(),
    )


async def _with_words(
    redis: Any, k: TenantKeys, listed: list[tuple[str, int]], wanted: str
) -> list[tuple[str, int]]:
    """The conversations whose held text holds `wanted`, read `SEARCH_CHUNK` at a time. The
    raw JSON is looked through first (one casefold and one substring search in C per
    conversation); only a conversation it may match is decoded and checked field by field."""
    longest = max(wanted.split(), key=len, default="")
    found: list[tuple[str, int]] = []
    for start in range(0, len(listed), SEARCH_CHUNK):
        chunk = listed[start : start + SEARCH_CHUNK]
        pipe = redis.pipeline(transaction=False)
        for person, _ in chunk:
            pipe.lrange(k.memory(person), 0, -1)
            pipe.lrange(k.pending(person), 0, -1)
            pipe.hget(k.batch(person), "messages")
        answers = await pipe.execute() if chunk else []
        for i, (person, ms) in enumerate(chunk):
            memory, pending, batch = answers[3 * i : 3 * i + 3]
            raw = b"\n".join([*memory, *pending, batch or b""]).decode(errors="replace")
            if longest in raw.casefold() and _holds(wanted, memory, pending, batch):
                found.append((person, ms))
    return found


def _holds(wanted: str, memory: list[bytes], pending: list[bytes], batch: bytes | None) -> bool:
    texts: list[str] = []
    for raw in memory:
        entry = json_of(raw)
        if isinstance(entry, dict):
            texts += [str_of(entry.get("header")), str_of(entry.get("user"))]
            texts.append(str_of(entry.get("assistant")))
            for line in entry.get("lines") or []:
                if isinstance(line, dict):
                    texts += [str_of(line.get("name")), str_of(line.get("text"))]
    events = [json_of(raw) for raw in pending]
    listed = json_of(batch)
    events += listed if isinstance(listed, list) else []
    for event in events:
        if isinstance(event, dict):
            texts += [str_of(event.get("name")), str_of(event.get("text"))]
    return any(wanted in " ".join(t.split()).casefold() for t in texts if t)


async def review_state(redis: Any, k: TenantKeys, people: set[str]) -> Review:
    """The tenant's review items by reason (the counts shared/lua/lib/review.lua keeps), which
    of `people` (the page's) are in review and for what, and the last message of each one's
    newest item: through the review index, a few commands whatever the number of items. While
    items of the release before are not indexed yet (shared/ops/review_index.py fills it), by
    reading the items, at most `REVIEW_LOOK` of them."""
    listed = sorted(people)
    pipe = redis.pipeline(transaction=False)
    pipe.hlen(k.review)
    pipe.hlen(k.review_ix_of)
    pipe.hgetall(k.review_counts)
    for person in listed:
        pipe.zrange(k.review_ix_person(person), 0, -1)
    items_n, indexed_n, counts, *members = await pipe.execute()
    if int(items_n) > int(indexed_n):
        return await _scanned_review_state(redis, k, people)
    by_reason = {text_of(r): int(n) for r, n in counts.items() if int(n) > 0}
    ids = {p: [index_id(m) for m in found] for p, found in zip(listed, members, strict=True)}
    every = [i for found in ids.values() for i in found]
    newest = [found[-1] for found in ids.values() if found]
    pipe = redis.pipeline(transaction=False)
    pipe.hmget(k.review_ix_of, every)
    pipe.hmget(k.review, newest)
    entries, items = await pipe.execute() if every else ([], [])
    where = {i: json_of(e) for i, e in zip(every, entries, strict=True)}
    by_person: dict[str, list[str]] = {}
    for person, found in ids.items():
        for i in found:
            entry = where.get(i)
            reason = str_of(entry.get("reason")) if isinstance(entry, dict) else ""
            if reason and reason not in by_person.setdefault(person, []):
                by_person[person].append(reason)
    last: dict[str, tuple[int, dict[str, Any]]] = {}
    for raw in items:
        item = json_of(raw)
        if not isinstance(item, dict):
            continue
        messages = [m for m in item.get("messages") or [] if isinstance(m, dict)]
        if messages and str_of(item.get("person")) in people:
            last[str_of(item.get("person"))] = (int_of(item.get("reviewed_ms")), messages[-1])
    total = int(items_n)
    return Review(by_person, dict(sorted(by_reason.items())), total, total, last)


# An item's person and reason, read without decoding it (its messages are most of it).
_PERSON = re.compile(rb'"person":"([^"\\]*)"')
_REASON = re.compile(rb'"reason":"([^"\\]*)"')


async def _scanned_review_state(redis: Any, k: TenantKeys, people: set[str]) -> Review:
    """`review_state` from the items themselves, up to `REVIEW_LOOK` of them: only the page's
    people's items are decoded, the others read with two regular expressions (or decoded when
    those find nothing)."""
    total = int(await redis.hlen(k.review))
    by_person: dict[str, list[str]] = {}
    by_reason: dict[str, int] = {}
    last: dict[str, tuple[int, dict[str, Any]]] = {}
    read = 0
    async for _, raw in redis.hscan_iter(k.review, count=SCAN_COUNT):
        read += 1
        person_m, reason_m = _PERSON.search(raw), _REASON.search(raw)
        if person_m and reason_m:
            person, reason = text_of(person_m.group(1)), text_of(reason_m.group(1))
            item = json_of(raw) if person in people else None
        else:
            item = json_of(raw)
            if not isinstance(item, dict):
                continue
            person, reason = str_of(item.get("person")), str_of(item.get("reason"))
        reason = reason or "?"
        by_reason[reason] = by_reason.get(reason, 0) + 1
        if person and reason not in by_person.setdefault(person, []):
            by_person[person].append(reason)
        if person in people and isinstance(item, dict):
            messages = [m for m in item.get("messages") or [] if isinstance(m, dict)]
            at = int_of(item.get("reviewed_ms"))
            if messages and at >= last.get(person, (0, {}))[0]:
                last[person] = (at, messages[-1])
        if read >= REVIEW_LOOK:
            break
    return Review(by_person, dict(sorted(by_reason.items())), read, total, last)


async def _rows(
    redis: Any,
    k: TenantKeys,
    listed: list[tuple[str, int]],
    now: int,
    review: Review,
    zone: str,
) -> list[Row]:
    pipe = redis.pipeline(transaction=False)
    for person, _ in listed:
        pipe.lindex(k.pending(person), -1)
        pipe.llen(k.pending(person))
        pipe.lindex(k.memory(person), -1)
        pipe.hmget(k.batch(person), "id", "messages")
        pipe.get(k.human(person))
        pipe.get(k.silent(person))
        pipe.exists(k.lock(person))
        pipe.zscore(k.due, person)
    answers = await pipe.execute() if listed else []
    rows = []
    for i, (person, ms) in enumerate(listed):
        last_pending, waiting, last_memory, (batch_id, batch_messages), human, silent, lock, due = (
            answers[8 * i : 8 * i + 8]
        )
        row = Row(person=person, last_ms=ms, waiting=int(waiting), when=local(ms, zone))
        row.running, row.batch = bool(lock), batch_id is not None
        row.paused, row.silent = _dict(human), _dict(silent)
        row.due_in_ms = int(due) - now if due is not None and int(waiting) else None
        row.review = review.by_person.get(person, [])
        memory = json_of(last_memory)
        parked = review.last.get(person)
        if parked and not (isinstance(memory, dict) and int_of(memory.get("at")) > parked[0]):
            memory = None  # the words of the newest review item are the latest
        events = json_of(batch_messages)
        events = [*(parked[1:] if parked else []), *(events if isinstance(events, list) else [])]
        _said_last(row, json_of(last_pending), events, memory)
        rows.append(row)
    return rows


def _dict(raw: Any) -> dict[str, Any] | None:
    value = json_of(raw)
    return value if isinstance(value, dict) else None


def _said_last(row: Row, pending: Any, batch: Any, memory: Any) -> None:
    """The row's name and its last words: a waiting message, the batch's, else the memory's."""
    events = [e for e in (batch if isinstance(batch, list) else []) if isinstance(e, dict)]
    if isinstance(pending, dict):
        events.append(pending)
    names = [str_of(e.get("name")) for e in events if str_of(e.get("name"))]
    row.name = names[-1] if names else ""
    if isinstance(memory, dict) and not row.name:
        row.name = customer_name(memory)
    if events:
        row.last_text, row.last_by = _eventtext_of(events[-1]), "customer"
    elif isinstance(memory, dict):
        bubbles = memory_bubbles(memory)
        if bubbles:
            row.last_text, row.last_by = bubbles[-1].text, bubbles[-1].by
    row.last_text = snippet(row.last_text)


def _eventtext_of(event: dict[str, Any]) -> str:
    files = files_of_event(event)
    if files:
        return files[0].label  # `[image: caption]`
    return str_of(event.get("text")) or f"[{str_of(event.get('type', 'text')) or 'message'}]"


# --- the overview ---------------------------------------------------------------------------------
@dataclass
class TenantCounts:
    tenant: str
    conversations: int
    waiting: int
    running: int
    review: int


@dataclass
class Overview:
    tenants: list[TenantCounts]
    workers: dict[str, Any]
    ai_pause: dict[str, Any] | None
    now_ms: int
    # Every tenant's review items by reason: the sum of the counts the review index keeps
    # (`wa:{T}:review:ix:n`), not a count of the items.
    review_by_reason: dict[str, int] = field(default_factory=dict)


async def overview(redis: Any, keys: Keys) -> Overview:
    """Per tenant: conversations listed, waiting (due), running, review items; the fleet's
    review items by reason (the index's kept counts, summed); the workers alive by their
    heartbeats; the fleet's pause of AI calls."""
    tenants = sorted(text_of(t) for t in await redis.smembers(keys.tenants))
    pipe = redis.pipeline(transaction=False)
    for t in tenants:
        k = keys.tenant(t)
        pipe.zcard(k.conversations)
        pipe.zcard(k.due)
        pipe.zcard(k.running)
        pipe.hlen(k.review)
        pipe.hgetall(k.review_counts)
    answers = await pipe.execute() if tenants else []
    counts = [
        TenantCounts(t, *(int(a) for a in answers[5 * i : 5 * i + 4]))
        for i, t in enumerate(tenants)
    ]
    by_reason: dict[str, int] = {}
    for kept in answers[4::5]:
        for reason, n in kept.items():
            if int(n) > 0:
                by_reason[text_of(reason)] = by_reason.get(text_of(reason), 0) + int(n)
    now = await live_state.redis_now_ms(redis)
    workers = await live_state.workers(redis, keys)
    return Overview(
        counts, workers, await ai_pause(redis, keys), now, dict(sorted(by_reason.items()))
    )


async def ai_pause(redis: Any, keys: Keys) -> dict[str, Any] | None:
    """The fleet's pause of AI calls (shared/fleet/ai_pause.py), while it lasts."""
    pause = Pause.parse(await redis.get(keys.ai_paused))
    now = await live_state.redis_now_ms(redis)
    if pause is None or pause.until_ms <= now:
        return None
    return {"until_ms": pause.until_ms, "left_ms": pause.until_ms - now, "why": pause.why}
