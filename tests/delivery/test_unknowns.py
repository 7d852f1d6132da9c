"""Sends whose outcome the worker cannot know: the request may have reached Meta, its answer
never came (a read timeout, a dropped connection, a 200 that names no message). They are never
sent again (a second copy is worse than a person looking), and never counted as answered
either: the batch is in review as `delivery_unknown`, saying which part, when and why, and the
tenant's counters say how many. A failure before the request was written is retried.

Real workers, the real httpx client, the Graph API stand-in (a hung or dropped send is carried
out, as Meta would); the crash case is a real `python -m worker` SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, GraphFault, MessagesApiStandIn, free_port
from shared.conversation.batch import Batch
from shared.conversation.review_journal import JOURNAL_FIELD, ReviewJournal, current_names
from shared.conversation.turn_state import TurnState
from shared.conversation.unknowns import UnknownDelivery
from shared.keys import Keys
from shared.ops import live_state
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.delivery.support import (
    DAY_S,
    TEMPLATE,
    TENANT,
    THREE_PARTS,
    InProcessWorkers,
    ai_requests,
    batch_hash,
)
from tests.worker.support import (
    WorkerFleet,
    claim_due_now,
    in_review,
    push_message,
    run_module,
    stats,
    wait_exit,
)
from worker.conversation_store import ConversationStore
from worker.inspect import render_person, render_tenant

PERSON = "5491155550061"
REPLY = "Sí, el sábado a las 16 hay turno."
# 1 s: no ordinary answer of the stand-in takes that long, even on a loaded machine; the
# delays below (3 s) always outlast it.
TIMEOUT = {"WHATSAPP_TIMEOUT_S": "1"}

# Each fault keeps Meta's answer from the client; the first two carry the send out.
UNKNOWN: dict[str, Any] = {
    "timeout": lambda to: GraphFault(delay=3.0, to=to, kinds=frozenset({"text"})),
    "dropped": lambda to: GraphFault(drop=True, to=to, kinds=frozenset({"text"})),
    "200 without a wamid": lambda to: GraphFault(
        raw_body='{"messaging_product":"whatsapp"}',
        status=200,
        content_type="application/json",
        to=to,
        kinds=frozenset({"text"}),
    ),
    "200 not JSON": lambda to: GraphFault(
        raw_body="<html>ok</html>", status=200, to=to, kinds=frozenset({"text"})
    ),
}
ERRORS = {
    "timeout": "ReadTimeout",
    "dropped": "RemoteProtocolError",
    "200 without a wamid": "HTTP 200 without a wamid",
    "200 not JSON": "HTTP 200 that is not JSON",
}


def texts_to(graph: GraphApiStandIn, person: str) -> list[Any]:
    """Every text request to `person`, answered or not."""
    return [r for r in graph.requests if r.kind == "text" and r.extra.get("to") == person]


async def claimed_by_a_dying_worker(
    redis: Redis, prefix: str, workers: InProcessWorkers, message_id: str
) -> tuple[ConversationStore, Batch]:
    """PERSON's "hola" claimed, by the product's own scripts, as a worker on a short lease
    (0.5 s) would claim it before dying: the store it claimed with, and the batch."""
    settings = workers.settings(LEASE_S=0.5, LEASE_RENEW_S=0.1)
    scripts = Scripts()
    store = ConversationStore(settings, scripts, GroupCommitter(redis, scripts))
    await push_message(redis, prefix, PERSON, message_id, "hola", wake=False)
    return store, await claim_due_now(redis, store, prefix, PERSON, "dead", limit=1)


async def test_a_part_meta_may_have_taken_is_never_sent_again_and_a_person_is_told(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    people = {case: f"549115556{i:04d}" for i, case in enumerate(UNKNOWN)}
    await workers.start(WORKER_CONCURRENCY=len(people), **TIMEOUT)
    ai.set_default_reply(REPLY)
    before_ms = int(time.time() * 1000)
    for case, person in people.items():
        graph.add_fault(UNKNOWN[case](person))
        await push_message(redis, prefix, person, f"wamid.u{person}", "¿hay turno?")

    items = {
        i["person"]: i
        for i in await in_review(
            redis, prefix, count=len(people), what=f"{len(people)} review items"
        )
    }
    for case, person in people.items():
        item = items[person]
        assert item["reason"] == "delivery_unknown" and item["attempts"] == 0, case
        unknown = item["delivery_unknown"]
        assert (unknown["what"], unknown["part"], unknown["parts_total"]) == ("part", 0, 1), case
        assert unknown["text"] == REPLY, case
        assert ERRORS[case] in unknown["error"], (case, unknown["error"])
        assert before_ms <= unknown["at_ms"] <= int(time.time() * 1000), case
        assert item["error"].startswith("part 1 of 1: no answer to the request made at "), case
        assert item["error"].endswith("the person may or may not have it, and it is not sent again")
        assert "parts_sent" not in item, case
        # WhatsApp's hand-over: the bot is paused for the person (shared/ops/takeover.py).
        assert item["hand_over"].startswith("bot paused for this person for 3600 s"), case
        assert item["human_pause_ms"] == 3_600_000, case
        assert [m["text"] for m in item["messages"]] == ["¿hay turno?"], case
        assert len(texts_to(graph, person)) == 1, f"{case}: sent again"
        # The batch is gone: nothing is left that could send it again later.
        assert await batch_hash(redis, prefix, person) == {}, case
    counts = await stats(redis, prefix)
    assert counts["review:delivery_unknown"] == len(people)
    assert counts["unknown:part"] == len(people)
    assert "retries" not in counts and "turns" not in counts, counts
    assert len(ai_requests(ai)) == len(people)
    # The hung and the dropped ones did reach the person: exactly what nobody could know.
    delivered = {people["timeout"], people["dropped"]}
    await graph.await_for(lambda: {m.to for m in graph.sent_texts()} == delivered, timeout=15)


async def test_a_later_part_with_an_unknown_outcome_ends_the_reply_there(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Part 1 accepted, part 2 timed out: part 3 is not sent after a part that may be
    missing, and the item says what the person has (part 1's wamid) and what may be lost."""
    await workers.start(**TIMEOUT)
    ai.queue_reply(THREE_PARTS)
    graph.add_fault(GraphFault(to=PERSON, kinds=frozenset({"text"}), count=1))  # passes through
    graph.add_fault(GraphFault(delay=3.0, to=PERSON, kinds=frozenset({"text"})))
    await push_message(redis, prefix, PERSON, "wamid.u2", "contame todo")

    (item,) = await in_review(redis, prefix, what="1 review item(s)")
    (first, _) = texts_to(graph, PERSON)
    assert item["reason"] == "delivery_unknown"
    assert item["parts_sent"] == {"0": first.response["messages"][0]["id"]}
    assert item["parts_total"] == 3
    unknown = item["delivery_unknown"]
    assert (unknown["part"], unknown["parts_total"]) == (1, 3)
    assert unknown["text"] == THREE_PARTS.split("\n\n")[1]
    assert item["error"].startswith("part 2 of 3: no answer")
    assert len(texts_to(graph, PERSON)) == 2, "part 3 is never tried"


