"""What a waiting conversation keeps in Redis (docs/benchmarks/memory.md): its messages without
the routing prefix the inbox needs (claim.lua `slim_event`), its 24-hour window as a field of
the tenant's book of windows (shared/lua/lib/lastin.lua) rather than a key; and the upgrade
from the release before, whose events and `lastin` keys are still read."""

from __future__ import annotations

import time

import orjson
import pytest
from redis.asyncio import Redis

from receiver.ops import present
from shared import events
from shared.conversation.batch import Batch
from shared.keys import Keys
from shared.ops import live_rows, window
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.worker.support import TENANT, claim_due_now, message_event, push_message, quick_store
from tests.worker.test_not_messages import ANA, push
from tests.worker.test_not_messages import TENANT as FIXTURES_TENANT
from worker.conversation_store import ConversationStore

PERSON = "5491155550077"
DAY_S = 86400


@pytest.fixture
def store(redis: Redis, settings: Settings, prefix: str) -> ConversationStore:
    return quick_store(redis, settings.with_overrides(key_prefix=prefix))


async def test_a_waiting_message_is_kept_without_its_routing_prefix_and_read_whole(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "wamid.new", "hola")
    await store.claim(TENANT, 0, "intake")
    (stored,) = await redis.lrange(k.pending(PERSON), 0, -1)
    assert stored.startswith(b'{"id":"wamid.new","text":"hola",'), "no v, kind, person, type"
    event = orjson.loads(stored)
    assert "person" not in event and "kind" not in event and "v" not in event
    # A message the release before stored whole waits beside it (a rolling upgrade).
    old = message_event(TENANT, PERSON, "wamid.old", "sigo")  # `from` slimmed, `person` kept
    await redis.rpush(k.pending(PERSON), events.encode(old))
    await redis.zadd(k.due, {PERSON: 0})
    (batch,) = (await store.claim(TENANT, 5, "t")).batches
    assert [m.id for m in batch.messages] == ["wamid.new", "wamid.old"]
    assert [m.text for m in batch.messages] == ["hola", "sigo"]
    # WhatsApp's message object comes back whole either way: its sender is the batch's person.
    assert [m.raw["from"] for m in batch.messages] == [PERSON, PERSON]
    assert batch.messages[0].raw == {
        "from": PERSON,
        "id": "wamid.new",
        "timestamp": str(batch.messages[0].ts),
        "type": "text",
        "text": {"body": "hola"},
    }


