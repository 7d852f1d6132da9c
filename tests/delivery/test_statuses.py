"""Delivery statuses end to end: the Graph stand-in posts signed status webhooks to the real
receiver app (uvicorn), the worker applies them to the outbound record of each sent part
(`wa:{t}:out:<wamid>`), never downgrading, and counts them; a `failed` 131047 after Meta had
accepted the send sends the tenant's template once and puts the batch in review (more in
test_late_failures.py)."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.keys import Keys
from shared.ops.review import ReviewList
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.delivery.support import (
    TENANT,
    InProcessWorkers,
    batch_hash,
    outbound,
    push_failed_status,
)
from tests.support.helpers import APP_SECRET
from tests.worker.support import push_message, push_status, review_items, stats, wait_for
from worker.conversation_store import ConversationStore

PERSON = "5491155550051"
TWO_PARTS = "\n\n".join(" ".join(f"Parte {p}, frase {i}." for i in range(200)) for p in (1, 2))


async def statuses_of(redis: Redis, prefix: str, graph: GraphApiStandIn) -> list[str]:
    return [
        (await outbound(redis, prefix, m.wamid)).get("status", "") for m in graph.sent_messages()
    ]


async def settled(
    redis: Redis, prefix: str, graph: GraphApiStandIn, parts: int, status: str
) -> dict[str, int]:
    """Once `parts` parts were sent, every webhook delivered, and each record shows `status`."""

    async def probe() -> dict[str, int] | None:
        if len(graph.sent_messages()) < parts or graph.pending_webhooks:
            return None
        if await statuses_of(redis, prefix, graph) != [status] * parts:
            return None
        counts = await stats(redis, prefix)
        return counts if counts.get("turns") == 1 else None

    return await wait_for(probe, f"{parts} part(s) {status} and the turn ended", timeout_s=10)


@pytest.mark.cluster
async def test_statuses_move_each_part_forward_and_are_counted(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    graph.configure(webhook_url=receiver_url, app_secret=APP_SECRET)
    await workers.start()
    ai.queue_reply(TWO_PARTS)
    await push_message(redis, prefix, PERSON, "wamid.s1", "hola")

    counts = await settled(redis, prefix, graph, 2, "read")
    assert all(d.ok for d in graph.webhook_deliveries), "the receiver accepted every webhook"
    assert len(graph.webhook_deliveries) == 6
    for index, message in enumerate(graph.sent_messages()):
        record = await outbound(redis, prefix, message.wamid)
        assert record["part"] == str(index) and record["person"] == PERSON
    assert counts["messages"] == 1 and counts["turns"] == 1
    assert counts["parts_out"] == 2 and counts["statuses"] == 6
    assert counts["parts_sent"] == counts["parts_delivered"] == counts["parts_read"] == 2
    assert "parts_failed" not in counts and await review_items(redis, prefix) == []


async def test_a_late_delivered_never_downgrades_read(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    # read first, then delivered, then sent: each later one is older news.
    graph.configure(webhook_url=receiver_url, app_secret=APP_SECRET, out_of_order=True)
    await workers.start()
    await push_message(redis, prefix, PERSON, "wamid.s2", "hola")

    counts = await settled(redis, prefix, graph, 1, "read")
    assert [d.status for d in graph.webhook_deliveries] == ["read", "delivered", "sent"]
    assert counts["statuses"] == 3 and counts["status:delivered"] == 1
    assert counts["parts_read"] == 1
    assert "parts_delivered" not in counts and "parts_sent" not in counts


async def test_a_failed_131047_after_an_accepted_send_sends_the_template_once_and_parks_the_batch(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    settings: Settings,
) -> None:
    """Every webhook through the real receiver: Meta accepts the reply, then reports 131047.
    The tenant's template goes out once, the memory marks the reply as not delivered, and the
    review item holds the batch's messages: requeued, it is answered again."""
    other = "5491155550052"
    graph.configure(webhook_url=receiver_url, app_secret=APP_SECRET)
    graph.fail_status_for(PERSON, 131047)
    await workers.start()
    ai.queue_reply("Hola, ¿en qué te ayudo?")
    ai.queue_reply("Hola, ¿en qué te ayudo?")
    await push_message(redis, prefix, PERSON, "wamid.s3", "hola")
    await push_message(redis, prefix, other, "wamid.s4", "hola")

    async def all_in() -> dict[str, int] | None:
        counts = await stats(redis, prefix)
        done = counts.get("parts_read") == 2 and counts.get("turns") == 2
        return counts if done and counts.get("review:window_closed") == 1 else None

    counts = await wait_for(all_in, "both turns, the template read and the item")
    (item,) = await review_items(redis, prefix)
    (failed,) = graph.sent_texts(PERSON)
    (template,) = graph.sent_templates(PERSON)
    assert item["person"] == PERSON and item["reason"] == "window_closed"
    assert "131047" in item["error"] and failed.wamid in item["error"]
    assert "Re-engagement message" in item["error"]
    assert [m["id"] for m in item["messages"]] == ["wamid.s3"]
    late = item["late_failure"]
    assert late["template"] == f"sent {template.wamid}"
    (part,) = late["parts"]
    assert (part["id"], part["code"], part["part"]) == (failed.wamid, 131047, 0)
    assert part["text"] == "Hola, ¿en qué te ayudo?"
    record = await outbound(redis, prefix, failed.wamid)
    assert record["status"] == "failed" and record["error"] == "131047"
    assert (await outbound(redis, prefix, template.wamid))["status"] == "read"
    assert counts["parts_out"] == 3 and counts["parts_failed"] == 1
    (delivered,) = graph.sent_texts(other)
    assert (await outbound(redis, prefix, delivered.wamid))["status"] == "read"
    k = Keys(prefix).tenant(TENANT)
    (memory,) = [orjson.loads(e) for e in await redis.lrange(k.memory(PERSON), 0, -1)]
    assert memory["assistant"] == "[not delivered: 131047] Hola, ¿en qué te ayudo?"

    # Requeued (the person can be reached again), the batch is answered anew.
    graph.configure(fail_status_recipients={})
    review = ReviewList(redis, Keys(prefix), Scripts())
    await review.requeue(TENANT, item["id"])

    async def answered_again() -> list[object] | None:
        texts = graph.sent_texts(PERSON)
        read = [await outbound(redis, prefix, m.wamid) for m in texts[1:]]
        return read if read and read[0].get("status") == "read" else None

    await wait_for(answered_again, "the requeued batch answered and read")
    assert len(graph.sent_templates(PERSON)) == 1 and await review_items(redis, prefix) == []


