"""The bot's silence in the intake (shared/lua/claim.lua with lib/silence.lua, and
shared/lua/silence.lua) on a real Redis: Chatwoot bodies parsed by the receiver's code, stored
by the `ingest` script as the receiver does, taken in and claimed through the worker's
ConversationStore. What waits when the silence begins goes to the memory first, in order; a
batch waiting for a retry is folded in too, one with a reply or a review begun is not; the
bot's own replies are told from an agent's; the memory entry is capped and read back as an
exchange; a customer's `pending` message ends the silence only once the conversation moved."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from receiver.providers.chatwoot import parse_body
from scripts.webhooks import agent_user, conversation_webhook, message_created
from shared import events
from shared.conversation.batch import Batch
from shared.conversation.burst_shards import burst_shard_of
from shared.conversation.human_memory import HEADER, SILENT_ANSWER
from shared.keys import Keys
from shared.ops import live_state
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.support.helpers import counters
from tests.worker.support import ingest_one
from worker.conversation_store import SILENCE_TTL_S, Claim, ConversationStore
from worker.inspect import render_person

TENANT, PERSON = "cw-1-3", "42"
LAURA = agent_user(12, "Laura Gómez")
_SCRIPTS = Scripts()
_ids = iter(range(7000, 8000))


@pytest.fixture
def store(redis: Redis, settings: Settings, prefix: str) -> ConversationStore:
    s = settings.with_overrides(key_prefix=prefix, debounce_window_s=30, max_wait_s=60)
    return ConversationStore(s, _SCRIPTS, GroupCommitter(redis, _SCRIPTS))


@pytest.fixture
def prefix() -> str:
    import uuid

    return f"si{uuid.uuid4().hex[:8]}"


async def push(redis: Redis, prefix: str, payload: dict[str, Any]) -> None:
    parsed = parse_body(orjson.dumps(payload), 1_764_500_000_000)
    assert parsed.problems == [] and parsed.ignored_fields == [], parsed
    k = Keys(prefix).tenant(TENANT)
    for event in parsed.events[TENANT]:
        assert await ingest_one(redis, k, event)


def customer(text: str, status: str = "open", at: float | None = None, **more: Any) -> dict:
    return message_created(
        message_id=next(_ids), content=text, conversation=42, status=status, created_at=at, **more
    )


def agent(text: str) -> dict[str, Any]:
    return message_created(
        message_id=next(_ids),
        content=text,
        conversation=42,
        message_type="outgoing",
        sender=LAURA,
        status="open",
    )


async def claim(store: ConversationStore, redis: Redis, prefix: str, due_now: bool = True) -> Claim:
    k = Keys(prefix).tenant(TENANT)
    await store.claim(TENANT, 0, "t")
    if due_now and await redis.zscore(k.due, PERSON) is not None:
        await redis.zadd(k.due, {PERSON: 0})
    return await store.claim(TENANT, 5, "tok")


async def claimed(
    store: ConversationStore, redis: Redis, prefix: str, text: str, **fields: Any
) -> Batch:
    """The customer writes `text` (`fields`: the rest of `customer`'s), and it is claimed at
    once: the one batch."""
    await push(redis, prefix, customer(text, **fields))
    (batch,) = (await claim(store, redis, prefix)).batches
    return batch


async def memory(redis: Redis, prefix: str) -> list[dict[str, Any]]:
    k = Keys(prefix).tenant(TENANT)
    return [orjson.loads(x) for x in await redis.lrange(k.memory(PERSON), 0, -1)]


async def stats(redis: Redis, prefix: str) -> dict[str, int]:
    raw = await redis.hgetall(Keys(prefix).tenant(TENANT).stats)
    return counters(raw)


async def back_to_the_bot(redis: Redis, prefix: str) -> None:
    """Conversation 42 moved from open (with an agent) back to pending (the bot's)."""
    await push(
        redis,
        prefix,
        conversation_webhook(
            "conversation_status_changed",
            conversation=42,
            changed_attributes={"status": ("open", "pending")},
        ),
    )


def lines(entry: dict[str, Any]) -> list[tuple[str, str]]:
    return [(line["by"], line["text"]) for line in entry["lines"]]


async def test_what_waits_when_an_agent_writes_goes_to_the_memory_first_and_no_turn_runs(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push(redis, prefix, customer("hola"))
    await push(redis, prefix, customer("¿hay turno?"))
    await claim(store, redis, prefix, due_now=False)  # taken in, waiting for the window
    assert await redis.llen(k.pending(PERSON)) == 2
    await push(redis, prefix, agent("Hola, soy Laura: sí, el sábado."))
    await push(redis, prefix, customer("genial"))
    result = await claim(store, redis, prefix)
    assert result.batches == [] and result.next_ms == -1
    assert await redis.exists(k.pending(PERSON), k.batch(PERSON)) == 0
    assert (
        await redis.zscore(k.due, PERSON) is None
        and await redis.hget(k.burst_shard(burst_shard_of(PERSON)), PERSON) is None
    )
    (entry,) = await memory(redis, prefix)
    assert lines(entry) == [
        ("customer", "hola"),
        ("customer", "¿hay turno?"),
        ("agent", "Hola, soy Laura: sí, el sábado."),
        ("customer", "genial"),
    ]
    assert len(entry["ids"]) == 3 and entry["lines"][2]["name"] == "Laura Gómez"
    record = orjson.loads(await redis.get(k.silent(PERSON)))
    assert (record["why"], record["by"]) == ("agent", "Laura Gómez")
    assert SILENCE_TTL_S - 60 < await redis.ttl(k.silent(PERSON)) <= SILENCE_TTL_S
    assert 0 < await redis.ttl(k.memory(PERSON)) <= 86400
    counts = await stats(redis, prefix)
    assert counts["event:agent_message"] == 1 and counts["silent_messages"] == 1
    assert counts["messages"] == 3, "the customer's messages are counted as messages"

    # The next claim reads the stretch back as an exchange (shared/conversation/human_memory.py).
    await back_to_the_bot(redis, prefix)
    batch = await claimed(store, redis, prefix, "¿y el domingo?", status="pending")
    (exchange,) = batch.history
    assert exchange["header"] == HEADER and exchange["assistant"] == SILENT_ANSWER
    assert exchange["user"].splitlines() == [
        "The customer (Ana Pérez): hola",
        "The customer (Ana Pérez): ¿hay turno?",
        "Laura Gómez, a person of the business (not you): Hola, soy Laura: sí, el sábado.",
        "The customer (Ana Pérez): genial",
    ]
    assert (await stats(redis, prefix))["speak:pending"] == 1


async def test_a_batch_waiting_for_a_retry_is_folded_in_one_with_a_reply_is_not(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    batch = await claimed(store, redis, prefix, "hola")
    assert await store.finish_retry(batch, 60, "AI unavailable", count_attempt=False)
    await push(redis, prefix, agent("Te atiendo yo."))
    await claim(store, redis, prefix)
    assert await redis.exists(k.batch(PERSON)) == 0 and await redis.zscore(k.due, PERSON) is None
    assert [lines(e) for e in await memory(redis, prefix)] == [
        [("customer", "hola"), ("agent", "Te atiendo yo.")]
    ]

    # Back with the bot; a batch whose reply is stored is not folded: its parts still go out.
    await back_to_the_bot(redis, prefix)
    batch = await claimed(store, redis, prefix, "otra", status="pending")
    assert await store.save_reply(batch, "respuesta") == "respuesta"
    assert await store.finish_retry(batch, 0.001, "send failed")
    await push(redis, prefix, agent("Ya te respondo yo."))
    (resumed,) = (await claim(store, redis, prefix)).batches
    assert resumed.id == batch.id and resumed.fields["reply"] == "respuesta"


async def test_the_bots_own_reply_coming_back_from_a_users_token_is_not_an_agents(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    bot = agent_user(5, "Cuenta API")
    batch = await claimed(store, redis, prefix, "hola")
    assert await store.save_reply(batch, "Primera parte.\n\nSegunda parte.") is not None
    # The echo of part 0 overtakes its record: the stored reply holds its text.
    echo = message_created(
        message_id=60001,
        content="Primera parte.",
        conversation=42,
        message_type="outgoing",
        sender=bot,
        status="open",
    )
    await push(redis, prefix, echo)
    await claim(store, redis, prefix)
    assert await store.record_part(batch, 0, "60001")
    assert await store.finish_done(batch, b"", (1, "60002"))
    # Later echoes: the recorded ids.
    for message_id, text in [(60001, "Primera parte."), (60002, "Segunda parte.")]:
        late = message_created(
            message_id=message_id,
            content=text,
            conversation=42,
            message_type="outgoing",
            sender=bot,
            status="open",
        )
        late["id"] = message_id
        parsed = parse_body(orjson.dumps({**late, "content": text}), 1)
        (event,) = parsed.events[TENANT]
        await redis.lpush(k.inbox, events.encode(event))  # a redelivery past the dedupe
    await claim(store, redis, prefix)
    counts = await stats(redis, prefix)
    assert counts["event:own_reply"] == 3 and "event:agent_message" not in counts
    assert await redis.exists(k.silent(PERSON)) == 0 and await memory(redis, prefix) == []


async def test_a_pending_message_ends_the_silence_only_once_the_conversation_moved(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    await push(redis, prefix, agent("Hola, soy Laura."))  # in a pending conversation
    later = 4_000_000_000.0  # written long after the silence began
    await push(redis, prefix, customer("gracias", status="pending", at=later))
    assert (await claim(store, redis, prefix)).batches == [], "an agent wrote: still silent"
    await push(redis, prefix, customer("¿sigue?", status="pending", at=later + 1, assignee=LAURA))
    assert (await claim(store, redis, prefix)).batches == [], "assigned: still silent"
    await push(redis, prefix, customer("hola?", status="open", at=later + 2))  # it moved
    assert (await claim(store, redis, prefix)).batches == []
    batch = await claimed(store, redis, prefix, "¿me ayudás?", status="pending", at=later + 3)
    assert [m.text for m in batch.messages] == ["¿me ayudás?"]
    assert await redis.exists(k.silent(PERSON)) == 0
    counts = await stats(redis, prefix)
    assert counts["silent_messages"] == 3 and counts["speak:pending"] == 1


async def test_the_hand_over_silences_and_folds_in_what_waits_and_a_memory_entry_is_capped(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    k = Keys(prefix).tenant(TENANT)
    batch = await claimed(store, redis, prefix, "uno")
    await push(redis, prefix, customer("dos"))
    await claim(store, redis, prefix, due_now=False)
    await store.silence(batch, "hand_over")
    await store.silence(batch, "hand_over")  # a resumed hand-over: the same silence
    assert await redis.exists(k.pending(PERSON)) == 0
    assert orjson.loads(await redis.get(k.silent(PERSON)))["why"] == "hand_over"
    state = await live_state.person(redis, Keys(prefix), TENANT, PERSON)
    assert state["silent"]["why"] == "hand_over"
    assert any(
        line.startswith("  silent      a person handles it (hand_over)")
        for line in render_person(state)
    )
    assert (await stats(redis, prefix))["silence:hand_over"] == 2
    for i in range(45):
        await push(redis, prefix, customer(f"m{i}"))
    await claim(store, redis, prefix)
    (entry,) = await memory(redis, prefix)
    assert len(entry["lines"]) == 40 and entry["lines"][-1]["text"] == "m44"
    assert len(entry["ids"]) == 40
    # Read back as an exchange: custom brains and the prompt see the last 40 lines.
    row = [
        PERSON.encode(),
        b"t",
        b"id",
        b"x",
        b"messages",
        b"[]",
        b"history",
        orjson.dumps([entry]),
    ]
    (exchange,) = Batch.from_claim(TENANT, row).history
    assert exchange["user"].splitlines()[-1] == "The customer (Ana Pérez): m44"
