"""Human takeover (shared/ops/takeover.py): while a person's pause lasts the claim gives the bot no
turn for them, their messages wait, and the batch runs once the pause lapses or is lifted; an
echo from the WhatsApp Business app pauses the person and enters their memory as written by a
human; a WhatsApp review for a reason that needs a person pauses them, requeue and drop lift it.
The scripts run on the real Redis, through the worker's own store and the ops page's API."""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from receiver.providers.whatsapp import parse_payload
from shared import events
from shared.conversation.batch import Batch
from shared.conversation.burst_shards import burst_shard_of
from shared.conversation.presentation import HUMAN_REPLY_NOTE, NO_NEW_MESSAGE, Quotes
from shared.keys import KeyError_, Keys
from shared.ops import takeover
from shared.ops.review import ReviewList
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.support.helpers import counters, fixture_json
from tests.worker.support import ingest_one, run_module
from worker.brains.prompt import render_messages
from worker.conversation_store import ConversationStore

TENANT = "106500000000001"  # the fixtures' phone_number_id
ANA = "5491155550001"
ECHO_TS = 1764421260  # the echo fixture's timestamp
_SCRIPTS = Scripts()


@pytest.fixture
def store(redis: Redis, settings: Settings, prefix: str) -> ConversationStore:
    s = settings.with_overrides(
        key_prefix=prefix, debounce_window_s=0.05, max_wait_s=0.05, human_pause_s=60
    )
    return ConversationStore(s, _SCRIPTS, GroupCommitter(redis, _SCRIPTS))


async def ingest(redis: Redis, prefix: str, event: dict[str, Any]) -> None:
    k = Keys(prefix).tenant(TENANT)
    assert await ingest_one(redis, k, event)


async def push(redis: Redis, prefix: str, message_id: str, text: str, ts: int = 0) -> None:
    await ingest(
        redis,
        prefix,
        events.message_event(
            channel="whatsapp",
            person=ANA,
            message_id=message_id,
            type="text",
            text=text,
            ts=ts or int(time.time()),
            received_ms=int(time.time() * 1000),
            raw={"id": message_id, "type": "text", "text": {"body": text}},
        ),
    )


async def push_echo(redis: Redis, prefix: str, echo_id: str, text: str, ts: int = ECHO_TS) -> None:
    """An echo as the receiver makes it of Meta's `smb_message_echoes` body (the fixture)."""
    doc = copy.deepcopy(fixture_json("whatsapp/echo_text.json"))
    item = doc["entry"][0]["changes"][0]["value"]["message_echoes"][0]
    item.update(id=echo_id, text={"body": text}, timestamp=str(ts))
    parsed = parse_payload(doc, int(time.time() * 1000))
    assert parsed.problems == []
    for event in parsed.events[TENANT]:
        await ingest(redis, prefix, event)


async def claim_due(store: ConversationStore) -> list[Batch]:
    """Take the inbox in, wait out the debounce, claim what is due."""
    await store.claim(TENANT, 0, "intake")
    await asyncio.sleep(0.1)
    return (await store.claim(TENANT, 5, "tok")).batches


async def memory(redis: Redis, prefix: str) -> list[dict[str, Any]]:
    raw = await redis.lrange(Keys(prefix).tenant(TENANT).memory(ANA), 0, -1)
    return [orjson.loads(x) for x in raw]