async def test_statuses_that_overtake_the_record_of_their_send_are_not_lost(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Webhooks posted the moment Meta accepts, many turns at once: a status can reach Redis
    before the worker recorded the send it is about; it must still count."""
    graph.configure(webhook_url=receiver_url, app_secret=APP_SECRET, status_delays=(0.0,))
    people = [f"54911555{i:04d}" for i in range(20)]
    failing = people[::2]
    for person in failing:
        graph.fail_status_for(person, 131047)
    await workers.start(WORKER_CONCURRENCY=len(people))
    for person in people:
        await push_message(redis, prefix, person, f"wamid.in.{person}", "hola")

    async def all_in() -> dict[str, int] | None:
        counts = await stats(redis, prefix)
        # the others' replies and the failing people's templates are read
        done = counts.get("parts_read", 0) == len(people)
        done = done and counts.get("parts_failed", 0) == len(failing)
        done = done and counts.get("review:window_closed") == len(failing)
        return counts if done and counts.get("turns") == len(people) else None

    await wait_for(all_in, "every status applied", timeout_s=20)
    parked = {item["person"] for item in await review_items(redis, prefix)}
    assert parked == set(failing)
    finals = {m.to: (await outbound(redis, prefix, m.wamid))["status"] for m in graph.sent_texts()}
    assert finals == {p: "failed" if p in failing else "read" for p in people}
    assert sorted(m.to for m in graph.sent_templates()) == sorted(failing)


async def test_an_early_status_is_parked_and_applied_by_record_part(
    redis: Redis, prefix: str, settings: Settings
) -> None:
    """The same race, deterministically, on the scripts: statuses first, then the records."""
    scripts = Scripts()
    await scripts.load(redis)
    store = ConversationStore(
        settings.with_overrides(key_prefix=prefix, debounce_window_s=0.01, max_wait_s=0.01),
        scripts,
        GroupCommitter(redis, scripts),
    )
    await push_message(redis, prefix, PERSON, "wamid.in", "hola")
    await store.claim(TENANT, 0, "intake")
    await asyncio.sleep(0.05)
    (batch,) = (await store.claim(TENANT, 1, "turn")).batches
    await push_status(redis, prefix, PERSON, "wamid.out.0", "delivered")
    await push_status(redis, prefix, PERSON, "wamid.out.0", "sent")  # older news, later
    await push_failed_status(redis, prefix, PERSON, "wamid.out.1", 131047)
    await push_status(redis, prefix, PERSON, "wamid.out.other", "read")  # not ours
    await store.claim(TENANT, 0, "intake")

    counts = await stats(redis, prefix)
    assert counts["statuses"] == 4 and not any(name.startswith("parts_") for name in counts)
    assert await store.record_part(batch, 0, "wamid.out.0")
    assert await store.record_part(batch, 1, "wamid.out.1")

    first = await outbound(redis, prefix, "wamid.out.0")
    assert first["status"] == "delivered" and first["part"] == "0" and first["batch"] == batch.id
    second = await outbound(redis, prefix, "wamid.out.1")
    assert second["status"] == "failed" and second["error"] == "131047"
    assert "early" not in first and "early" not in second
    # The batch still runs: the failure waits for it to end, then becomes a batch of its own.
    k = Keys(prefix).tenant(TENANT)
    assert await review_items(redis, prefix) == [] and await redis.zscore(k.due, PERSON) is None
    assert await store.finish_done(batch)
    late = await batch_hash(redis, prefix, PERSON)
    assert late["late_of"] == batch.id and late["late_template"] == "1"
    assert late["id"].startswith(f"{batch.id}:late-") and "wamid.in" in late["messages"]
    (job,) = orjson.loads(late["late_jobs"])
    assert (job["id"], job["part"], job["code"]) == ("wamid.out.1", 1, 131047)
    assert job["title"] == "Re-engagement message"
    assert await redis.zscore(k.due, PERSON) is not None
    counts = await stats(redis, prefix)
    assert counts["parts_out"] == 2 and counts["parts_delivered"] == 1
    assert counts["parts_failed"] == 1 and "parts_sent" not in counts
    assert 0 < await redis.ttl(k.outbound("wamid.out.other")) <= 3600, "not ours: expires soon"
    assert not await redis.exists(k.outbound("wamid.out.0")), "the parked status was applied"
    book = [key async for key in redis.scan_iter(match=k.outbound_book_pattern)]
    assert book and all([3600 < await redis.ttl(key) for key in book]), "records: 7 days"
