"""Late delivery failures: a `failed` status for a part Meta had accepted.

The intake queues it and makes a batch of it once the person has none (shared/lua/lib/
outbound.lua); the worker runs that batch under the person's lock (worker/turn/late_failures.py):
for 131047 the tenant's template, once per batch; a review item with the batch's messages, the
failed part's text and Meta's error; the memory's reply marked as not delivered. Duplicate and
out-of-order statuses (failed twice, failed before sent or before the send's record, read after
failed) change nothing more. The scripts are driven directly here where the order of events
must be exact; the worker, the Graph API stand-in and the real receiver elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared import events
from shared.conversation.batch import Batch
from shared.conversation.review_journal import ReviewJournal
from shared.conversation.turn_state import TurnState
from shared.keys import Keys
from shared.ops.review import ReviewList
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.delivery.support import (
    PLAIN_TENANT,
    TEMPLATE,
    TENANT,
    InProcessWorkers,
    ai_requests,
    batch_hash,
    hash_of,
    outbound,
    push_failed_status,
    said,
)
from tests.support.helpers import APP_SECRET
from tests.worker.support import (
    in_review,
    push_message,
    quick_store,
    review_items,
    stats,
    wait_for,
    wake_up,
)
from worker.conversation_store import ConversationStore

PERSON = "5491155550071"
REPLY = "Hola, ¿en qué te ayudo?"


def make_store(
    redis: Redis, settings: Settings, prefix: str, **overrides: Any
) -> ConversationStore:
    return quick_store(redis, settings, key_prefix=prefix, **overrides)


async def answered(
    store: ConversationStore,
    redis: Redis,
    prefix: str,
    wamids: list[str],
    *,
    tenant: str = TENANT,
    message: str = "wamid.in",
    template_part: int | None = None,
) -> Batch:
    """A batch of one message answered in parts `wamids` (the last recorded by the finish) and
    remembered, as a worker's turn leaves it; `template_part`: that part was the template."""
    await Scripts().load(redis)
    await push_message(redis, prefix, PERSON, message, "hola", tenant=tenant)
    await store.claim(tenant, 0, "intake")
    await asyncio.sleep(0.05)
    (batch,) = (await store.claim(tenant, 1, "turn")).batches
    assert await store.save_reply(batch, REPLY) == REPLY
    for part, wamid in enumerate(wamids[:-1]):
        assert await store.record_part(batch, part, wamid)
    if template_part is not None:
        assert await store.mark_template(batch, True, template_part)
    remember = orjson.dumps(
        {"header": "", "user": "hola", "assistant": REPLY, "ids": [message], "out": wamids}
    )
    assert await store.finish_done(batch, remember, (len(wamids) - 1, wamids[-1]))
    return batch


async def push_raw_status(
    redis: Redis, prefix: str, wamid: str, status: str, code: int | None = None
) -> None:
    """A status put in the inbox as the receiver puts it (statuses have no dedupe marker): a
    repeat of one taken in already (or a second `failed`, which Meta never sends)."""
    errors = [{"code": code, "title": f"Error {code}"}] if code is not None else []
    event = events.status_event(
        channel="whatsapp",
        person=PERSON,
        message_id=wamid,
        status=status,
        ts=int(time.time()),
        received_ms=int(time.time() * 1000),
        raw={"id": wamid, "status": status},
        errors=errors,
    )
    await redis.lpush(Keys(prefix).tenant(TENANT).inbox, events.encode(event))


async def late_batch(redis: Redis, prefix: str) -> dict[str, Any]:
    """The person's batch (a late failure's), its jobs decoded."""
    fields: dict[str, Any] = await batch_hash(redis, prefix, PERSON)
    fields["jobs"] = orjson.loads(fields.get("late_jobs", "[]"))
    return fields


async def test_failed_twice_then_read_is_one_late_failure(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    store = make_store(redis, settings, prefix)
    batch = await answered(store, redis, prefix, ["wamid.o0"])
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131026)
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131026)  # applied again: no-op
    await store.claim(TENANT, 0, "intake")
    late = await late_batch(redis, prefix)
    assert late["late_of"] == batch.id and late["late_template"] == "0"
    assert [(j["id"], j["code"]) for j in late["jobs"]] == [("wamid.o0", 131026)]

    for status, code in (("failed", 131026), ("read", None), ("delivered", None)):
        await push_raw_status(redis, prefix, "wamid.o0", status, code)
    await store.claim(TENANT, 0, "intake")
    assert await late_batch(redis, prefix) == late, "nothing more queued or changed"
    k = Keys(prefix).tenant(TENANT)
    assert await hash_of(redis, k.late(PERSON)) == {}, "no second job waiting"
    record = await outbound(redis, prefix, "wamid.o0")
    assert record["status"] == "failed" and record["error"] == "131026"
    counts = await stats(redis, prefix)
    assert counts["parts_failed"] == 1 and counts["statuses"] == 5
    assert "parts_read" not in counts and "parts_delivered" not in counts


