"""Replies by hand (worker/manual_reply.py): a person of the business answers through the
tenant's sender, against the real Redis and the Graph API stand-in. The reply never overlaps a
worker's turn (invariant 3); what it answered leaves the pending list and enters the memory,
marked as written by a person, so the bot neither answers it again nor forgets it. Every bad
input is refused with a sentence and changes nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.conversation.burst_shards import burst_shard_of
from shared.conversation.presentation import HUMAN_REPLY_NOTE, NO_NEW_MESSAGE
from shared.keys import Keys
from shared.ops import audit, takeover
from shared.ops.manual_reply import MAX_TEXT_CHARS, ManualReplies, ManualReplyError
from shared.senders.split import split_reply
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.delivery.support import (
    DAY_S,
    PLAIN_TENANT,
    TEMPLATE,
    TENANT,
    THREE_PARTS,
    InProcessWorkers,
    ai_requests,
    outbound,
    said,
)
from tests.support.helpers import TENANT_TOKEN
from tests.worker.support import push_message, push_status, run_module, wait_for
from worker.conversation_store import ConversationStore

PERSON = "5491155550071"
TEXT = "Hola, soy Ana de Turnos SRL: su turno del jueves quedó confirmado."


@pytest.fixture
def settings(env: dict[str, str]) -> Settings:  # the workers' configuration, not the default
    return Settings.from_env(env)


@pytest.fixture
async def replies(redis: Redis, prefix: str, settings: Settings) -> AsyncIterator[ManualReplies]:
    made = ManualReplies(redis, Keys(prefix), Scripts(), settings)
    try:
        yield made
    finally:
        await made.aclose()


async def take_in(redis: Redis, settings: Settings, tenant: str = TENANT) -> None:
    """The intake a worker's claim does (claim.lua, claiming nothing): inbox -> pending."""
    store = ConversationStore(settings, Scripts(), GroupCommitter(redis, Scripts()))
    await store.claim(tenant, 0, "test")


async def waiting(
    redis: Redis, prefix: str, *ids: str, tenant: str = TENANT, settings: Settings
) -> None:
    """Messages `ids` pushed as the receiver does and taken in: pending, due, in a burst."""
    for i, message_id in enumerate(ids):
        await push_message(
            redis, prefix, PERSON, message_id, f"mensaje {i}", tenant=tenant, wake=False
        )
    await take_in(redis, settings, tenant)


async def conversation(redis: Redis, prefix: str, tenant: str = TENANT) -> dict[str, Any]:
    """What a reply by hand may change of the person's conversation."""
    k = Keys(prefix).tenant(tenant)
    stats = await redis.hgetall(k.stats)
    return {
        "lock": await redis.get(k.lock(PERSON)),
        "pending": await redis.lrange(k.pending(PERSON), 0, -1),
        "due": await redis.zscore(k.due, PERSON) is not None,
        "burst": await redis.hget(k.burst_shard(burst_shard_of(PERSON)), PERSON),
        "memory": await redis.lrange(k.memory(PERSON), 0, -1),
        "outbound": [
            (key, await redis.hgetall(key))
            async for key in redis.scan_iter(match=k.outbound_book_pattern)
        ],
        "manual_replies": stats.get(b"manual_replies"),
    }


async def memory(redis: Redis, prefix: str, tenant: str = TENANT) -> list[dict[str, Any]]:
    raw = await redis.lrange(Keys(prefix).tenant(tenant).memory(PERSON), 0, -1)
    return [orjson.loads(r) for r in raw]


