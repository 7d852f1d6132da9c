"""The 24-hour customer-service window: outside it only the tenant's approved template may be
sent (once per batch); without a template the batch goes to review as "window_closed". The
window is known from the person's last inbound message (then no AI answer is bought and no
typing indicator shown), or from Meta answering 131047."""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, GraphFault, MessagesApiStandIn
from shared.keys import Keys
from shared.ops.review import ReviewList
from shared.storage.scripts import Scripts
from tests.delivery.support import (
    DAY_S,
    PLAIN_TENANT,
    TEMPLATE,
    TEMPLATE_LANGUAGE,
    TENANT,
    THREE_PARTS,
    InProcessWorkers,
    ai_requests,
    said,
)
from tests.worker.support import in_review, push_message, review_items, stats, wait_for

PERSON = "5491155550031"
# Larger than a day, so a message older than the window is still answered rather than parked
# as too old (with the default REVIEW_AFTER_S a day-old batch never reaches the sender).
PATIENT = {"REVIEW_AFTER_S": 2 * DAY_S}


async def _turns(redis: Redis, prefix: str, count: int) -> None:
    async def counted() -> bool:
        s = await stats(redis, prefix)
        return s.get("turns", 0) + sum(v for k, v in s.items() if k.startswith("review:")) >= count

    await wait_for(counted, f"{count} turn(s) ended")


