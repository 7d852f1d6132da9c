"""One conversation as a thread for people: what the customer, the bot and people of the
business said, in time order, with times in the tenant's time zone, built from what Redis holds
of the person: the memory (an exchange remembered since the ops inbox came keeps when its
messages came, `in`, and the reply went, `at`; older ones show with the time their header
names), the person's review items, the batch in flight and the messages waiting.

Read-only. The person's review items come through their review index (`review_ix_person`),
or, while items of the release before are not indexed yet, from reading at most `REVIEW_LOOK`
of the tenant's items.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import orjson

from shared.conversation.human_memory import is_human_entry
from shared.conversation.kept_files import File, files_of_event
from shared.conversation.presentation import BY_HUMAN, HEADER_START
from shared.conversation.review_journal import current_names
from shared.events import received_ms
from shared.keys import Keys, TenantKeys
from shared.ops.window import last_inbound

REVIEW_LOOK = 5000
SCAN_COUNT = 1000
UNDELIVERED = re.compile(r"^\[not delivered: [^\]]*\] ?")


# Values as Redis and the stored JSON give them, read without trusting their types: items of an
# older release, or written by hand, may hold anything (shared/ops/conversations.py uses these).
def text_of(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def json_of(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def str_of(value: Any) -> str:
    return value if isinstance(value, str) else ""


def int_of(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str | bytes) and text_of(value).strip().isdigit():
        return int(text_of(value))
    return 0


def customer_name(entry: dict[str, Any]) -> str:
    """The customer's name a remembered exchange holds (its header's `From:`), or ""."""
    if is_human_entry(entry):
        lines = [x for x in entry.get("lines") or [] if isinstance(x, dict)]
        names = [str_of(x.get("name")) for x in lines if x.get("by") != "agent" and x.get("name")]
        return names[-1] if names else ""
    for line in str_of(entry.get("header")).splitlines():
        if line.startswith("From: "):
            return line[len("From: ") :]
    return ""


@dataclass
class Bubble:
    """One thing said in the conversation, as the thread shows it."""

    by: str  # customer, bot, business (a person of the business), note (a state, not words)
    text: str
    at_ms: int | None = None  # when, if known
    who: str = ""  # the customer's or the person of the business's name
    when: str = ""  # the time as the page shows it (the tenant's zone), or the remembered header's
    state: str = ""  # waiting, in a turn, parked for review: <reason>, not delivered, ...
    files: list[File] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the AI read of the files (transcripts)
    message_id: str = ""


def local(at_ms: int | None, zone: str) -> str:
    """`2026-12-03 15:04` in the tenant's time zone, "" when unknown."""
    if not at_ms:
        return ""
    try:
        tz = ZoneInfo(zone)
    except (ValueError, KeyError):
        tz = ZoneInfo("UTC")
    return datetime.fromtimestamp(at_ms / 1000, UTC).astimezone(tz).strftime("%Y-%m-%d %H:%M")


def memory_bubbles(entry: dict[str, Any]) -> list[Bubble]:
    """What one remembered exchange said: the customer's messages, then the reply."""
    if is_human_entry(entry):
        return [_line_bubble(x) for x in entry.get("lines") or [] if isinstance(x, dict)]
    bubbles = []
    user, answer = str_of(entry.get("user")), str_of(entry.get("assistant"))
    header = str_of(entry.get("header"))
    remembered_when = ""
    if header.startswith(HEADER_START):
        remembered_when = header.splitlines()[0][len(HEADER_START) :]
    came_s = int_of(entry.get("in"))
    files = [File.from_json(f) for f in entry.get("files") or [] if isinstance(f, dict)]
    media = entry.get("media")
    if user or files or media:
        bubbles.append(
            Bubble(
                "customer",
                user,
                came_s * 1000 or None,
                who=customer_name(entry),
                when="" if came_s else remembered_when,
                files=files,
                notes=[str_of(n) for n in media if str_of(n)] if isinstance(media, list) else [],
            )
        )
    if answer:
        human = entry.get("by") == BY_HUMAN
        who = ""
        if human:
            who = "WhatsApp Business app" if entry.get("echo") else str_of(entry.get("who"))
        undelivered = UNDELIVERED.match(answer)
        bubbles.append(
            Bubble(
                "business" if human else "bot",
                answer[undelivered.end() :] if undelivered else answer,
                int_of(entry.get("at")) or None,
                who=who,
                state=undelivered.group(0).strip(" []") if undelivered else "",
            )
        )
    return bubbles