# --- what a reply by hand does ----------------------------------------------------------------
async def test_a_reply_by_hand_reaches_the_person_and_answers_what_waited(
    redis: Redis,
    prefix: str,
    replies: ManualReplies,
    settings: Settings,
    graph: GraphApiStandIn,
) -> None:
    graph.configure(access_tokens=TENANT_TOKEN)  # only the tenant's own token is accepted
    await waiting(redis, prefix, "wamid.m1", "wamid.m2", settings=settings)

    result = await replies.reply(TENANT, PERSON, f"  {TEXT}\n", by="ana")

    (sent,) = graph.sent_texts(PERSON)
    assert sent.body == TEXT and sent.phone_number_id == TENANT
    assert result.provider_ids == [sent.wamid]
    assert not result.template and result.answered == 2
    after = await conversation(redis, prefix)
    assert after["lock"] is None and after["pending"] == []
    assert not after["due"] and after["burst"] is None, "nothing waits: no turn will run"
    assert after["manual_replies"] == b"1"
    (remembered,) = await memory(redis, prefix)
    assert remembered["by"] == "human" and remembered["who"] == "ana"
    assert remembered["assistant"] == TEXT
    assert remembered["user"] == "mensaje 0\nmensaje 1"
    assert remembered["ids"] == ["wamid.m1", "wamid.m2"]
    assert remembered["out"] == [sent.wamid]
    record = await outbound(redis, prefix, sent.wamid)
    assert record["person"] == PERSON and record["part"] == "0"
    assert record["batch"].startswith("manual-")

    # Meta's statuses apply to it as to a turn's part.
    await push_status(redis, prefix, PERSON, sent.wamid, "delivered", tenant=TENANT)
    await take_in(redis, settings)
    assert (await outbound(redis, prefix, sent.wamid))["status"] == "delivered"


async def test_a_long_reply_goes_out_in_the_parts_a_turn_would_send(
    redis: Redis, prefix: str, replies: ManualReplies, settings: Settings, graph: GraphApiStandIn
) -> None:
    await waiting(redis, prefix, "wamid.l1", settings=settings)
    result = await replies.reply(TENANT, PERSON, THREE_PARTS, by="ana")

    sent = graph.sent_texts(PERSON)
    assert [m.body for m in sent] == split_reply(THREE_PARTS) and len(sent) == 3
    assert result.provider_ids == [m.wamid for m in sent]
    for index, message in enumerate(sent):
        assert (await outbound(redis, prefix, message.wamid))["part"] == str(index)
    (remembered,) = await memory(redis, prefix)
    assert remembered["assistant"] == "\n\n".join(split_reply(THREE_PARTS))


async def test_with_nothing_waiting_the_reply_still_enters_the_memory(
    redis: Redis, prefix: str, replies: ManualReplies, settings: Settings, graph: GraphApiStandIn
) -> None:
    await waiting(redis, prefix, "wamid.n1", settings=settings)
    await replies.reply(TENANT, PERSON, "Primera respuesta.", by="ana")
    result = await replies.reply(TENANT, PERSON, "Y una cosa más.", by="luis")

    assert result.answered == 0
    assert [m.body for m in graph.sent_texts(PERSON)] == ["Primera respuesta.", "Y una cosa más."]
    first, second = await memory(redis, prefix)
    assert first["assistant"] == "Primera respuesta." and first["ids"] == ["wamid.n1"]
    assert second["user"] == "" and second["ids"] == [] and second["who"] == "luis"
    assert second["assistant"] == "Y una cosa más."


async def test_outside_the_window_the_tenants_template_goes_out_instead(
    redis: Redis, prefix: str, replies: ManualReplies, settings: Settings, graph: GraphApiStandIn
) -> None:
    old = int(time.time()) - DAY_S - 600
    await push_message(redis, prefix, PERSON, "wamid.o1", "hola", ts=old, wake=False)
    await take_in(redis, settings)

    result = await replies.reply(TENANT, PERSON, TEXT, by="ana")

    (template,) = graph.sent_templates(PERSON)
    assert template.template_name == TEMPLATE
    assert graph.sent_texts() == [], "a free-form text cannot reach the person any more"
    assert result.template and result.provider_ids == [template.wamid] and result.answered == 1
    (remembered,) = await memory(redis, prefix)
    assert remembered["template"] == TEMPLATE and TEMPLATE in remembered["assistant"]
    assert TEXT not in remembered["assistant"], "the text never reached the person"
    assert (await outbound(redis, prefix, template.wamid))["part"] == "0"


