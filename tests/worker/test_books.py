"""The books of dedupe markers and outbound records (shared/lua/lib/book.lua) on real Redis:
markers found across generations and in the keys of the release before, generations opened,
sized and forgotten on time, records of the release before still moved forward."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from shared import events
from shared.keys import Keys, TenantKeys
from shared.ops import markers, outbound
from shared.storage.lua_source import assemble
from shared.storage.scripts import Scripts
from tests.worker.support import TENANT, ingest_one, message_event, push_status
from worker.conversation_store import ConversationStore

DAY = 86400
KEEP = 7 * DAY

# A test's own script on the book's functions: the clock is an argument.
BOOK_CALLS = """-- uses: lib/book.lua (book_open, book_gens, book_key, book_added)
local prefix, now_s = ARGV[1], tonumber(ARGV[2])
local keep_s, gen_s = tonumber(ARGV[3]), tonumber(ARGV[4])
local gen = book_open(prefix, now_s, keep_s, gen_s, 4, 'SCARD')
for i = 5, #ARGV do
  local key = book_key(gen, tonumber(ARGV[i]))
  if redis.call('SADD', key, ARGV[i]) == 1 then
    book_added(prefix, gen, key, redis.call('SCARD', key), 4)
  end
end
local out = {}
for _, g in ipairs(book_gens(prefix)) do out[#out + 1] = {g.id, g.shards, g.ends} end
return out
"""


async def book_calls(
    redis: Redis, prefix: str, now_s: int, entries: list[int], gen_s: int = DAY
) -> list[tuple[int, int, int]]:
    """Open the book at `now_s` (4 entries a shard, generations of `gen_s`), add `entries`;
    its generations after, newest first: (start, shards, end)."""
    found = await redis.eval(
        assemble(BOOK_CALLS), 0, prefix, now_s, KEEP, gen_s, *(str(e) for e in entries)
    )
    return [(int(a), int(b), int(c)) for a, b, c in found]


def event(message_id: str) -> dict[str, Any]:
    return message_event(TENANT, "5491155550001", message_id, "hola")


async def test_markers_of_every_generation_keep_their_messages_out(
    redis: Redis, prefix: str
) -> None:
    """1 000 messages in one call open a second generation (the first fills up at 384 markers
    in a shard), sized for the rate; each message delivered again is a duplicate, whichever
    generation marked it."""
    k = Keys(prefix).tenant(TENANT)
    scripts = Scripts()
    ids = [f"wamid.b{i}" for i in range(1000)]
    results = await _ingest(redis, scripts, k, [event(i) for i in ids])
    assert results == [1] * 1000
    gens = await redis.hgetall(k.seen_gens)
    # 384 markers in less than the 10 minutes a rate is measured over: 384 in 10 minutes is
    # 387 072 a week (a generation), 2 048 shards of 256 at most.
    shards = sorted(int(v.split(b":")[1]) for f, v in gens.items() if f.isdigit())
    assert shards == [1, 2048] and gens[b"newest"].split(b":")[1] == b"2048"
    assert await markers.count(redis, k) == 1000
    again = await _ingest(redis, scripts, k, [event(i) for i in reversed(ids)])
    assert again == [0] * 1000
    assert await markers.marked(redis, k, [f"whatsapp:{i}" for i in ids[:3]]) == [True] * 3
    assert await markers.marked(redis, k, ["whatsapp:wamid.never"]) == [False]
    assert await redis.llen(k.inbox) == 1000


async def test_a_marker_of_the_release_before_is_read_until_none_can_be_left(
    redis: Redis, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await redis.set(k.seen("whatsapp:wamid.old"), 1, ex=3600)  # as the release before wrote it
    assert not await ingest_one(redis, k, event("wamid.old"))
    assert await ingest_one(redis, k, event("wamid.new"))
    assert not await redis.exists(k.seen("whatsapp:wamid.new")), "only the book is written"
    # A book that began more than DEDUPE_TTL_S and a day ago: no old marker can be left.
    now = int((await redis.time())[0])
    await redis.hset(k.seen_gens, "since", now - 3600 - DAY - 10)
    await redis.set(k.seen("whatsapp:wamid.stale"), 1, ex=3600)
    assert await ingest_one(redis, k, event("wamid.stale"), dedupe_ttl_s=3600)


async def test_generations_open_when_full_or_old_and_are_forgotten_when_expired(
    redis: Redis, prefix: str
) -> None:
    book = f"{prefix}:book:"
    t0 = 1_800_000_000
    # A shard of 4 entries a shard is full at 6: the seventh entry's call opens a second one.
    first = await book_calls(redis, book, t0, list(range(6)))
    assert first == [(t0, 1, t0 + DAY + KEEP)]
    assert await redis.ttl(f"{book}{t0}:0") > 0, "a shard lives until its generation's end"
    # Full after 6 entries in 10 minutes (the least a rate is measured over): a day of that
    # rate is 864 entries, 4 a shard: 256 shards (a power of two).
    second = await book_calls(redis, book, t0 + 30, [7])
    assert second[0] == (t0 + 30, 256, t0 + 30 + DAY + KEEP) and second[1][0] == t0
    # A day later the newest is too old: a new one, sized by what its first shards got (none).
    third = await book_calls(redis, book, t0 + 30 + DAY, [8])
    assert third[0][:2] == (t0 + 30 + DAY, 1) and len(third) == 3
    # Once the first generation's end passed, it is forgotten (its shards expired with it).
    later = t0 + DAY + KEEP + 1
    fourth = await book_calls(redis, book, later, [9])
    assert [g[0] for g in fourth] == [later, t0 + 30 + DAY, t0 + 30]
    assert b"since" in await redis.hkeys(f"{book}gens")


async def test_a_record_of_the_release_before_is_moved_forward_and_forgotten(
    redis: Redis, prefix: str, store: ConversationStore
) -> None:
    """After an upgrade, statuses keep moving the outbound records the release before wrote
    (`out:<wamid>`, a hash each) until they expire; the ops page and forget read them."""
    k = Keys(prefix).tenant(TENANT)
    person = "5491155550009"
    old = {"batch": "b1", "person": person, "part": "0", "status": "sent", "sent_ms": "1"}
    await redis.hset(k.outbound("wamid.was"), mapping=old)
    await redis.expire(k.outbound("wamid.was"), 3600)
    await push_status(redis, prefix, person, "wamid.was", "read")
    await store.claim(TENANT, 0, "intake")
    [record] = await outbound.records(redis, k, ["wamid.was"])
    assert (record["status"], record["batch"], record["person"]) == ("read", "b1", person)
    assert await outbound.forget(redis, k, person) == 1
    assert await outbound.records(redis, k, ["wamid.was"]) == [{}]


async def _ingest(
    redis: Redis, scripts: Scripts, k: TenantKeys, items: list[dict[str, Any]]
) -> list[int]:
    """One ingest call for all of them, as the receiver's group commit makes."""
    found = await scripts.ingest(
        redis,
        k,
        seen=[k.seen(events.dedupe_id(e)) for e in items],
        dedupe_ttl_s=KEEP,
        events=[events.encode(e) for e in items],
    )
    return [int(x) for x in found]


@pytest.fixture
def store(redis: Redis, prefix: str, settings: Any) -> ConversationStore:
    from shared.storage.group_commit import GroupCommitter

    scripts = Scripts()
    return ConversationStore(
        settings.with_overrides(key_prefix=prefix), scripts, GroupCommitter(redis, scripts)
    )
