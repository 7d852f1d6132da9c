"""The audit log: who did what to which conversation, from the ops page or a CLI.

One fleet-wide sorted set (`wa:ops:audit`, shared/keys.py): each member is a JSON entry
`{id, at_ms, who, action, tenant, person, detail}` scored by `at_ms`, so the newest are read
with one `ZREVRANGEBYSCORE` and old ones trimmed with one `ZREMRANGEBYSCORE`. Entries older
than `REVIEW_RETENTION_S` are trimmed whenever one is added. Forgetting a person (a privacy
request) rewrites that person's entries to keep only that something happened: who, when,
which action, nothing about the person.

    redis-cli ZREVRANGE wa:ops:audit 0 9        # the ten newest entries
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from shared.keys import Keys

FORGOTTEN = "(forgotten)"  # what a forgotten person's entries show instead of them


@dataclass(frozen=True)
class Entry:
    id: str
    at_ms: int
    who: str
    action: str
    tenant: str
    person: str
    detail: str

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def parse(cls, raw: bytes | str) -> Entry | None:
        """The entry, or None for a member that is not one (written by hand, say)."""
        try:
            fields = orjson.loads(raw)
            return cls(**{name: fields[name] for name in cls.__dataclass_fields__})
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None


async def record(
    redis: Any,
    keys: Keys,
    *,
    who: str,
    action: str,
    tenant: str = "",
    person: str = "",
    detail: str = "",
    retention_s: float,
    now_ms: int | None = None,
) -> Entry:
    """Add an entry and trim the ones older than `retention_s`, in one round trip."""
    at = int(time.time() * 1000) if now_ms is None else now_ms
    entry = Entry(uuid.uuid4().hex, at, who, action, tenant, person, detail)
    pipe = redis.pipeline(transaction=True)
    pipe.zadd(keys.audit, {entry.to_json(): at})
    pipe.zremrangebyscore(keys.audit, "-inf", f"({at - int(retention_s * 1000)}")
    await pipe.execute()
    return entry


async def record_many(
    redis: Any,
    keys: Keys,
    wanted: list[dict[str, str]],
    *,
    retention_s: float,
    now_ms: int | None = None,
) -> list[Entry]:
    """Add one entry per dict of `wanted` (who, action, tenant, person, detail) and trim, in
    one round trip: a chunk of a bulk action."""
    at = int(time.time() * 1000) if now_ms is None else now_ms
    added = [
        Entry(
            uuid.uuid4().hex,
            at,
            w["who"],
            w["action"],
            w.get("tenant", ""),
            w.get("person", ""),
            w.get("detail", ""),
        )
        for w in wanted
    ]
    if not added:
        return []
    pipe = redis.pipeline(transaction=True)
    pipe.zadd(keys.audit, {entry.to_json(): at for entry in added})
    pipe.zremrangebyscore(keys.audit, "-inf", f"({at - int(retention_s * 1000)}")
    await pipe.execute()
    return added


async def entries(
    redis: Any,
    keys: Keys,
    *,
    limit: int = 100,
    tenant: str | None = None,
    person: str | None = None,
    scan: int | None = None,
) -> list[Entry]:
    """The newest entries first, at most `limit`, optionally of one tenant and person, found
    among the newest `scan` entries (None: all of them)."""
    wanted: list[Entry] = []
    # Unfiltered, the newest `limit` are all that is read.
    start, page = 0, limit if tenant is None and person is None else max(limit, 200)
    while len(wanted) < limit and (scan is None or start < scan):
        raw = await redis.zrevrange(keys.audit, start, start + page - 1)
        if not raw:
            break
        for member in raw:
            entry = Entry.parse(member)
            if entry is None:
                continue
            if tenant is not None and entry.tenant != tenant:
                continue
            if person is not None and entry.person != person:
                continue
            wanted.append(entry)
        start += page
    return wanted[:limit]


@dataclass(frozen=True)
class Page:
    """One page of the log, newest first, and where the next (older) one starts."""

    entries: list[Entry]
    older: str  # the cursor of the next page ("" when nothing older is left)
    read: int  # entries looked through for this page (the filters skip some)


def cursor(at_ms: int, skip: int) -> str:
    """Where a page starts: the entries scored at most `at_ms`, past the first `skip` of those
    scored exactly `at_ms` (a bulk action records a chunk at one time: scores tie)."""
    return f"{at_ms}.{skip}"


def parse_cursor(text: str) -> tuple[int, int]:
    """`cursor`'s two numbers; ValueError for anything else."""
    at, dot, skip = text.partition(".")
    if not (dot and at.isdigit() and skip.isdigit() and len(text) <= 40):
        raise ValueError(f"bad audit cursor {text!r}")
    return int(at), int(skip)


async def page(
    redis: Any,
    keys: Keys,
    *,
    before: str = "",
    who: str = "",
    action: str = "",
    limit: int = 100,
    scan: int = 5_000,
    chunk: int = 200,
) -> Page:
    """The newest `limit` entries by `who` and of `action` ("": any), from cursor `before`
    (older than the page before), looking through at most `scan` entries: each read is one
    ZREVRANGEBYSCORE with LIMIT from the cursor, so a page costs the same however long the
    log is. Stops at `scan` even with fewer matches; `older` then continues from there."""
    top, skip = parse_cursor(before) if before else (None, 0)
    wanted: list[Entry] = []
    read = 0
    exhausted = False
    while len(wanted) < limit and read < scan:
        found = await redis.zrevrangebyscore(
            keys.audit,
            "+inf" if top is None else top,
            "-inf",
            start=skip,
            num=min(chunk, scan - read),
            withscores=True,
        )
        if not found:
            exhausted = True
            break
        for member, score in found:
            read += 1
            at = int(score)
            top, skip = (top, skip + 1) if at == top else (at, 1)
            entry = Entry.parse(member)
            if entry is None or (who and entry.who != who) or (action and entry.action != action):
                continue
            wanted.append(entry)
            if len(wanted) >= limit:
                break
    older = ""
    if not exhausted and top is not None:
        more = await redis.zrevrangebyscore(keys.audit, top, "-inf", start=skip, num=1)
        older = cursor(top, skip) if more else ""
    return Page(wanted, older, read)


async def forget_person(redis: Any, keys: Keys, tenant: str, person: str) -> int:
    """Rewrite every entry about `person` of `tenant` to keep only that it happened (who,
    when, which action); returns how many entries were rewritten."""
    rewritten = 0
    cursor = 0
    while True:
        cursor, found = await redis.zscan(keys.audit, cursor, count=500)
        pipe = redis.pipeline(transaction=True)
        for member, score in found:
            entry = Entry.parse(member)
            if entry is None or entry.tenant != tenant or entry.person != person:
                continue
            kept = Entry(entry.id, entry.at_ms, entry.who, entry.action, tenant, FORGOTTEN, "")
            pipe.zrem(keys.audit, member)
            pipe.zadd(keys.audit, {kept.to_json(): score})
            rewritten += 1
        if len(pipe):
            await pipe.execute()
        if cursor == 0:
            return rewritten