async def test_meta_saying_the_window_closed_sends_the_template(
    redis: Redis, prefix: str, replies: ManualReplies, settings: Settings, graph: GraphApiStandIn
) -> None:
    """Our clock says open, Meta says 131047: as the worker does, the template goes out."""
    await waiting(redis, prefix, "wamid.c1", settings=settings)
    graph.fail_recipient(PERSON, 131047, kinds=["text"])
    result = await replies.reply(TENANT, PERSON, TEXT, by="ana")
    (template,) = graph.sent_templates(PERSON)
    assert result.template and result.provider_ids == [template.wamid]


# --- bad input: refused, nothing changed ------------------------------------------------------
BAD_INPUT = [
    ("", "the reply is empty"),
    ("  \n\t ", "the reply is empty"),
    ("x" * (MAX_TEXT_CHARS + 1), f"more than {MAX_TEXT_CHARS}"),
]


@pytest.mark.parametrize(("text", "why"), BAD_INPUT)
async def test_an_empty_or_overlong_reply_is_refused(
    redis: Redis,
    prefix: str,
    replies: ManualReplies,
    settings: Settings,
    graph: GraphApiStandIn,
    text: str,
    why: str,
) -> None:
    await waiting(redis, prefix, "wamid.b1", settings=settings)
    before = await conversation(redis, prefix)
    with pytest.raises(ManualReplyError, match=why):
        await replies.reply(TENANT, PERSON, text, by="ana")
    assert await conversation(redis, prefix) == before
    assert graph.sent_messages() == []


@pytest.mark.parametrize(
    ("tenant", "person", "by", "why"),
    [
        ("999000111", PERSON, "ana", "unknown tenant '999000111'"),
        (TENANT, "5491100000000", "ana", "has no conversation with '5491100000000'"),
        ("bad}tenant", PERSON, "ana", "cannot be used in a Redis key"),
        (TENANT, "{54911}", "ana", "cannot be used in a Redis key"),
        (TENANT, PERSON, "  ", "say who writes the reply"),
    ],
)
async def test_unknown_or_unusable_ids_are_refused(
    redis: Redis,
    prefix: str,
    replies: ManualReplies,
    settings: Settings,
    graph: GraphApiStandIn,
    tenant: str,
    person: str,
    by: str,
    why: str,
) -> None:
    await waiting(redis, prefix, "wamid.u1", settings=settings)
    before = await conversation(redis, prefix)
    with pytest.raises(ManualReplyError, match=why.replace("{", r"\{")):
        await replies.reply(tenant, person, TEXT, by=by)
    assert await conversation(redis, prefix) == before
    assert graph.sent_messages() == []


PROVIDER_FAULTS = [
    # code, HTTP status, what the person reads
    (131008, 400, r"refused the reply \(invalid_request\): 131008: Required parameter missing"),
    (131053, 400, r"refused the reply: HTTP 400, code 131053: Required parameter missing"),
    (130429, 429, "could not take the reply now"),
]


@pytest.mark.parametrize(("code", "status", "why"), PROVIDER_FAULTS)
async def test_the_provider_refusing_the_reply_changes_nothing(
    redis: Redis,
    prefix: str,
    replies: ManualReplies,
    settings: Settings,
    graph: GraphApiStandIn,
    code: int,
    status: int,
    why: str,
) -> None:
    await waiting(redis, prefix, "wamid.p1", settings=settings)
    before = await conversation(redis, prefix)
    graph.fail_next(1, code, status=status, message="Required parameter missing")
    with pytest.raises(ManualReplyError, match=why):
        await replies.reply(TENANT, PERSON, TEXT, by="ana")
    assert await conversation(redis, prefix) == before