async def test_a_graph_api_that_cannot_be_reached_is_retried_not_reviewed_as_unknown(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Refused connections never carry a request: safe to retry, so they are retried (and
    reviewed after MAX_ATTEMPTS like any failure that does not clear)."""
    await workers.start(
        WHATSAPP_API_BASE_URL=f"http://127.0.0.1:{free_port()}", MAX_ATTEMPTS=2, **TIMEOUT
    )
    ai.queue_reply(REPLY)
    await push_message(redis, prefix, PERSON, "wamid.u3", "hola")

    (item,) = await in_review(redis, prefix, what="1 review item(s)")
    assert item["reason"] == "max_attempts" and item["attempts"] == 2
    assert "Graph API unreachable" in item["error"] and "delivery_unknown" not in item
    counts = await stats(redis, prefix)
    assert counts["retries"] == 1 and not any(k.startswith("unknown:") for k in counts)
    assert len(ai_requests(ai)) == 1


async def test_inspect_and_the_review_list_show_what_may_be_missing(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start(**TIMEOUT)
    ai.queue_reply(REPLY)
    graph.add_fault(UNKNOWN["dropped"](PERSON))
    await push_message(redis, prefix, PERSON, "wamid.u4", "hola")
    await in_review(redis, prefix, what="1 review item(s)")

    state = await live_state.tenant(redis, Keys(prefix), TENANT)
    assert state["deliveries_unknown"] == {"part": 1}
    (summary,) = state["review"]
    assert summary["delivery_unknown"]["send"] == "part 1 of 1"
    assert REPLY not in orjson.dumps(state).decode(), "no reply text without --text"
    text = "\n".join(render_tenant(state))
    assert "reason=delivery_unknown" in text
    assert "delivery unknown: part 1 of 1, request made at 20" in text
    assert "unknown     1 sends nobody can confirm (part=1;" in text
    fleet = await live_state.fleet(redis, Keys(prefix))
    assert [t["unknown"] for t in fleet["tenants"]] == [1]
    env = {**os.environ, "REDIS_URL": workers.env["REDIS_URL"], "KEY_PREFIX": prefix}
    listed = await asyncio.to_thread(
        run_module, "worker.review", "list", "--tenant", TENANT, env=env
    )
    assert listed.returncode == 0, listed.stderr
    assert "reason=delivery_unknown" in listed.stdout
    assert "unknown='part 1 of 1' at 20" in listed.stdout


async def test_inspect_shows_a_review_being_finished_and_a_template_noted(
    redis: Redis, prefix: str, workers: InProcessWorkers
) -> None:
    """What a person sees of a batch whose worker is parking it (or died doing so): the
    journaled review and its hand-over's steps, and the template noted before its request."""
    settings = workers.settings()
    scripts = Scripts()
    store = ConversationStore(settings, scripts, GroupCommitter(redis, scripts))
    await push_message(redis, prefix, PERSON, "wamid.u8", "hola", wake=False)
    await store.claim(TENANT, 0, "intake")
    await redis.zadd(Keys(prefix).tenant(TENANT).due, {PERSON: 0})
    (batch,) = (await store.claim(TENANT, 1, "w")).batches
    assert await store.mark_template(batch, True, 0)
    journal = ReviewJournal("max_attempts", "boom", 1_700_000_000_000, steps={"note": "sending"})
    assert await store.save_journal(batch, journal)

    state = await live_state.person(redis, Keys(prefix), TENANT, PERSON)
    journal = state["batch"]["review_journal"]
    assert journal["reason"] == "max_attempts" and journal["steps"] == {"note": "sending"}
    assert state["batch"]["template"]["part"] == 0
    assert state["batch"]["template"]["noted_ms"] > 1_700_000_000_000
    text = "\n".join(render_person(state))
    assert (
        "review      decided (max_attempts) at 2023-11-14 22:13:20 UTC, not finished; "
        "hand-over: note=sending"
    ) in text
    assert "template    noted at 20" in text and "in place of part 1" in text


async def test_a_resumed_review_of_an_unknown_delivery_sends_nothing(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """WhatsApp's side of the hand-over question. A worker journals its review decision (here:
    the part's outcome is unknown) and dies before the finish; the worker that resumes the
    batch finishes that review and sends nothing, where running the turn again would send
    the stored reply a second time. The dead worker's steps are the product's own scripts."""
    store, batch = await claimed_by_a_dying_worker(redis, prefix, workers, "wamid.u5")
    assert await store.save_reply(batch, REPLY) == REPLY
    unknown = UnknownDelivery("part", 0, 1, 1_700_000_000_000, "ReadTimeout('timed out')", REPLY)
    journal = ReviewJournal("delivery_unknown", unknown.sentence(), 1_700_000_000_000, unknown)
    assert await store.save_journal(batch, journal)

    await workers.start(LEASE_S=0.5, LEASE_RENEW_S=0.1)
    (item,) = await in_review(redis, prefix, what="1 review item(s)")
    assert item["reason"] == "delivery_unknown" and item["error"] == unknown.sentence()
    assert item["delivery_unknown"] == unknown.to_json()
    assert graph.requests == [], "nothing sent: not the reply, not a read receipt"
    assert ai_requests(ai) == []
    counts = await stats(redis, prefix)
    assert counts["leases_expired"] == 1 and counts["unknown:part"] == 1


@pytest.mark.slow
async def test_a_template_in_flight_at_a_crash_is_not_sent_again_and_a_person_is_told(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """A worker process dies (SIGKILL) while Meta holds its template request: the note made
    before the request says a template may be out, and no wamid was recorded. The worker
    that resumes the batch sends nothing and parks it as delivery_unknown, timed when the
    note was made; before, it ended the batch as answered and nobody knew."""
    lease = {"LEASE_S": "1.5", "LEASE_RENEW_S": "0.3", "REVIEW_AFTER_S": str(2 * DAY_S)}
    graph.hang_next(1, 30.0, kinds=["template"])
    (victim,) = await fleet.start(1, **{**env, **lease})
    await push_message(redis, prefix, PERSON, "wamid.u6", "hola", ts=int(time.time()) - DAY_S - 60)

    await graph.await_for(lambda: any(r.kind == "template" for r in graph.requests), timeout=10)
    noted = await batch_hash(redis, prefix, PERSON)
    assert noted["template"] == "1" and noted["template_part"] == "0"
    victim.send_signal(signal.SIGKILL)
    await wait_exit(victim, 5)

    await fleet.start(1, **{**env, **lease})
    (item,) = await in_review(redis, prefix, what="1 review item(s)")
    assert item["reason"] == "delivery_unknown"
    unknown = item["delivery_unknown"]
    assert (unknown["what"], unknown["text"]) == ("template", TEMPLATE)
    assert unknown["at_ms"] == int(noted["template_ms"])
    assert "stopped before Meta's answer was recorded" in unknown["error"]
    assert len([r for r in graph.requests if r.kind == "template"]) == 1
    assert graph.sent_texts() == [] and ai_requests(ai) == [], "the window is closed: no AI"
    counts = await stats(redis, prefix)
    assert counts["leases_expired"] == 1 and counts["unknown:template"] == 1
    assert "turns" not in counts


class CountingHandOver:
    """A custom sender with a hand-over of its own that knows nothing of the journal."""

    def __init__(self) -> None:
        self.hand_overs: list[str] = []

    async def send(self, batch: Batch, text: str, part: int) -> str | None:
        return None

    async def hand_over(self, batch: Batch, reason: str, detail: str) -> bool:
        self.hand_overs.append(batch.id)
        return True

    async def aclose(self) -> None:
        return None


async def test_a_hand_over_that_cannot_resume_is_not_called_twice(
    redis: Redis, prefix: str, workers: InProcessWorkers
) -> None:
    """A sender without `resumes_hand_over`: its worker died after journaling the review, so
    it may have told someone already. The worker that resumes the batch does not call it
    again; the item says the hand-over's outcome is unknown, and it is counted."""
    store, batch = await claimed_by_a_dying_worker(redis, prefix, workers, "wamid.u7")
    journal = ReviewJournal("too_old", "oldest message 1000s old", 1_700_000_000_000)
    assert await store.save_journal(batch, journal)

    sender = CountingHandOver()
    await workers.start(sender=sender, LEASE_S=0.5, LEASE_RENEW_S=0.1)
    (item,) = await in_review(redis, prefix, what="1 review item(s)")
    assert item["reason"] == "too_old" and sender.hand_overs == []
    assert item["hand_over"].startswith("unknown: a worker stopped during the hand-over begun at ")
    assert item["hand_over_steps"] == {"hand_over": item["hand_over"]}
    assert (await stats(redis, prefix))["unknown:hand_over"] == 1


def test_a_journal_that_cannot_be_read_still_finishes_as_a_review() -> None:
    row = [b"549", b"tok", b"id", b"b-1", b"messages", b"[]", JOURNAL_FIELD.encode(), b"{not json"]
    journal = TurnState.resumed(Batch.from_claim(TENANT, row)).journal
    assert journal is not None
    assert (journal.reason, journal.detail) == ("review_journal_unreadable", "{not json")
    good = ReviewJournal("too_old", "old", 5, steps={"note": "done"})
    row[-1] = good.to_json()
    assert TurnState.resumed(Batch.from_claim(TENANT, row)).journal == good
    # Workers of the previous release read the journal only under this name, so a batch
    # either release journaled is resumed by the other during a rolling deploy.
    assert JOURNAL_FIELD == "handoff"


def test_review_items_stored_before_the_rename_read_with_the_current_names() -> None:
    old = {"id": "b-1", "handoff": "done", "handoff_steps": {"note": "done"}}
    assert current_names(old) == {
        "id": "b-1",
        "hand_over": "done",
        "hand_over_steps": {"note": "done"},
    }