def _line_bubble(line: dict[str, Any]) -> Bubble:
    """A line of a Chatwoot stretch a person of the business handled."""
    agent = line.get("by") == "agent"
    return Bubble(
        "business" if agent else "customer",
        str_of(line.get("text")),
        int_of(line.get("ts")) * 1000 or None,
        who=str_of(line.get("name")),
        message_id=str_of(line.get("id")),
    )


def event_bubble(event: dict[str, Any], state: str) -> Bubble:
    files = files_of_event(event)
    text = str_of(event.get("text"))
    if files and text == files[0].caption:
        text = ""  # the caption is shown with the file
    ts = int_of(event.get("ts"))
    return Bubble(
        "customer",
        text,
        # When it reached us (the receiver's ms, on the clock of the replies' `at`), else the
        # provider's whole second: a message and a reply of the same second keep their order.
        received_ms(event) or ts * 1000 or None,
        who=str_of(event.get("name")),
        state=state,
        files=files,
        message_id=str_of(event.get("id")),
    )


@dataclass
class Thread:
    tenant: str
    person: str
    zone: str
    bubbles: list[Bubble]
    name: str
    memory_entries: int
    # Its state, read with it: the bot's pause for the person (by, why, until_ms), Chatwoot's
    # silence, a turn or reply by hand holding it, messages waiting and when they are due, the
    # 24-hour window, and its review items (id, reason).
    paused: dict[str, Any] | None = None
    silent: dict[str, Any] | None = None
    running: bool = False
    waiting: int = 0
    due_in_ms: int | None = None
    window_open: bool = False
    review: list[tuple[str, str]] = field(default_factory=list)


async def thread(redis: Any, keys: Keys, tenant: str, person: str, zone: str) -> Thread:
    """The person's conversation in time order, times in `zone`."""
    k = keys.tenant(tenant)
    pipe = redis.pipeline(transaction=False)
    pipe.lrange(k.memory(person), 0, -1)
    pipe.hmget(k.batch(person), "messages", "reply", "token")
    pipe.lrange(k.pending(person), 0, -1)
    pipe.get(k.human(person))
    pipe.get(k.silent(person))
    pipe.exists(k.lock(person))
    pipe.zscore(k.due, person)
    memory, (batch_messages, reply, token), pending, *state = await pipe.execute()
    human, silent, lock, due = state
    ((window, _),) = await last_inbound(redis, k, [person])
    seconds, micros = await redis.time()  # Redis's clock, as the due times
    now = int(seconds) * 1000 + int(micros) // 1000
    ordered: list[list[Bubble]] = []
    for raw in memory:
        entry = json_of(raw)
        if isinstance(entry, dict):
            ordered.append(memory_bubbles(entry))
    others: list[Bubble] = []
    review: list[tuple[str, str]] = []
    for item in await review_items_of(redis, k, person):
        reason = str_of(item.get("reason")) or "?"
        review.append((str_of(item.get("id")), reason))
        for event in item.get("messages") or []:
            if isinstance(event, dict):
                others.append(event_bubble(event, f"parked for review: {reason}"))
    batch_state = "in a turn now" if token else "waiting for a retry"
    for event in json_of(batch_messages) or []:
        if isinstance(event, dict):
            others.append(event_bubble(event, batch_state))
    if reply is not None:
        at = max((b.at_ms or 0 for b in others), default=0) or None
        others.append(Bubble("bot", text_of(reply), at, state="stored, being sent"))
    for raw in pending:
        event = json_of(raw)
        if isinstance(event, dict):
            others.append(event_bubble(event, "waiting"))
    bubbles = in_time_order(ordered, others)
    for b in bubbles:
        b.when = local(b.at_ms, zone) or b.when
    names = [b.who for b in bubbles if b.by == "customer" and b.who]
    paused, quiet = json_of(human), json_of(silent)
    return Thread(
        tenant,
        person,
        zone,
        bubbles,
        names[-1] if names else "",
        len(memory),
        paused=paused if isinstance(paused, dict) else None,
        silent=quiet if isinstance(quiet, dict) else None,
        running=bool(lock),
        waiting=len(pending),
        due_in_ms=int(due) - now if due is not None and pending else None,
        window_open=bool(window),
        review=review,
    )