async def test_a_paused_person_gets_no_turn_until_resumed_and_then_at_once(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    keys = Keys(prefix)
    k = keys.tenant(TENANT)
    pause = await takeover.pause(redis, keys, TENANT, ANA, by="alice", why="by phone", seconds=60)
    assert (pause["by"], pause["why"]) == ("alice", "by phone")
    assert pause["until_ms"] - pause["since_ms"] == 60_000
    assert await takeover.pause_state(redis, keys, TENANT, ANA) == pause
    assert 59_000 < await redis.pttl(k.human(ANA)) <= 60_000, "lapses by itself"

    await push(redis, prefix, "wamid.P1", "hola")
    await push(redis, prefix, "wamid.P2", "¿hay alguien?")
    claim_batches = await claim_due(store)
    assert claim_batches == [], "a paused person gets no turn"
    due = await redis.zscore(k.due, ANA)
    assert due is not None and abs(due - pause["until_ms"]) < 1000, "due when the pause ends"
    assert len(await redis.lrange(k.pending(ANA), 0, -1)) == 2, "the messages keep waiting"
    assert await redis.exists(k.batch(ANA), k.lock(ANA)) == 0
    assert await redis.zscore(k.running, ANA) is None

    await redis.delete(keys.relay_queue)
    assert await takeover.resume(redis, keys, TENANT, ANA, by="alice") is True
    assert await takeover.pause_state(redis, keys, TENANT, ANA) is None
    assert await redis.zrange(keys.relay_queue, 0, -1) == [TENANT.encode()], "relayed"
    (batch,) = (await store.claim(TENANT, 5, "tok")).batches
    assert batch.texts == ["hola", "¿hay alguien?"]
    assert await takeover.resume(redis, keys, TENANT, ANA, by="alice") is False, "none left"


async def test_a_pause_that_lapses_lets_the_waiting_batch_run(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    keys = Keys(prefix)
    await takeover.pause(redis, keys, TENANT, ANA, by="bob", why="", seconds=0.6)
    await push(redis, prefix, "wamid.L1", "hola")
    assert await claim_due(store) == []
    claim = await store.claim(TENANT, 5, "tok")
    assert claim.batches == [] and claim.now_ms < claim.next_ms <= claim.now_ms + 600
    await asyncio.sleep(max(0, (claim.next_ms - claim.now_ms) / 1000) + 0.2)
    (batch,) = (await store.claim(TENANT, 5, "tok")).batches
    assert batch.texts == ["hola"], "answered by the bot once the pause lapsed"


async def test_a_batch_waiting_for_a_retry_waits_for_the_pause_too(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    keys = Keys(prefix)
    await push(redis, prefix, "wamid.R1", "hola")
    (batch,) = await claim_due(store)
    assert await store.finish_retry(batch, 0, "boom")
    await takeover.pause(redis, keys, TENANT, ANA, by="carol", why="", seconds=60)
    assert (await store.claim(TENANT, 5, "tok")).batches == [], "no retry while paused"
    assert await takeover.resume(redis, keys, TENANT, ANA, by="carol")
    (again,) = (await store.claim(TENANT, 5, "tok")).batches
    assert again.id == batch.id and again.attempt == 1


async def test_a_pause_set_during_a_turn_leaves_it_and_holds_the_next_batch(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    keys = Keys(prefix)
    k = keys.tenant(TENANT)
    await push(redis, prefix, "wamid.T1", "hola")
    (batch,) = await claim_due(store)
    await takeover.pause(redis, keys, TENANT, ANA, by="dan", why="", seconds=60)
    await push(redis, prefix, "wamid.T2", "sigo acá")
    await store.claim(TENANT, 0, "intake")
    # Resuming while the turn runs lifts the pause but leaves the turn's schedule alone.
    assert await takeover.resume(redis, keys, TENANT, ANA, by="dan")
    await takeover.pause(redis, keys, TENANT, ANA, by="dan", why="", seconds=60)
    assert await store.finish_done(batch), "the running turn ends as it would have"
    await asyncio.sleep(0.1)
    assert (await store.claim(TENANT, 5, "tok")).batches == [], "the next batch waits"
    assert await redis.lrange(k.pending(ANA), 0, -1) != []


async def test_bad_pauses_are_refused_and_change_nothing(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    """Bad input: a duration of 0, below 0 or over a year is a TakeoverError; a person or
    tenant id with hash-tag braces a KeyError_; nothing is written either way."""
    keys = Keys(prefix)
    for seconds in (0, -5, 400 * 86400):
        with pytest.raises(takeover.TakeoverError, match="a pause lasts"):
            await takeover.pause(redis, keys, TENANT, ANA, by="x", why="", seconds=seconds)
    with pytest.raises(KeyError_):
        await takeover.pause(redis, keys, TENANT, "{bad}", by="x", why="", seconds=5)
    with pytest.raises(KeyError_):
        await takeover.resume(redis, keys, "{bad}", ANA, by="x")
    assert await redis.keys(f"{prefix}:*") == []
    assert await takeover.resume(redis, keys, TENANT, ANA, by="x") is False
    assert await redis.keys(f"{prefix}:*") == [], "resuming nobody writes nothing"


async def test_an_echo_pauses_the_person_answers_the_waiting_messages_and_starts_no_turn(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    keys = Keys(prefix)
    k = keys.tenant(TENANT)
    await push(redis, prefix, "wamid.E1", "¿tienen talle M?", ts=ECHO_TS - 30)
    await push(redis, prefix, "wamid.E2", "en azul", ts=ECHO_TS - 20)
    await store.claim(TENANT, 0, "intake")
    await push_echo(redis, prefix, "wamid.ECHO1", "Sí, tenemos talle M en azul.")
    await push(redis, prefix, "wamid.E3", "¡genial! ¿precio?", ts=ECHO_TS + 5)
    await asyncio.sleep(0.1)
    claim = await store.claim(TENANT, 5, "tok")
    assert claim.batches == [], "no turn: the person is paused"

    pause = await takeover.pause_state(redis, keys, TENANT, ANA)
    assert pause is not None and pause["by"] == "business_app"
    assert 59_000 < await redis.pttl(k.human(ANA)) <= 60_000, "HUMAN_PAUSE_S"
    assert await memory(redis, prefix) == [
        {
            "user": "¿tienen talle M?\nen azul",
            "assistant": "Sí, tenemos talle M en azul.",
            "by": "human",
            "echo": True,
            "ids": ["wamid.E1", "wamid.E2"],
            "out": ["wamid.ECHO1"],
        }
    ], "the human answered the messages written before the echo"
    pending = [orjson.loads(x)["id"] for x in await redis.lrange(k.pending(ANA), 0, -1)]
    assert pending == ["wamid.E3"], "a message written after the echo still waits"
    counts = counters(await redis.hgetall(k.stats))
    assert counts["event:echo"] == 1 and counts["messages"] == 3

    await push_echo(redis, prefix, "wamid.ECHO2", "Sale 20 mil.", ECHO_TS + 10)
    await store.claim(TENANT, 0, "intake")
    assert await redis.exists(k.pending(ANA), k.due) == 0, "answered: nothing due"
    assert await redis.hget(k.burst_shard(burst_shard_of(ANA)), ANA) is None
    await push_echo(redis, prefix, "wamid.ECHO3", "¿Te lo separo?", ECHO_TS + 11)
    await store.claim(TENANT, 0, "intake")
    *_, last = await memory(redis, prefix)
    assert last == {
        "user": "¡genial! ¿precio?",
        "assistant": "Sale 20 mil.\n¿Te lo separo?",
        "by": "human",
        "echo": True,
        "ids": ["wamid.E3"],
        "out": ["wamid.ECHO2", "wamid.ECHO3"],
    }, "echoes in a row are one exchange"


async def test_the_business_writing_first_is_remembered_and_an_echo_never_shortens_a_pause(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    keys = Keys(prefix)
    await takeover.pause(redis, keys, TENANT, ANA, by="alice", why="long", seconds=7200)
    await push_echo(redis, prefix, "wamid.ECHO4", "Hola Ana, ¿pudiste pasar?")
    await store.claim(TENANT, 0, "intake")
    pause = await takeover.pause_state(redis, keys, TENANT, ANA)
    assert pause is not None and pause["by"] == "alice", "the longer pause is kept"
    (entry,) = await memory(redis, prefix)
    assert entry == {
        "user": "",
        "assistant": "Hola Ana, ¿pudiste pasar?",
        "by": "human",
        "echo": True,
        "out": ["wamid.ECHO4"],
    }
    # What the AI is shown of it, once the bot answers her again.
    await takeover.resume(redis, keys, TENANT, ANA, by="alice")
    await push(redis, prefix, "wamid.F1", "sí, mañana paso")
    (batch,) = await claim_due(store)
    assert [(m["role"], m["content"][-1]["text"]) for m in render_messages(batch, 10)] == [
        ("user", NO_NEW_MESSAGE),
        ("assistant", f"{HUMAN_REPLY_NOTE}\nHola Ana, ¿pudiste pasar?"),
        ("user", "sí, mañana paso"),
    ]
    quoted = Quotes(batch).of("wamid.ECHO4")
    assert quoted == 'the message "Hola Ana, ¿pudiste pasar?" a person of the business wrote'


async def test_memory_turns_zero_keeps_no_echo_but_the_tenants_pause_applies(
    redis: Redis, settings: Settings, prefix: str
) -> None:
    tenants = {TENANT: {"human_pause_s": 5}}
    s = settings.with_overrides(key_prefix=prefix, memory_turns=0, tenants=tenants)
    quiet = ConversationStore(s, _SCRIPTS, GroupCommitter(redis, _SCRIPTS))
    await push_echo(redis, prefix, "wamid.ECHO5", "hola")
    await quiet.claim(TENANT, 0, "intake")
    assert await memory(redis, prefix) == []
    assert await takeover.pause_state(redis, Keys(prefix), TENANT, ANA) is not None
    assert 0 < await redis.pttl(Keys(prefix).tenant(TENANT).human(ANA)) <= 5000, "its override"


def test_only_whatsapp_reviews_for_reasons_about_the_conversation_pause() -> None:
    assert takeover.pauses_for_review("whatsapp", "a_custom_brains_reason")
    assert not takeover.pauses_for_review("chatwoot", "ai_hand_over"), "handed over in Chatwoot"
    for reason in takeover.NO_PAUSE_REVIEW_REASONS:
        assert not takeover.pauses_for_review("whatsapp", reason)


@pytest.mark.parametrize(
    ("reason", "pauses"),
    [
        ("ai_hand_over", True),
        ("delivery_unknown", True),
        ("max_attempts", True),
        ("too_old", False),
        ("window_closed", False),
        ("token_expired", False),
    ],
)
async def test_a_review_pauses_the_person_for_the_reasons_that_need_one(
    redis: Redis, store: ConversationStore, prefix: str, reason: str, pauses: bool
) -> None:
    keys = Keys(prefix)
    await push(redis, prefix, "wamid.V1", "hola")
    (batch,) = await claim_due(store)
    assert await store.finish_review(batch, reason, "por qué", batch.claimed_ms)
    pause = await takeover.pause_state(redis, keys, TENANT, ANA)
    (item,) = await ReviewList(redis, keys, _SCRIPTS).items(TENANT)
    if not pauses:
        assert pause is None and "human_pause_ms" not in item
        return
    assert pause is not None and pause["by"] == f"review:{reason}" and pause["why"] == "por qué"
    assert item["human_pause_ms"] == 60_000
    await push(redis, prefix, "wamid.V2", "¿y?")
    assert await claim_due(store) == [], "the next messages wait for the human"


async def test_requeue_and_drop_lift_the_pause(
    redis: Redis, store: ConversationStore, prefix: str
) -> None:
    keys = Keys(prefix)
    review = ReviewList(redis, keys, _SCRIPTS)
    await push(redis, prefix, "wamid.Q1", "hola")
    (batch,) = await claim_due(store)
    assert await store.finish_review(batch, "ai_hand_over", "pide una persona", 0)
    (item,) = await review.items(TENANT)
    await review.requeue(TENANT, item["id"])
    assert await takeover.pause_state(redis, keys, TENANT, ANA) is None
    (requeued,) = (await store.claim(TENANT, 5, "tok")).batches
    assert requeued.requeued and requeued.texts == ["hola"]
    assert await store.finish_review(requeued, "max_attempts", "otra vez", 0)

    await push(redis, prefix, "wamid.Q2", "¿hola?")
    assert await claim_due(store) == [], "paused again by the second review"
    (item,) = await review.items(TENANT)
    await redis.delete(keys.relay_queue)
    await review.drop(TENANT, item["id"])
    assert await takeover.pause_state(redis, keys, TENANT, ANA) is None
    assert await redis.zrange(keys.relay_queue, 0, -1) == [TENANT.encode()]
    (waited,) = (await store.claim(TENANT, 5, "tok")).batches
    assert waited.texts == ["¿hola?"], "what waited through the pause is answered"


@pytest.mark.cluster
async def test_the_cli_pauses_shows_and_resumes(redis: Redis, settings: Settings) -> None:
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "REDIS_CLUSTER": str(settings.redis_cluster).lower(),
        "HUMAN_PAUSE_S": "120",
    }
    base = ["--tenant", TENANT, "--person", ANA]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_module("worker.takeover", *args, env=env)

    assert cli("status", *base).returncode == 1
    paused = cli("pause", *base, "--why", "llamando", "--by", "alice")
    assert paused.returncode == 0 and "paused until" in paused.stdout, paused.stderr
    k = Keys(settings.key_prefix).tenant(TENANT)
    assert 110_000 < await redis.pttl(k.human(ANA)) <= 120_000, "HUMAN_PAUSE_S by default"
    shown = cli("status", *base)
    assert shown.returncode == 0 and "'alice'" in shown.stdout and "'llamando'" in shown.stdout
    assert cli("pause", *base, "--seconds", "30").returncode == 0
    assert 20_000 < await redis.pttl(k.human(ANA)) <= 30_000, "a pause by hand replaces one"
    assert cli("resume", *base).returncode == 0
    again = cli("resume", *base)
    assert again.returncode == 1 and "was not paused" in again.stderr
    bad = cli("pause", *base, "--seconds", "0")
    assert bad.returncode == 2 and "a pause lasts" in bad.stderr
    braces = cli("pause", "--tenant", TENANT, "--person", "{x}")
    assert braces.returncode == 2 and "cannot be used in a Redis key" in braces.stderr
    assert cli("pause", "--tenant", TENANT).returncode == 2, "argparse: --person missing"
    assert await redis.exists(k.human(ANA)) == 0