async def test_failed_before_sent_and_before_the_record_is_applied_once_by_the_finish(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    """Meta's `failed` overtakes both the `sent` status and the send's answer: it waits on the
    record, the late `sent` does not undo it, and the finish queues and starts the failure."""
    store = make_store(redis, settings, prefix)
    await Scripts().load(redis)
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131047)
    await push_raw_status(redis, prefix, "wamid.o0", "sent")
    await store.claim(TENANT, 0, "intake")
    assert await outbound(redis, prefix, "wamid.o0") == {}, "no record yet"
    parked = await hash_of(redis, Keys(prefix).tenant(TENANT).outbound("wamid.o0"))
    assert parked["early"] == "failed" and orjson.loads(parked["early_failure"])["code"] == 131047

    batch = await answered(store, redis, prefix, ["wamid.o0"])
    record = await outbound(redis, prefix, "wamid.o0")
    assert record["status"] == "failed" and record["error"] == "131047" and "early" not in record
    late = await late_batch(redis, prefix)
    assert late["late_of"] == batch.id and late["late_template"] == "1"
    assert [m["id"] for m in orjson.loads(late["messages"])] == ["wamid.in"]
    assert late["late_reply"] == REPLY
    await push_raw_status(redis, prefix, "wamid.o0", "sent")
    await store.claim(TENANT, 0, "intake")
    assert (await outbound(redis, prefix, "wamid.o0"))["status"] == "failed"
    assert (await late_batch(redis, prefix))["jobs"] == late["jobs"]


async def test_131047_on_every_part_asks_for_one_template_per_batch(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    store = make_store(redis, settings, prefix, lease_s=30, lease_renew_s=10)
    batch = await answered(store, redis, prefix, ["wamid.o0", "wamid.o1", "wamid.o2"])
    await push_failed_status(redis, prefix, PERSON, "wamid.o1", 131047)
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131047)
    await store.claim(TENANT, 0, "intake")
    late = await late_batch(redis, prefix)
    assert late["late_template"] == "1"
    assert [j["id"] for j in late["jobs"]] == ["wamid.o1", "wamid.o0"]

    # A worker takes it and ends it; the last part's failure comes after.
    (job,) = (await store.claim(TENANT, 1, "late")).batches
    assert job.id == late["id"] and await store.finish_review(job, "window_closed", "", 0)
    await push_failed_status(redis, prefix, PERSON, "wamid.o2", 131047)
    await store.claim(TENANT, 0, "intake")
    again = await late_batch(redis, prefix)
    assert again["late_of"] == batch.id and again["id"] != late["id"]
    assert again["late_template"] == "0", "the batch's template was decided already"
    assert [j["id"] for j in again["jobs"]] == ["wamid.o2"]


async def test_a_turn_that_sent_the_template_itself_gets_no_second_one(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    """Part 0 went out, part 1 got 131047 at once and the turn sent the template in its place;
    then Meta reports part 0 failed too: the template is not sent again."""
    store = make_store(redis, settings, prefix)
    await answered(store, redis, prefix, ["wamid.o0", "wamid.tpl"], template_part=1)
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131047)
    await store.claim(TENANT, 0, "intake")
    assert (await late_batch(redis, prefix))["late_template"] == "0"