async def test_outside_the_window_without_a_template_the_reply_is_refused(
    redis: Redis, prefix: str, replies: ManualReplies, settings: Settings, graph: GraphApiStandIn
) -> None:
    old = int(time.time()) - DAY_S - 600
    await push_message(redis, prefix, PERSON, "wamid.t1", "hola", ts=old, tenant=PLAIN_TENANT)
    await take_in(redis, settings, PLAIN_TENANT)
    before = await conversation(redis, prefix, PLAIN_TENANT)
    with pytest.raises(ManualReplyError, match=r"window is closed and tenant .* has no template"):
        await replies.reply(PLAIN_TENANT, PERSON, TEXT, by="ana")
    assert await conversation(redis, prefix, PLAIN_TENANT) == before
    assert graph.sent_messages() == []


async def test_an_unreachable_provider_changes_nothing(
    redis: Redis, prefix: str, env: dict[str, str], settings: Settings
) -> None:
    nowhere = Settings.from_env({**env, "WHATSAPP_API_BASE_URL": "http://127.0.0.1:9"})
    replies = ManualReplies(redis, Keys(prefix), Scripts(), nowhere)
    try:
        await waiting(redis, prefix, "wamid.x1", settings=settings)
        before = await conversation(redis, prefix)
        with pytest.raises(ManualReplyError, match=r"could not take the reply now.*unreachable"):
            await replies.reply(TENANT, PERSON, TEXT, by="ana")
        assert await conversation(redis, prefix) == before
    finally:
        await replies.aclose()


async def test_a_send_without_an_answer_is_reported_as_maybe_delivered(
    redis: Redis, prefix: str, env: dict[str, str], settings: Settings, graph: GraphApiStandIn
) -> None:
    impatient = Settings.from_env({**env, "WHATSAPP_TIMEOUT_S": "0.5"})
    replies = ManualReplies(redis, Keys(prefix), Scripts(), impatient)
    try:
        await waiting(redis, prefix, "wamid.h1", settings=settings)
        before = await conversation(redis, prefix)
        graph.hang_next(1, seconds=2.0)
        with pytest.raises(ManualReplyError, match="may have reached the person"):
            await replies.reply(TENANT, PERSON, TEXT, by="ana")
        assert await conversation(redis, prefix) == before
    finally:
        await replies.aclose()


async def test_a_later_part_failing_keeps_the_parts_that_went_out(
    redis: Redis, prefix: str, replies: ManualReplies, settings: Settings, graph: GraphApiStandIn
) -> None:
    await waiting(redis, prefix, "wamid.f1", settings=settings)
    # Faults are taken in the order added: the first part is sent (after a pure delay), the
    # second refused.
    graph.hang_next(1, seconds=0.05)
    graph.fail_next(1, 131008, message="bad part")
    with pytest.raises(ManualReplyError, match=r"only 1 of 3 parts went out.*bad part") as caught:
        await replies.reply(TENANT, PERSON, THREE_PARTS, by="ana")

    (first,) = graph.sent_texts(PERSON)
    assert caught.value.provider_ids == [first.wamid]
    after = await conversation(redis, prefix)
    assert after["lock"] is None and after["pending"] == []
    (remembered,) = await memory(redis, prefix)
    assert remembered["assistant"] == split_reply(THREE_PARTS)[0], "only what reached them"
    assert (await outbound(redis, prefix, first.wamid))["part"] == "0"


# --- beside the worker: never at once, nothing answered twice ---------------------------------
async def test_a_reply_while_a_turn_runs_is_refused_and_the_turn_goes_on(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    replies: ManualReplies,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start()
    ai.queue_reply("Respuesta del bot.")
    graph.hang_next(1, seconds=2.0)  # the bot's send: the turn holds the lock meanwhile
    await push_message(redis, prefix, PERSON, "wamid.r1", "hola")
    k = Keys(prefix).tenant(TENANT)

    async def turn_sending() -> bool:
        return bool(ai_requests(ai)) and await redis.exists(k.lock(PERSON)) == 1

    await wait_for(turn_sending, "the turn sending its reply")
    with pytest.raises(ManualReplyError, match="a turn is running for this person"):
        await replies.reply(TENANT, PERSON, TEXT, by="ana")

    (bot,) = await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=10)
    assert bot.body == "Respuesta del bot."

    async def turn_done() -> bool:
        return await redis.exists(k.lock(PERSON), k.batch(PERSON)) == 0

    await wait_for(turn_done, "the turn's end")
    (remembered,) = await memory(redis, prefix)
    assert "by" not in remembered, "the bot's own exchange, nothing of the refused reply"


