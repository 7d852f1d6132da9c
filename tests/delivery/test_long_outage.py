"""WhatsApp messages Meta redelivers long after an outage (issue 22, item 2;
docs/operating.md#after-an-outage). Meta retries a webhook that did not get a 200 for up to 7
days, so after an outage messages arrive hours or days after they were written, each with its
own `timestamp`, and some more than once. Through the real receiver (Meta's signature checked)
and a real worker (the anthropic SDK against the Messages API stand-in, the Graph API stand-in):

- with the default `REVIEW_AFTER_S` (15 minutes), a message written 3 hours before it reached
  us is not answered by the AI: it is on the review list as `too_old`, stored once although
  Meta delivered it twice, nothing read, typed or sent; requeued from there (what the ops
  console's bulk requeue does after an outage), it is answered, and the AI is told when it
  is answering and how late;
- a business that raised `REVIEW_AFTER_S` to 6 hours gets the 3-hour-old message answered at
  once, the AI told how late, answered once whatever the redeliveries (before the turn, and
  after the reply); a message written 2 days before still goes to review as `too_old`."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from scripts.webhooks import text_message
from shared.keys import Keys
from shared.ops.review import ReviewList
from shared.storage.scripts import Scripts
from tests.delivery.support import (
    TENANT,
    InProcessWorkers,
    ai_requests,
    inbound,
    post_webhook,
)
from tests.worker.support import in_review, review_items

pytestmark = pytest.mark.slow

HOUR_S = 3600
DAY_S = 24 * HOUR_S
# The turn runs seconds after the webhook; a loaded machine may make it a minute or two.
THREE_HOURS_LATE = re.compile(
    r", 3 hours( [0-9] minutes?)? after their last message; this reply is late\.$"
)


def _written(seconds_ago: int) -> int:
    return int(time.time()) - seconds_ago


async def _delivered_twice(receiver_url: str, body: bytes) -> None:
    """Meta's redelivery: the same signed body, twice (both answered 200)."""
    await asyncio.gather(post_webhook(receiver_url, body), post_webhook(receiver_url, body))


def _user_turn(ai: MessagesApiStandIn, index: int = -1) -> list[str]:
    content = ai_requests(ai)[index].body["messages"][-1]["content"]
    return [block["text"] for block in content]


async def test_a_message_hours_late_goes_to_review_and_a_requeue_answers_it_told_how_late(
    redis: Redis,
    prefix: str,
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    person = "5491155550081"
    await workers.start()  # REVIEW_AFTER_S at its default, 900 s
    question = text_message("wamid.LATE1", "¿tienen turno el sábado?", person, _written(3 * HOUR_S))
    await _delivered_twice(receiver_url, inbound(TENANT, person, question))

    (item,) = await in_review(redis, prefix, what="the 3-hour-old message in review")
    assert item["reason"] == "too_old" and item["person"] == person
    assert [m["id"] for m in item["messages"]] == ["wamid.LATE1"], "stored once"
    assert ai_requests(ai) == [] and graph.sent_texts(to=person) == []
    assert graph.read_receipts() == []

    # After the outage a person requeues the backlog: the AI answers, told how late.
    await ReviewList(redis, Keys(prefix), Scripts()).requeue(TENANT, item["id"])
    (reply,) = await graph.await_for(lambda: graph.sent_texts(to=person), timeout=15)
    assert reply.body == "stand-in reply to: ¿tienen turno el sábado?"
    header, body = _user_turn(ai)
    assert header.splitlines()[-1].startswith("Answered: ")
    assert THREE_HOURS_LATE.search(header), header
    assert body == "¿tienen turno el sábado?"
    assert await review_items(redis, prefix) == []


async def test_with_review_after_raised_hours_late_is_answered_once_and_days_late_is_not(
    redis: Redis,
    prefix: str,
    receiver_url: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    hours, days = "5491155550082", "5491155550083"
    await workers.start(REVIEW_AFTER_S=6 * HOUR_S)
    question = text_message("wamid.LATE2", "¿abren hoy?", hours, _written(3 * HOUR_S))
    stale = text_message("wamid.LATE3", "¿me mandan el presupuesto?", days, _written(2 * DAY_S))
    late_body, stale_body = inbound(TENANT, hours, question), inbound(TENANT, days, stale)
    await _delivered_twice(receiver_url, late_body)
    await _delivered_twice(receiver_url, stale_body)

    (reply,) = await graph.await_for(lambda: graph.sent_texts(to=hours), timeout=15)
    assert reply.body == "stand-in reply to: ¿abren hoy?"
    header, body = _user_turn(ai)
    assert THREE_HOURS_LATE.search(header), header
    assert body == "¿abren hoy?"

    (item,) = await in_review(redis, prefix, what="the 2-day-old message in review")
    assert item["reason"] == "too_old" and item["person"] == days
    assert [m["id"] for m in item["messages"]] == ["wamid.LATE3"]

    # Meta delivers both once more, after the answer and the review: duplicates, nothing new.
    await post_webhook(receiver_url, late_body)
    await post_webhook(receiver_url, stale_body)
    await asyncio.sleep(1.5)  # six debounce windows: a turn the duplicates made would be done
    assert len(ai_requests(ai)) == 1
    assert len(graph.sent_texts(to=hours)) == 1 and graph.sent_texts(to=days) == []
    assert len(await review_items(redis, prefix)) == 1