async def test_a_failure_while_the_next_batch_runs_waits_for_it(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    """The person wrote again: their batch runs; the failure of the earlier reply becomes a
    batch only when it ended (one batch at a time per person, invariant 3), before the messages
    that arrived meanwhile."""
    store = make_store(redis, settings, prefix)
    first = await answered(store, redis, prefix, ["wamid.o0"])
    await push_message(redis, prefix, PERSON, "wamid.in2", "¿hola?")
    await store.claim(TENANT, 0, "intake")
    await asyncio.sleep(0.05)
    (second,) = (await store.claim(TENANT, 1, "turn")).batches
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131026)
    await push_message(redis, prefix, PERSON, "wamid.in3", "¿?")
    await store.claim(TENANT, 0, "intake")
    assert (await batch_hash(redis, prefix, PERSON))["id"] == second.id, "the turn's batch stays"

    assert await store.finish_done(second)
    late = await late_batch(redis, prefix)
    assert late["late_of"] == first.id and [j["id"] for j in late["jobs"]] == ["wamid.o0"]
    (job,) = (await store.claim(TENANT, 5, "late")).batches
    assert job.id == late["id"] and [m.id for m in job.messages] == ["wamid.in"]
    assert await store.finish_review(job, "undeliverable", "", 0)
    await asyncio.sleep(0.05)
    (third,) = (await store.claim(TENANT, 5, "turn")).batches
    assert [m.id for m in third.messages] == ["wamid.in3"]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (131026, "undeliverable"),
        (131049, "marketing_limited"),
        (131050, "marketing_opted_out"),
        (130472, "meta_experiment"),
        (131999, "delivery_failed"),
    ],
)
async def test_other_codes_park_the_part_and_the_error_and_mark_the_memory(
    code: int,
    reason: str,
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Through the real receiver: the item names what happened, carries the part's text and
    Meta's error; no template; the next turn's AI is told the reply never arrived."""
    graph.configure(webhook_url=receiver_url, app_secret=APP_SECRET, status_delays=(0.0,))
    graph.fail_status_for(PERSON, code)
    await workers.start()
    ai.queue_reply(REPLY)
    await push_message(redis, prefix, PERSON, "wamid.in", "hola")

    (item,) = await in_review(redis, prefix, what=f"the {code} failure in review")
    (failed,) = graph.sent_texts(PERSON)
    assert item["reason"] == reason and [m["id"] for m in item["messages"]] == ["wamid.in"]
    (part,) = item["late_failure"]["parts"]
    assert (part["id"], part["code"], part["text"]) == (failed.wamid, code, REPLY)
    assert "template" not in item["late_failure"] and graph.sent_templates() == []
    assert f"status failed {code} (" in item["error"] and failed.wamid in item["error"]
    if code != 131999:
        assert part["title"] and part["title"] in item["error"]
    assert (await stats(redis, prefix))[f"review:{reason}"] == 1

    graph.configure(fail_status_recipients={})
    ai.queue_reply("¿Me leés?")
    await push_message(redis, prefix, PERSON, "wamid.in2", "??")
    await wait_for(lambda: _true(len(ai_requests(ai)) == 2), "the next turn's AI call")
    history = said(ai_requests(ai)[1].body["messages"])
    assert history[1] == ("assistant", f"[not delivered: {code}] {REPLY}")


async def _true(value: bool) -> bool:
    return value


async def test_a_tenant_without_a_template_parks_the_batch_and_sends_nothing(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start()
    ai.queue_reply(REPLY)
    await push_message(redis, prefix, PERSON, "wamid.in", "hola", tenant=PLAIN_TENANT)
    (sent,) = await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=10)
    await push_failed_status(redis, prefix, PERSON, sent.wamid, 131047, tenant=PLAIN_TENANT)

    (item,) = await in_review(redis, prefix, PLAIN_TENANT, what="the undelivered reply in review")
    assert item["reason"] == "window_closed"
    assert item["late_failure"]["template"] == "not sent: the tenant has no template"
    assert graph.sent_templates() == []
    listed = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "worker.review", "list", "--tenant", PLAIN_TENANT),
        env={**os.environ, **workers.env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(listed.communicate(), 30)
    assert listed.returncode == 0, err.decode()
    assert b"reason=window_closed" in out and b"late=131047" in out
    assert b"template='not sent: the tenant has no template'" in out


async def test_no_template_when_the_person_wrote_after_the_failed_send(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """The window is open again: the template would only repeat what the next turn says."""
    store = make_store(redis, workers.settings(), prefix)
    await answered(store, redis, prefix, ["wamid.o0"])
    later = int(time.time()) + 5
    await push_message(redis, prefix, PERSON, "wamid.in2", "¿sigue ahí?", ts=later, wake=False)
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131047)
    ai.queue_reply("Sí, acá estoy.")
    await workers.start()

    (item,) = await in_review(redis, prefix, what="the late failure in review")
    assert item["late_failure"]["template"].startswith("not sent: the person wrote since")
    (text,) = await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=10)
    assert text.body == "Sí, acá estoy." and graph.sent_templates() == []


async def test_a_late_template_whose_answer_never_came_is_not_sent_again(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start(WHATSAPP_TIMEOUT_S=1)
    graph.hang_next(1, 3.0, kinds=["template"])
    ai.queue_reply(REPLY)
    await push_message(redis, prefix, PERSON, "wamid.in", "hola")
    (sent,) = await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=10)
    await push_failed_status(redis, prefix, PERSON, sent.wamid, 131047)

    (item,) = await in_review(redis, prefix, what="the late failure in review")
    assert item["reason"] == "window_closed"
    assert item["late_failure"]["template"].startswith("unknown: ")
    unknown = item["delivery_unknown"]
    assert (unknown["what"], unknown["text"]) == ("template", TEMPLATE)
    assert (await stats(redis, prefix))["unknown:template"] == 1
    await graph.await_for(lambda: graph.sent_templates(PERSON), timeout=10)  # the hung one
    requests = [r for r in graph.requests if r.kind == "template"]
    assert len(requests) == 1


async def test_a_worker_that_died_sending_the_late_template_never_sends_it_again(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    settings: Settings,
) -> None:
    """The template was noted on the late batch, then its worker died before Meta's answer was
    recorded: the batch is resumed after the lease, and the template is not sent again."""
    store = make_store(redis, workers.settings(), prefix, lease_s=0.5, lease_renew_s=0.1)
    await answered(store, redis, prefix, ["wamid.o0"])
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131047, tenant=TENANT)
    await store.claim(TENANT, 0, "intake")
    (job,) = (await store.claim(TENANT, 1, "dead")).batches
    assert job.fields["late_template"] == "1"
    assert await store.mark_template(job, True, 0)  # ... and the worker died here
    await asyncio.sleep(0.6)
    await workers.start()
    await wake_up(redis, prefix, TENANT)

    (item,) = await in_review(redis, prefix, what="the resumed late failure in review")
    assert item["id"] == job.id and item["reason"] == "window_closed"
    assert item["late_failure"]["template"].startswith("unknown: the worker that sent it stopped")
    assert item["delivery_unknown"]["what"] == "template"
    assert [r for r in graph.requests if r.kind == "template"] == []
    # Requeue works: the item holds the batch's messages.
    await ReviewList(redis, Keys(prefix), Scripts()).requeue(TENANT, item["id"])
    assert await review_items(redis, prefix) == []


async def test_the_sent_list_keeps_the_last_three_whatsapp_batches_for_six_hours(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    store = make_store(redis, settings, prefix)
    batches = [
        await answered(store, redis, prefix, [f"wamid.o{i}"], message=f"wamid.in{i}")
        for i in range(4)
    ]
    k = Keys(prefix).tenant(TENANT)
    kept = [orjson.loads(e) for e in await redis.lrange(k.sent(PERSON), 0, -1)]
    assert [e["batch"] for e in kept] == [b.id for b in reversed(batches[1:])]
    assert kept[0]["reply"] == REPLY and kept[0]["messages"][0]["id"] == "wamid.in3"
    assert 5 * 3600 < await redis.ttl(k.sent(PERSON)) <= 6 * 3600
    # A failure of the oldest batch, no longer kept, still makes its batch, without messages.
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131026)
    await store.claim(TENANT, 0, "intake")
    late = await late_batch(redis, prefix)
    assert late["late_of"] == batches[0].id and late["messages"] == "[]"
    assert late["late_reply"] == ""


async def test_chatwoot_batches_keep_nothing_for_late_failures(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    store = make_store(redis, settings, prefix)
    tenant = "cw-1-2"
    await Scripts().load(redis)
    await push_message(redis, prefix, PERSON, "cw.in", "hola", tenant=tenant, channel="chatwoot")
    await store.claim(tenant, 0, "intake")
    await asyncio.sleep(0.05)
    (batch,) = (await store.claim(tenant, 1, "turn")).batches
    assert await store.save_reply(batch, REPLY) == REPLY
    assert await store.record_part(batch, 0, "cw.out.0")
    assert await store.finish_done(batch, b"", (1, "cw.out.1"))
    k = Keys(prefix).tenant(tenant)
    assert await redis.exists(k.sent(PERSON)) == 0
    assert (await outbound(redis, prefix, "cw.out.0", tenant))["batch"] == batch.id


async def test_a_worker_of_the_release_before_parks_a_late_batch_without_sending(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    """During a rolling deploy an older worker may claim a late failure's batch: it reads the
    review journal the batch carries and parks it (its resumed-review path), sending nothing."""
    store = make_store(redis, settings, prefix)
    await answered(store, redis, prefix, ["wamid.o0"])
    await push_failed_status(redis, prefix, PERSON, "wamid.o0", 131047)
    await store.claim(TENANT, 0, "intake")
    (job,) = (await store.claim(TENANT, 1, "old")).batches
    journal = ReviewJournal.read(job.fields["handoff"])
    assert journal.reason == "delivery_failed" and "earlier release" in journal.detail
    assert TurnState.resumed(job).journal == journal