async def test_a_waiting_message_leaves_out_what_its_fields_imply_and_reads_the_same(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """A WhatsApp message's event (shared/events.py `message_event`) has no `type` for a text
    and `rd` (ms after the provider's second) for `received_ms`; it waits so. Events of the
    release before (both fields) and of other channels wait beside them, and the turn, the ops
    page and the review pages read the same fields from every form."""
    k = Keys(prefix).tenant(TENANT)
    ts = int(time.time()) - 5
    old = message_event(TENANT, PERSON, "m3", "de antes", ts=ts, received_ms=ts * 1000 + 1)
    del old["rd"]
    old.update(type="text", text="de antes", ts=ts, received_ms=ts * 1000 + 1)
    shapes = [
        message_event(TENANT, PERSON, "m1", "hola", ts=ts, received_ms=ts * 1000 + 2345),
        message_event(TENANT, PERSON, "m2", "", type="image", ts=ts, received_ms=ts * 1000 - 7),
        old,
        message_event(
            TENANT, PERSON, "m5", "cw", ts=ts, channel="chatwoot", received_ms=ts * 1000 + 9
        ),
    ]
    shapes[1]["raw"] = {"image": {"id": "media-1", "mime_type": "image/jpeg"}}
    assert events.encode(shapes[0]).endswith(b'"id":"m1","text":"hola","ts":%d,"rd":2345}' % ts)
    for event in shapes:
        await redis.lpush(k.inbox, events.encode(event))
    await store.claim(TENANT, 0, "intake")
    stored = [orjson.loads(raw) for raw in await redis.lrange(k.pending(PERSON), 0, -1)]
    assert [("type" in e, "rd" in e, "received_ms" in e) for e in stored] == [
        (False, True, False),
        (True, True, False),
        (True, False, True),
        (True, False, True),
    ]
    assert [e["rd"] for e in stored[:2]] == [2345, -7]
    received = [ts * 1000 + 2345, ts * 1000 - 7, ts * 1000 + 1, ts * 1000 + 9]
    assert [events.received_ms(e) for e in stored] == received
    assert [events.message_type(e) for e in stored] == ["text", "image", "text", "text"]
    for event, kept in zip(shapes, stored, strict=True):
        assert {f: kept[f] for f in ("id", "text", "ts")} == {
            f: event[f] for f in ("id", "text", "ts")
        }
    # The ops page's rows of waiting messages, and the review pages' time of a message.
    now = ts * 1000 + 10_000
    rows = [live_rows.message_row(events.encode(e), now, True) for e in stored]
    assert [(r["type"], r["received_ago_ms"]) for r in rows] == [
        ("text", 7655),
        ("image", 10_007),
        ("text", 9999),
        ("text", 9991),
    ]
    assert [present.message_ms(e) for e in stored] == received
    await redis.zadd(k.due, {PERSON: 0})
    (batch,) = (await store.claim(TENANT, 5, "t")).batches
    assert [m.type for m in batch.messages] == ["text", "image", "text", "text"]
    assert batch.messages[1].raw["image"] == {"id": "media-1", "mime_type": "image/jpeg"}
    assert batch.messages[0].raw == {
        "from": PERSON,
        "id": "m1",
        "timestamp": str(ts),
        "type": "text",
        "text": {"body": "hola"},
    }


async def test_the_window_is_a_field_of_the_book_and_the_claim_hands_it_over(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    ts = int(time.time()) - 60
    await push_message(redis, prefix, PERSON, "m1", "hola", ts=ts)
    await push_message(redis, prefix, PERSON, "m0", "antes", ts=ts - 30)  # out of order
    await store.claim(TENANT, 0, "intake")
    assert not await redis.exists(k.last_inbound(PERSON)), "no key of its own"
    shards = [key async for key in redis.scan_iter(match=f"{k.lastin_book}*")]
    assert len(shards) == 2, "the generations and one shard"
    for key in shards:
        assert await redis.ttl(key) > DAY_S, f"{key!r} expires after the window"
    ((found, closes_in),) = await window.last_inbound(redis, k, [PERSON])
    assert found == ts, "the latest message's ts, not the last one taken in"
    assert DAY_S - 65 <= closes_in <= DAY_S - 60
    await redis.zadd(k.due, {PERSON: 0})
    (batch,) = (await store.claim(TENANT, 5, "t")).batches
    assert batch.last_inbound_ts == ts
    # A message whose window closed long ago opens none.
    await push_message(redis, prefix, "5491155550078", "m9", "viejo", ts=ts - 2 * DAY_S)
    await store.claim(TENANT, 0, "intake")
    assert await window.last_inbound(redis, k, ["5491155550078", "nobody"]) == [(0, 0), (0, 0)]


async def test_a_window_key_of_the_release_before_is_read_until_a_later_message(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """Upgrading: `c:<person>:lastin` keys (EXAT the window's end) are read beside the book,
    the later ts winning, and their expiry still closes the window (lib/lastin.lua)."""
    k = Keys(prefix).tenant(TENANT)
    old_ts = int(time.time()) - 3600
    await redis.set(k.last_inbound(PERSON), old_ts, exat=old_ts + DAY_S)
    ((found, closes_in),) = await window.last_inbound(redis, k, [PERSON])
    assert found == old_ts and DAY_S - 3610 <= closes_in <= DAY_S - 3600, "the key's TTL"
    # A reply by hand reads it as the worker does.
    scripts = Scripts()
    await scripts.load(redis)
    row = await scripts.manual_begin(
        redis, k, person=PERSON, token="manual:x", lease_ms=1000, service_window_s=DAY_S
    )
    assert row[0] == b"ok" and int(row[2]) == old_ts
    await redis.delete(k.lock(PERSON))
    # An older message changes nothing; the claim hands the key's ts over (a message over half
    # a window old: a newer one would be handed over itself, see the test below).
    batch = await _claim_one(redis, store, prefix, "m1", old_ts - DAY_S // 2)
    assert batch.last_inbound_ts == old_ts
    assert await store.finish_done(batch)
    # A later one goes to the book and wins; the key is left to expire.
    batch = await _claim_one(redis, store, prefix, "m2", old_ts + 100)
    assert batch.last_inbound_ts == old_ts + 100
    assert int(await redis.get(k.last_inbound(PERSON)) or 0) == old_ts
    assert (await window.last_inbound(redis, k, [PERSON]))[0][0] == old_ts + 100


async def test_a_new_batch_with_a_recent_message_hands_over_its_ts_not_the_book(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """Reading the window from the book cost a fifth of a batch's claim: a new batch whose
    newest message is under half a window old hands over that message's ts (the window is open
    at least that long: a turn takes minutes). Past half a window, the book's."""
    t = FIXTURES_TENANT
    k = Keys(prefix).tenant(t)
    now = int(time.time())
    await push_message(redis, prefix, ANA, "m1", "hola", ts=now - 3600, tenant=t)
    await push_message(redis, prefix, ANA, "m0", "antes", ts=now - 3700, tenant=t)
    # A reaction keeps the window open beyond the messages; the claim does not read it.
    await push(redis, prefix, "reaction.json", timestamp=str(now - 60))
    batch = await claim_due_now(redis, store, prefix, ANA, "t", tenant=t)
    assert (await window.last_inbound(redis, k, [ANA]))[0][0] == now - 60, "the book's"
    assert batch.last_inbound_ts == now - 3600, "the newest message's, of the two"
    assert not batch.window_closed(now)
    assert await store.finish_done(batch)
    # Half a window old and more: the book's ts.
    await push_message(redis, prefix, ANA, "m2", "viejo", ts=now - DAY_S // 2 - 10, tenant=t)
    batch = await claim_due_now(redis, store, prefix, ANA, "t2", tenant=t)
    assert batch.last_inbound_ts == now - 60
    assert await store.finish_done(batch)
    # A ts ahead of Redis's clock (a provider's clock off) is looked up: the book's, which
    # kept it as it keeps any (lib/lastin.lua).
    await push_message(redis, prefix, ANA, "m3", "futuro", ts=now + 3600, tenant=t)
    batch = await claim_due_now(redis, store, prefix, ANA, "t3", tenant=t)
    assert batch.last_inbound_ts == now + 3600


async def _claim_one(
    redis: Redis, store: ConversationStore, prefix: str, wamid: str, ts: int
) -> Batch:
    await push_message(redis, prefix, PERSON, wamid, "hola", ts=ts)
    return await claim_due_now(redis, store, prefix, PERSON, wamid)