async def test_outside_the_window_the_template_is_sent_once_and_the_ai_is_not_asked(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start(**PATIENT)
    old = int(time.time()) - DAY_S - 600
    await push_message(redis, prefix, PERSON, "wamid.w1", "hola", ts=old)
    await _turns(redis, prefix, 1)

    assert ai_requests(ai) == [], "an answer the template would replace is not bought"
    assert graph.read_receipts() == [], "no typing indicator promising a reply"
    (template,) = graph.sent_templates(PERSON)
    assert template.template_name == TEMPLATE
    assert template.template_language == TEMPLATE_LANGUAGE
    assert template.phone_number_id == TENANT
    assert graph.sent_texts() == []
    assert not await redis.exists(Keys(prefix).tenant(TENANT).last_inbound(PERSON))
    assert await review_items(redis, prefix) == []
    assert (await stats(redis, prefix))["parts_out"] == 1


async def test_outside_the_window_without_a_template_the_batch_goes_to_review(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start(**PATIENT)
    old = int(time.time()) - DAY_S - 600
    await push_message(redis, prefix, PERSON, "wamid.w2", "hola", ts=old, tenant=PLAIN_TENANT)

    (item,) = await in_review(redis, prefix, PLAIN_TENANT)
    assert item["reason"] == "window_closed" and item["person"] == PERSON
    assert graph.sent_messages() == []
    assert graph.read_receipts() == [], "no typing indicator when no reply can follow"
    assert ai_requests(ai) == [], "no AI answer is bought that nobody could receive"
    assert (await stats(redis, prefix, PLAIN_TENANT))["review:window_closed"] == 1


async def test_meta_answering_131047_sends_the_template_once(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Our clock says the window is open, Meta says it closed: the same as a closed window."""
    await workers.start()
    ai.queue_reply(THREE_PARTS)
    graph.fail_recipient(PERSON, 131047, kinds=["text"])
    await push_message(redis, prefix, PERSON, "wamid.w3", "hola")
    await _turns(redis, prefix, 1)

    (template,) = graph.sent_templates(PERSON)
    assert template.template_name == TEMPLATE
    assert graph.sent_texts() == []
    assert len(ai_requests(ai)) == 1
    assert await review_items(redis, prefix) == []


async def test_meta_answering_131047_without_a_template_parks_the_batch(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start()
    graph.fail_recipient(PERSON, 131047, message="Re-engagement message")
    await push_message(redis, prefix, PERSON, "wamid.w4", "hola", tenant=PLAIN_TENANT)

    (item,) = await in_review(redis, prefix, PLAIN_TENANT)
    assert item["reason"] == "window_closed"
    assert item["error"] == "131047: Re-engagement message"
    assert item["reply"], "the reply that was not delivered is on the item (issue 23)"
    assert graph.sent_messages() == []
    assert len(ai_requests(ai)) == 1
    assert "retries" not in await stats(redis, prefix, PLAIN_TENANT)


async def test_a_reply_replaced_by_the_template_is_not_remembered_as_said(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Meta says 131047 to the reply: the person never saw it, so the next turn must not be
    told it was sent."""
    await workers.start()
    ai.queue_reply("Respuesta que nunca llegó.", "Ahora sí.")
    graph.fail_next(1, 131047, kinds=["text"])
    await push_message(redis, prefix, PERSON, "wamid.w5", "hola")
    await _turns(redis, prefix, 1)
    assert len(graph.sent_templates(PERSON)) == 1

    await push_message(redis, prefix, PERSON, "wamid.w6", "¿sigue abierto?")
    (text,) = await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=10)
    assert text.body == "Ahora sí."
    second = ai_requests(ai)[1].body["messages"]
    assert said(second) == [("user", "¿sigue abierto?")]


async def test_a_closed_window_then_a_new_message_asks_the_ai_with_nothing_remembered(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start(**PATIENT)
    old = int(time.time()) - DAY_S - 600
    await push_message(redis, prefix, PERSON, "wamid.w12", "hola", ts=old)
    await _turns(redis, prefix, 1)
    assert len(graph.sent_templates(PERSON)) == 1 and ai_requests(ai) == []

    await push_message(redis, prefix, PERSON, "wamid.w13", "¿sigue abierto?")  # reopens it
    (text,) = await graph.await_for(lambda: graph.sent_texts(PERSON), timeout=10)
    assert text.body == "stand-in reply to: ¿sigue abierto?"
    (request,) = ai_requests(ai)
    assert said(request.body["messages"]) == [("user", "¿sigue abierto?")]
    assert [r.message_id for r in graph.read_receipts()] == ["wamid.w13"]


async def test_a_day_old_batch_requeued_from_review_gets_the_template(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """The usual way a closed window meets the sender: a human requeues a too-old batch."""
    await workers.start()  # REVIEW_AFTER_S at its default: a day-old batch is too old
    await push_message(redis, prefix, PERSON, "wamid.w7", "hola", ts=int(time.time()) - DAY_S - 600)

    (item,) = await in_review(redis, prefix, what="the old batch in review")
    assert item["reason"] == "too_old" and graph.requests == []
    await ReviewList(redis, Keys(prefix), Scripts()).requeue(TENANT, str(item["id"]))

    (template,) = await graph.await_for(lambda: graph.sent_templates(PERSON), timeout=10)
    assert template.template_name == TEMPLATE
    await _turns(redis, prefix, 2)
    assert graph.sent_texts() == [] and graph.read_receipts() == []
    assert ai_requests(ai) == [] and await review_items(redis, prefix) == []


def _template_requests(graph: GraphApiStandIn, person: str) -> list[Any]:
    """Every template request to `person`, answered or not."""
    return [r for r in graph.requests if r.kind == "template" and r.extra.get("to") == person]


def _text_requests(graph: GraphApiStandIn, person: str) -> list[Any]:
    return [r for r in graph.requests if r.kind == "text" and r.extra.get("to") == person]


async def test_a_template_whose_answer_never_came_is_not_sent_again_and_a_person_is_told(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Meta accepts the template but its answer never comes (the client times out): it may
    have gone out, so no attempt sends it again, and the batch does not end as answered
    either: it is in review as delivery_unknown, saying which template, when and why."""
    # A 1 s client timeout (no ordinary answer takes that long, even on a loaded machine).
    await workers.start(WHATSAPP_TIMEOUT_S=1, **PATIENT)
    graph.hang_next(1, 3.0, kinds=["template"])  # accepted after 3 s, the client gone by then
    before_ms = int(time.time() * 1000)
    await push_message(redis, prefix, PERSON, "wamid.w8", "hola", ts=int(time.time()) - DAY_S - 600)
    await _turns(redis, prefix, 1)

    (item,) = await review_items(redis, prefix)
    assert item["reason"] == "delivery_unknown" and item["attempts"] == 0
    unknown = item["delivery_unknown"]
    assert (unknown["what"], unknown["text"], unknown["part"]) == ("template", TEMPLATE, 0)
    assert "ReadTimeout" in unknown["error"]
    assert before_ms <= unknown["at_ms"] <= int(time.time() * 1000)
    assert item["error"].startswith(f"template {TEMPLATE} (in place of part 1 of 1): no answer")
    counts = await stats(redis, prefix)
    assert counts["unknown:template"] == 1 and "retries" not in counts and "turns" not in counts
    await graph.await_for(lambda: graph.sent_templates(PERSON), timeout=10)  # the hung one
    assert len(_template_requests(graph, PERSON)) == 1
    assert graph.sent_texts() == [] and ai_requests(ai) == []


def _first_text_then_131047(graph: GraphApiStandIn, person: str) -> None:
    """The first text to `person` is accepted, every later one gets 131047 (window closed)."""
    graph.add_fault(GraphFault(to=person, kinds=frozenset({"text"}), count=1))  # passes through
    graph.fail_recipient(person, 131047, message="Re-engagement message", kinds=["text"])


async def test_131047_on_a_later_part_sends_the_template_once_and_nothing_more(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Part 1 reached the person; part 2 finds the window closed: the person is told with the
    template (once), the third part is not tried, and the turn ends answered."""
    await workers.start()
    ai.queue_reply(THREE_PARTS)
    _first_text_then_131047(graph, PERSON)
    await push_message(redis, prefix, PERSON, "wamid.w9", "hola")
    await _turns(redis, prefix, 1)

    (first,) = graph.sent_texts(PERSON)
    assert first.body is not None and first.body.startswith("Parte 0")
    (template,) = graph.sent_templates(PERSON)
    assert template.template_name == TEMPLATE
    assert len(_text_requests(graph, PERSON)) == 2, "part 3 is not tried after the 131047"
    assert len(_template_requests(graph, PERSON)) == 1
    assert await review_items(redis, prefix) == []
    counts = await stats(redis, prefix)
    assert counts["turns"] == 1 and "retries" not in counts, counts


async def test_131047_on_a_later_part_without_a_template_parks_what_was_sent(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """No template: the batch goes to review as window_closed, and the item says which parts
    the person already has, so whoever picks it up continues from there."""
    await workers.start()
    ai.queue_reply(THREE_PARTS)
    _first_text_then_131047(graph, PERSON)
    await push_message(redis, prefix, PERSON, "wamid.w10", "hola", tenant=PLAIN_TENANT)

    (item,) = await in_review(redis, prefix, PLAIN_TENANT)
    (first,) = graph.sent_texts(PERSON)
    assert item["reason"] == "window_closed"
    assert item["error"] == "131047: Re-engagement message"
    assert item["parts_sent"] == {"0": first.wamid}
    assert item["parts_total"] == 3
    assert item["reply"] == THREE_PARTS, "the reply that did not go out is on the item"
    assert graph.sent_templates() == [] and len(_text_requests(graph, PERSON)) == 2
    assert "retries" not in await stats(redis, prefix, PLAIN_TENANT)


async def test_a_template_meta_refused_is_sent_again_by_the_retry(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """An error answer means the template did not go out: the note is cleared, the retry
    sends it (the note only stops a second one, never the first)."""
    await workers.start(**PATIENT)
    graph.fail_next(1, 131000, kinds=["template"])
    await push_message(
        redis, prefix, PERSON, "wamid.w11", "hola", ts=int(time.time()) - DAY_S - 600
    )
    await _turns(redis, prefix, 1)

    assert len(_template_requests(graph, PERSON)) == 2
    assert len(graph.sent_templates(PERSON)) == 1
    assert ai_requests(ai) == [], "neither attempt asked the AI"
    counts = await stats(redis, prefix)
    assert counts["retries"] == 1 and counts["turns"] == 1, counts
