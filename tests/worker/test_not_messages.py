"""Events that are not messages start no turn (issue 14, item 4): recorded webhook payloads
(tests/fixtures/whatsapp/) parsed by the receiver's code, stored by the `ingest` script as the
receiver does, taken in by claim.lua on real Redis; the last tests run real worker processes.

What each event gets: a reaction (or a removed one), a system event and a call-permission reply
go on the conversation's context list and make nothing due; a deletion takes its message out of
the waiting batch (an emptied batch runs no turn) or, once answered, is context; an edit
replaces the waiting message or, once answered, is context; `request_welcome` is context unless
a welcome text is configured, and then a turn that sends that text without the brain.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from receiver.providers.whatsapp import parse_payload
from shared.conversation.burst_shards import burst_shard_of
from shared.fleet import wake as shared_wake
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.support.helpers import counters, fixture_json
from tests.worker.support import Records, WorkerFleet, ingest_one, outbox, wait_for
from worker.brains.prompt import render_context
from worker.conversation_store import Claim, ConversationStore

TENANT = "106500000000001"  # the fixtures' phone_number_id
ANA = "5491155550001"
NEW_ANA = "5491155550099"  # her number after system_changed_number.json
_SCRIPTS = Scripts()


def fixture_events(name: str, **message_changes: Any) -> list[dict[str, Any]]:
    """The inbox events the receiver makes of a fixture; `message_changes` edit its message."""
    doc = copy.deepcopy(fixture_json(f"whatsapp/{name}"))
    doc["entry"][0]["changes"][0]["value"]["messages"][0].update(message_changes)
    parsed = parse_payload(doc, 1_764_500_000_000)
    assert parsed.problems == []
    return parsed.events[TENANT]


async def push(redis: Redis, prefix: str, name: str, **message_changes: Any) -> None:
    keys = Keys(prefix)
    k = keys.tenant(TENANT)
    for event in fixture_events(name, **message_changes):
        assert await ingest_one(redis, k, event)
    await redis.sadd(keys.tenants, TENANT)
    await shared_wake.add(redis, keys.wake_queue, [TENANT])


@pytest.fixture
def store(redis: Redis, settings: Settings, prefix: str) -> ConversationStore:
    s = settings.with_overrides(key_prefix=prefix, debounce_window_s=3, max_wait_s=3.5)
    return ConversationStore(s, _SCRIPTS, GroupCommitter(redis, _SCRIPTS))


async def stats(redis: Redis, prefix: str) -> dict[str, int]:
    raw = await redis.hgetall(Keys(prefix).tenant(TENANT).stats)
    return counters(raw)


async def claim_now(
    redis: Redis, store: ConversationStore, prefix: str, person: str = ANA
) -> Claim:
    """Take the inbox in, then claim with `person` made due now (if it is due at all)."""
    k = Keys(prefix).tenant(TENANT)
    await store.claim(TENANT, 0, "t")
    if await redis.zscore(k.due, person) is not None:
        await redis.zadd(k.due, {person: 0})
    return await store.claim(TENANT, 5, "tok")


async def nothing_starts(
    redis: Redis, store: ConversationStore, prefix: str, *names: str, person: str = ANA
) -> None:
    """The events of fixtures `names` taken in, then a claim as of `person`: no batch, and
    nothing due (they are context for the next batch, not work)."""
    for name in names:
        await push(redis, prefix, name)
    claim = await claim_now(redis, store, prefix, person)
    assert claim.batches == [] and claim.next_ms == -1, "nothing due"


async def test_a_reaction_starts_nothing_and_the_next_batch_sees_it(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await nothing_starts(redis, store, prefix, "reaction.json", "reaction_removed.json")
    assert await redis.exists(k.pending(ANA), k.batch(ANA)) == 0
    assert await redis.llen(k.context(ANA)) == 2
    assert 0 < await redis.ttl(k.context(ANA)) <= 86400
    assert (await stats(redis, prefix)).get("event:reaction") == 2
    assert "messages" not in await stats(redis, prefix)

    await push(redis, prefix, "text.json")
    (batch,) = (await claim_now(redis, store, prefix)).batches
    assert [m.id for m in batch.messages] == ["wamid.FIXTURE0001"]
    assert render_context(batch.context) == [
        "[the customer reacted 👍 to the message (id wamid.OUTBOUND0001)]",
        "[the customer removed their reaction to the message (id wamid.OUTBOUND0001)]",
    ]
    assert await redis.exists(k.context(ANA)) == 0, "taken by the batch"


async def test_a_revoke_of_the_only_waiting_message_leaves_no_batch(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push(redis, prefix, "text.json")
    await store.claim(TENANT, 0, "t")
    assert await redis.zscore(k.due, ANA) is not None
    await push(redis, prefix, "revoke.json")
    await store.claim(TENANT, 0, "t")
    assert await redis.zscore(k.due, ANA) is None, "the due entry is cleaned"
    assert await redis.hget(k.burst_shard(burst_shard_of(ANA)), ANA) is None
    assert await redis.exists(k.pending(ANA), k.context(ANA)) == 0
    # Even made due by hand, an empty conversation is never claimed.
    await redis.zadd(k.due, {ANA: 0})
    assert (await store.claim(TENANT, 5, "tok")).batches == []
    assert await redis.exists(k.batch(ANA), k.lock(ANA)) == 0
    assert (await stats(redis, prefix)).get("event:revoke_waiting") == 1


async def test_a_revoke_takes_one_message_out_of_a_waiting_batch(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    await push(redis, prefix, "text.json")
    # A reply quoting the deleted message names its id too: only the message itself goes.
    await push(redis, prefix, "reply_with_context.json", context={"id": "wamid.FIXTURE0001"})
    await push(redis, prefix, "revoke.json")
    (batch,) = (await claim_now(redis, store, prefix)).batches
    assert [m.id for m in batch.messages] == ["wamid.FIXTURE0008"]
    assert batch.context == []


async def test_a_revoke_after_the_answer_is_told_to_the_next_turn(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    await push(redis, prefix, "text.json")
    (batch,) = (await claim_now(redis, store, prefix)).batches
    await push(redis, prefix, "revoke.json")  # while the batch runs
    await store.claim(TENANT, 0, "t")
    assert await store.finish_done(batch)
    await push(redis, prefix, "burst_one_post.json")
    (second,) = (await claim_now(redis, store, prefix)).batches
    assert len(second.messages) == 3
    assert render_context(second.context) == ["[the customer deleted their message 'Hola']"]
    assert (await stats(redis, prefix)).get("event:revoke_answered") == 1


async def test_an_edit_replaces_the_waiting_message(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    await push(redis, prefix, "text.json")
    await push(redis, prefix, "edit.json")
    (batch,) = (await claim_now(redis, store, prefix)).batches
    assert batch.texts == ["Hola, ¿abren el domingo?"]
    assert batch.context == []
    assert (await stats(redis, prefix)).get("event:edit_waiting") == 1


async def test_an_edit_after_the_answer_is_shown_to_the_next_turn(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    await push(redis, prefix, "text.json")
    (batch,) = (await claim_now(redis, store, prefix)).batches
    assert await store.finish_done(batch)
    await push(redis, prefix, "edit.json")
    claim = await claim_now(redis, store, prefix)
    assert claim.batches == [], "an edit alone starts no turn"
    await push(redis, prefix, "burst_one_post.json")
    (second,) = (await claim_now(redis, store, prefix)).batches
    # Answered and gone from every batch: the old text is unknown, its id is shown.
    assert render_context(second.context) == [
        "[the customer edited their message (id wamid.FIXTURE0001);"
        " it now reads: Hola, ¿abren el domingo?]"
    ]


async def test_a_number_change_keeps_memory_and_window_under_the_new_id(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    exchange = orjson.dumps({"user": "Hola", "assistant": "¡Hola Ana!"})
    await redis.rpush(k.memory(ANA), exchange)
    await redis.expire(k.memory(ANA), 5000)
    await redis.set(k.last_inbound(ANA), 1_764_421_000, ex=4000)
    await nothing_starts(redis, store, prefix, "system_changed_number.json", person=NEW_ANA)
    assert await redis.exists(k.memory(ANA), k.last_inbound(ANA)) == 0
    assert await redis.lrange(k.memory(NEW_ANA), 0, -1) == [exchange]
    assert 4000 < await redis.ttl(k.memory(NEW_ANA)) <= 5000, "its TTL kept"
    assert await redis.get(k.last_inbound(NEW_ANA)) == b"1764421000", "the window kept"
    assert (await stats(redis, prefix)).get("event:customer_changed_number") == 1

    await push(redis, prefix, "text.json", **{"from": NEW_ANA})
    (batch,) = (await claim_now(redis, store, prefix, NEW_ANA)).batches
    assert batch.person == NEW_ANA and batch.history == [orjson.loads(exchange)]
    assert render_context(batch.context) == [
        "[the customer changed their phone number; this conversation continues]"
    ]


async def test_identity_changes_and_call_permission_replies_start_nothing(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await nothing_starts(
        redis,
        store,
        prefix,
        "system_identity_changed.json",
        "call_permission_reply.json",
        "request_welcome.json",  # no welcome text: context only
    )
    assert await redis.exists(k.pending(ANA)) == 0
    counters = await stats(redis, prefix)
    assert counters.get("event:customer_identity_changed") == 1
    assert counters.get("event:call_permission_reply") == 1
    assert counters.get("event:request_welcome") == 1
    assert await redis.llen(k.unroutable) == 0
    await push(redis, prefix, "text.json")
    (batch,) = (await claim_now(redis, store, prefix)).batches
    assert render_context(batch.context) == [
        "[the customer's WhatsApp identity changed (a new phone or a reinstall)]",
        "[the customer answered the request to call them: accept]",
        "[the customer opened the chat]",
    ]


# --- real worker processes ---------------------------------------------------------------------
# Their messages carry the current time: a turn checks their age and the 24-hour window.


def now_ts() -> str:
    return str(int(time.time()))


async def test_worker_a_reaction_runs_no_turn_and_the_next_turn_sees_it(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(1, DEBOUNCE_WINDOW_S="0.3", MAX_WAIT_S="3")
    await push(redis, prefix, "reaction.json", timestamp=now_ts())
    await push(redis, prefix, "system_identity_changed.json", timestamp=now_ts())
    k = Keys(prefix).tenant(TENANT)
    await wait_for(lambda: redis.exists(k.context(ANA)), "the reaction taken in")
    await wait_for(lambda: _llen_is(redis, k.context(ANA), 2), "both events taken in", timeout_s=15)
    await push(redis, prefix, "text.json", timestamp=now_ts())
    (turn,) = await wait_for(lambda: records.turns(ANA), "the turn of the text")
    assert turn.ids == ["wamid.FIXTURE0001"]
    assert turn.start["context"] == [
        "[the customer reacted 👍 to the message (id wamid.OUTBOUND0001)]",
        "[the customer's WhatsApp identity changed (a new phone or a reinstall)]",
    ]
    await wait_for(lambda: outbox(redis, prefix, TENANT), "the reply")
    assert len(await records.turns()) == 1, "the reaction ran no turn of its own"


async def test_worker_a_revoked_lone_message_runs_no_turn(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await fleet.start(1, DEBOUNCE_WINDOW_S="1.5", MAX_WAIT_S="5")
    await push(redis, prefix, "text.json", timestamp=now_ts())
    await push(redis, prefix, "revoke.json", timestamp=now_ts())
    await wait_for(
        lambda: _stat_is(redis, prefix, "event:revoke_waiting", 1), "the revoke taken in"
    )
    assert await redis.zscore(k.due, ANA) is None and await redis.exists(k.pending(ANA)) == 0
    # Well past the window the message had: had it stayed, its turn would have run.
    await asyncio.sleep(3)
    await push(redis, prefix, "location.json", timestamp=now_ts())
    (turn,) = await wait_for(lambda: records.turns(ANA), "the next message's turn")
    assert turn.ids == ["wamid.FIXTURE0010"], "the revoked message is in no turn"
    assert turn.start["context"] == []


async def test_worker_request_welcome_sends_the_welcome_text_without_the_brain(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(1, WELCOME_TEXT="¡Hola! ¿En qué te ayudamos?")
    await push(redis, prefix, "request_welcome.json", timestamp=now_ts())
    (reply,) = await wait_for(lambda: outbox(redis, prefix, TENANT), "the welcome")
    assert "¡Hola! ¿En qué te ayudamos?" in orjson.dumps(reply).decode()
    assert await records.turns() == [], "no brain call"
    # The finish that counts the turn follows the send the outbox shows.
    await wait_for(lambda: _stat_is(redis, prefix, "turns", 1), "the welcome's turn counted")


async def _stat_is(redis: Redis, prefix: str, name: str, n: int) -> bool:
    return (await stats(redis, prefix)).get(name) == n


async def _llen_is(redis: Redis, key: str, n: int) -> bool:
    return int(await redis.llen(key)) == n