async def test_what_a_person_answered_is_not_answered_again_and_the_ai_sees_the_reply(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    replies: ManualReplies,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    # A burst that waits long enough for a person to answer it first.
    await workers.start(DEBOUNCE_WINDOW_S=3, MAX_WAIT_S=6)
    k = Keys(prefix).tenant(TENANT)
    await push_message(redis, prefix, PERSON, "wamid.a1", "¿tienen turno el jueves?")

    async def pending() -> bool:
        return await redis.llen(k.pending(PERSON)) == 1

    await wait_for(pending, "the burst taken in by the worker")
    result = await replies.reply(TENANT, PERSON, TEXT, by="ana")
    assert result.answered == 1
    # A person is talking with the customer: the bot waits (human takeover) until lifted.
    pause = await takeover.pause_state(redis, Keys(prefix), TENANT, PERSON)
    assert pause is not None and pause["by"] == "ana", "the reply paused the bot"
    assert pause["until_ms"] - pause["since_ms"] == 3_600_000  # HUMAN_PAUSE_S
    assert await takeover.resume(redis, Keys(prefix), TENANT, PERSON, by="ana")

    ai.queue_reply("¿Algo más?")
    await push_message(redis, prefix, PERSON, "wamid.a2", "gracias")
    (request,) = await wait_for(lambda: _requests(ai), "the next turn's AI call", timeout_s=20)
    turns = said(request["messages"])
    assert turns == [
        ("user", "¿tienen turno el jueves?"),
        ("assistant", f"{HUMAN_REPLY_NOTE}\n{TEXT}"),
        ("user", "gracias"),
    ], "the answered message is history, not asked again"
    await graph.await_for(lambda: len(graph.sent_texts(PERSON)) == 2, timeout=10)
    assert [m.body for m in graph.sent_texts(PERSON)] == [TEXT, "¿Algo más?"]


async def test_messages_arriving_during_the_reply_wait_for_the_bot(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """No turn starts while the reply sends (invariant 3); what arrived meanwhile waits, then
    (the reply paused the bot: a person is talking) for the person to hand back; once they
    do it is answered at once, not at the end of the reply's lease (30 s, beyond the wait)."""
    settings = Settings.from_env({**env, "LEASE_S": "30"})
    replies = ManualReplies(redis, Keys(prefix), Scripts(), settings)
    try:
        await _arriving_during_the_reply(redis, prefix, workers, replies, graph, ai)
    finally:
        await replies.aclose()


async def _arriving_during_the_reply(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    replies: ManualReplies,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start()
    k = Keys(prefix).tenant(TENANT)
    # Nothing waits when the reply begins: the person has the bot's first exchange.
    await push_message(redis, prefix, PERSON, "wamid.d0", "hola")
    ai.queue_reply("Hola, ¿en qué le ayudo?", "Anotado.")
    await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=10)

    async def idle() -> bool:
        return await redis.exists(k.lock(PERSON), k.batch(PERSON), k.pending(PERSON)) == 0

    await wait_for(idle, "the first turn's end")
    graph.hang_next(1, seconds=1.5)  # our reply's send: a message arrives meanwhile
    replying = asyncio.create_task(replies.reply(TENANT, PERSON, TEXT, by="ana"))

    async def locked() -> bool:
        return (await redis.get(k.lock(PERSON)) or b"").startswith(b"manual:")

    await wait_for(locked, "the reply holding the person")
    await push_message(redis, prefix, PERSON, "wamid.d1", "una pregunta más")
    with pytest.raises(ManualReplyError, match="another reply by hand"):
        await replies.reply(TENANT, PERSON, "otra", by="luis")
    result = await replying
    assert result.answered == 0, "the message came after the reply began: it waits"
    assert len(ai_requests(ai)) == 1, "no turn ran while the reply held the person"
    assert await redis.zscore(k.due, PERSON), "it waits, due when the pause ends"
    assert len(ai_requests(ai)) == 1, "no turn while the person is paused"
    assert await takeover.resume(redis, Keys(prefix), TENANT, PERSON, by="ana")

    requests = await wait_for(lambda: _requests(ai, 2), "the bot's turn on the new message")
    assert said(requests[1]["messages"])[-3:] == [
        ("user", NO_NEW_MESSAGE),
        ("assistant", f"{HUMAN_REPLY_NOTE}\n{TEXT}"),
        ("user", "una pregunta más"),
    ]
    await graph.await_for(lambda: len(graph.sent_texts(PERSON)) == 3, timeout=10)
    assert [m.body for m in graph.sent_texts(PERSON)][1:] == [TEXT, "Anotado."]


async def test_a_refused_reply_leaves_the_waiting_messages_to_the_bot(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """The burst falls due while the reply holds the person (the claim puts it off to the
    lock's end, 30 s away); the provider then refuses the reply: the release makes the burst
    due as before and the bot answers it, long before the lease would have ended."""
    settings = Settings.from_env({**env, "LEASE_S": "30"})
    replies = ManualReplies(redis, Keys(prefix), Scripts(), settings)
    try:
        await workers.start(DEBOUNCE_WINDOW_S=2, MAX_WAIT_S=4)
        k = Keys(prefix).tenant(TENANT)
        await push_message(redis, prefix, PERSON, "wamid.z1", "¿hay turno?")

        async def pending() -> bool:
            return await redis.llen(k.pending(PERSON)) == 1

        await wait_for(pending, "the burst taken in by the worker")
        graph.fail_next(1, 131008, message="Required parameter missing", delay=4.0)
        with pytest.raises(ManualReplyError, match="Required parameter missing"):
            await replies.reply(TENANT, PERSON, TEXT, by="ana")
        assert ai_requests(ai) == [], "no turn while the reply held the person"

        ai.queue_reply("Sí, el jueves.")
        (bot,) = await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=15)
        assert bot.body == "Sí, el jueves."
        (request,) = [r.body for r in ai_requests(ai)]
        assert said(request["messages"]) == [("user", "¿hay turno?")], "no trace of the refusal"
    finally:
        await replies.aclose()


async def _requests(ai: MessagesApiStandIn, count: int = 1) -> list[dict[str, Any]] | None:
    bodies = [r.body for r in ai_requests(ai)]
    return bodies if len(bodies) >= count else None


# --- the CLI ------------------------------------------------------------------------------------
def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_module("worker.manual_reply", *args, env={**os.environ, **env}, timeout_s=60)


async def test_the_cli_sends_prints_the_ids_and_audits(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    settings: Settings,
    graph: GraphApiStandIn,
) -> None:
    await waiting(redis, prefix, "wamid.cli1", settings=settings)
    args = ("--tenant", TENANT, "--person", PERSON, "--by", "ana")
    done = await asyncio.to_thread(_cli, env, *args, TEXT)
    assert done.returncode == 0, done.stderr
    (sent,) = graph.sent_texts(PERSON)
    assert done.stdout.split() == [sent.wamid]
    (entry,) = await audit.entries(redis, Keys(prefix))
    assert (entry.who, entry.action, entry.tenant, entry.person) == ("ana", "reply", TENANT, PERSON)
    assert entry.detail == TEXT

    refused = await asyncio.to_thread(_cli, env, *args, "   ")
    assert refused.returncode == 1 and refused.stderr.strip() == "error: the reply is empty"
    assert len(await audit.entries(redis, Keys(prefix))) == 1, "nothing sent, nothing audited"