def in_time_order(memory: Iterable[list[Bubble]], others: list[Bubble]) -> list[Bubble]:
    """The memory's bubbles (in the memory's order; one without a time takes the time of the one
    before it) merged with the others by time; a tie keeps the memory first."""
    keyed: list[tuple[int, int, Bubble]] = []
    last, seq = 0, 0
    for bubbles in memory:
        for b in bubbles:
            last = max(last, b.at_ms or last)
            keyed.append((last, seq, b))
            seq += 1
    for b in others:
        keyed.append((b.at_ms or last, seq, b))
        seq += 1
    return [b for _, _, b in sorted(keyed, key=lambda x: (x[0], x[1]))]


async def review_items_of(redis: Any, k: TenantKeys, person: str) -> list[dict[str, Any]]:
    """The person's review items, oldest first: through the person's review index
    (`review_ix_person`, kept by shared/lua/lib/review.lua) when every item is indexed; while
    items of the release before are not yet (shared/ops/review_index.py fills it), by reading
    the tenant's items, at most `REVIEW_LOOK` of them."""
    pipe = redis.pipeline(transaction=False)
    pipe.hlen(k.review)
    pipe.hlen(k.review_ix_of)
    pipe.zrange(k.review_ix_person(person), 0, -1)
    items_n, indexed_n, members = await pipe.execute()
    if int(items_n) <= int(indexed_n):
        ids = [index_id(m) for m in members]
        found = await redis.hmget(k.review, ids) if ids else []
        items = [json_of(raw) for raw in found]
        return [current_names(i) for i in items if isinstance(i, dict)]
    scanned: list[dict[str, Any]] = []
    read = 0
    async for _, raw in redis.hscan_iter(k.review, count=SCAN_COUNT):
        read += 1
        item = json_of(raw)
        if isinstance(item, dict) and item.get("person") == person:
            scanned.append(current_names(item))
        if read >= REVIEW_LOOK:
            break
    return sorted(scanned, key=lambda i: (int_of(i.get("reviewed_ms")), str_of(i.get("id"))))


def index_id(member: bytes | str) -> str:
    """The item id of a review index member, "<ms, 16 digits>:<id>"."""
    return text_of(member).split(":", 1)[-1]


async def message_event(
    redis: Any, keys: Keys, tenant: str, person: str, message_id: str
) -> dict[str, Any] | list[File] | None:
    """The stored event of one of the person's messages (waiting, in the batch, in a review
    item), or the files a remembered exchange kept of it: where the media route finds a
    file's reference. None when Redis holds no such message of this person."""
    k = keys.tenant(tenant)
    pipe = redis.pipeline(transaction=False)
    pipe.lrange(k.pending(person), 0, -1)
    pipe.hget(k.batch(person), "messages")
    pipe.lrange(k.memory(person), 0, -1)
    pending, batch, memory = await pipe.execute()
    events = [json_of(raw) for raw in pending]
    listed = json_of(batch)
    events += listed if isinstance(listed, list) else []
    for item in await review_items_of(redis, k, person):
        events += [m for m in item.get("messages") or [] if isinstance(m, dict)]
    for event in events:
        if isinstance(event, dict) and event.get("id") == message_id:
            return event
    kept = [
        File.from_json(f)
        for entry in (json_of(raw) for raw in memory)
        if isinstance(entry, dict)
        for f in entry.get("files") or []
        if isinstance(f, dict) and f.get("id") == message_id
    ]
    return kept or None
