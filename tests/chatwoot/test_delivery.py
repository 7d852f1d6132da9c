"""Chatwoot end to end: signed webhooks into the real receiver, a real worker, replies and
hand-overs through the real Chatwoot sender (httpx) to the API stand-in, which posts every
message it creates back to the receiver, as Chatwoot does. Same debounce, lock, retry and
review as WhatsApp; only the provider differs."""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from scripts.standins import ChatwootApiStandIn, ChatwootFault
from shared.keys import Keys
from shared.ops import markers
from tests.chatwoot import brains
from tests.chatwoot.support import CONVERSATION, TENANT, ended, post_message
from tests.delivery.support import InProcessWorkers, outbound
from tests.worker.support import in_review, outbox, push_message, review_items, stats, wait_for

WA_TENANT = "106540352242922"


async def echoes_answered(chatwoot: ChatwootApiStandIn, count: int) -> None:
    """Until the stand-in posted `count` created messages back and the receiver answered."""
    await chatwoot.await_for(
        lambda: chatwoot.pending_webhooks == 0 and len(chatwoot.webhook_deliveries) >= count,
        timeout=10,
    )
    assert [d.response_status for d in chatwoot.webhook_deliveries] == [200] * count


async def test_a_burst_of_three_is_one_reply_and_the_bots_own_reply_is_not_taken_in(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start()
    for i, line in enumerate(["hola", "una consulta", "¿tienen turno el sábado?"]):
        await post_message(receiver_url, 101 + i, line)

    (reply,) = await chatwoot.await_for(lambda: chatwoot.replies(CONVERSATION), timeout=10)
    assert reply.content == "Got 3 messages: hola / una consulta / ¿tienen turno el sábado?"
    assert reply.account == 1
    (typing,) = chatwoot.calls("typing", CONVERSATION)
    assert typing.time < reply.time, "typing shown before the reply"
    counts = await ended(redis, prefix)
    assert counts["messages"] == 3 and counts["turns"] == 1 and counts["parts_out"] == 1
    # The part is recorded under Chatwoot's message id: a retry would not send it again.
    record = await outbound(redis, prefix, str(reply.id), TENANT)
    assert (record["person"], record["part"], record["status"]) == ("42", "0", "accepted")

    # Chatwoot posts the bot's reply back as an outgoing message_created: answered, not stored.
    await echoes_answered(chatwoot, 1)
    k = Keys(prefix).tenant(TENANT)
    assert await redis.llen(k.inbox) == 0
    assert await redis.exists(k.pending("42")) == 0
    assert await markers.count(redis, k) == 3
    assert chatwoot.replies() == [reply] and chatwoot.notes() == []


async def test_duplicates_give_nothing_more(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start()
    first = await post_message(receiver_url, 201, "hola", delivery="d-201")
    # Chatwoot's retry (same delivery) and its duplicate-event bug (new delivery), at once.
    retry = await post_message(receiver_url, 201, "hola", delivery="d-201")
    again = await post_message(receiver_url, 201, "hola", delivery="d-202")
    assert first.headers["x-stored"] == "1"
    assert [(r.headers["x-stored"], r.headers["x-duplicates"]) for r in (retry, again)] == [
        ("0", "1"),
        ("0", "1"),
    ]
    await chatwoot.await_for(lambda: chatwoot.replies(CONVERSATION), timeout=10)
    await ended(redis, prefix)
    # Late duplicates after the reply, then one new message: the next turn holds only it.
    await post_message(receiver_url, 201, "hola", delivery="d-203")
    await post_message(receiver_url, 202, "nuevo")
    await chatwoot.await_for(lambda: len(chatwoot.replies(CONVERSATION)) == 2, timeout=10)
    assert [m.content for m in chatwoot.replies()] == [
        "Got 1 message: hola",
        "Got 1 message: nuevo",
    ]
    counts = await ended(redis, prefix, 2)
    assert counts["messages"] == 2 and counts["turns"] == 2


async def test_a_batch_chatwoot_rejects_is_handed_to_a_person_with_a_private_note(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start()
    chatwoot.fail_next(1, 422, message="Conversation is locked", kinds=["reply"])
    await post_message(receiver_url, 301, "hola")

    (item,) = await in_review(redis, prefix, TENANT)
    assert item["reason"] == "invalid_request" and item["attempts"] == 0
    assert item["error"] == "HTTP 422: Conversation is locked"
    assert item["hand_over"] == "done"
    assert [m["text"] for m in item["messages"]] == ["hola"]
    (note,) = chatwoot.notes(CONVERSATION)
    assert "invalid_request: HTTP 422: Conversation is locked" in note.content
    assert chatwoot.status_of(CONVERSATION) == "open"
    assert chatwoot.replies() == []
    assert len(chatwoot.calls("reply")) == 1, "not retried"
    # The private note comes back as a webhook too: not taken in.
    await echoes_answered(chatwoot, 1)
    assert await redis.llen(Keys(prefix).tenant(TENANT).inbox) == 0
    counts = await stats(redis, prefix, TENANT)
    assert counts["messages"] == 1 and counts["review:invalid_request"] == 1


async def test_a_batch_too_old_to_answer_is_handed_over_without_typing_or_reply(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start(REVIEW_AFTER_S=600)
    await post_message(receiver_url, 401, "hola", created_at=time.time() - 3600)

    (item,) = await in_review(redis, prefix, TENANT)
    assert item["reason"] == "too_old" and item["hand_over"] == "done"
    (note,) = chatwoot.notes(CONVERSATION)
    assert "too_old" in note.content
    assert chatwoot.status_of(CONVERSATION) == "open"
    assert chatwoot.calls("typing") == [] and chatwoot.calls("reply") == []


async def test_rate_limits_are_retried_and_the_reply_goes_out_once(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start()
    chatwoot.fail_next(2, 429, kinds=["reply"])
    await post_message(receiver_url, 501, "hola")

    counts = await ended(redis, prefix)
    assert counts["turns"] == 1 and counts["retries"] == 2
    assert [c.status for c in chatwoot.calls("reply")] == [429, 429, 200]
    assert [m.content for m in chatwoot.replies()] == ["Got 1 message: hola"]
    assert chatwoot.notes() == [] and chatwoot.status_of(CONVERSATION) is None
    assert await review_items(redis, prefix, TENANT) == []


async def test_a_batch_that_keeps_failing_is_handed_over_after_max_attempts(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start()
    chatwoot.fail_always(503, kinds=["reply"])
    await post_message(receiver_url, 601, "hola")

    (item,) = await in_review(redis, prefix, TENANT)
    assert item["reason"] == "max_attempts" and item["attempts"] == 3
    assert "Chatwoot HTTP 503" in item["error"] and item["hand_over"] == "done"
    assert len(chatwoot.calls("reply")) == 3
    assert chatwoot.status_of(CONVERSATION) == "open"


async def test_a_failed_hand_over_keeps_the_review_item_and_says_so(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start()
    chatwoot.fail_next(1, 404, message="Resource could not be found", kinds=["reply"])
    chatwoot.fail_always(503, kinds=["note", "status"])
    await post_message(receiver_url, 701, "hola")

    (item,) = await in_review(redis, prefix, TENANT)
    assert item["reason"] == "not_found"
    assert item["hand_over"].startswith("failed: RetryLater: Chatwoot HTTP 503")
    assert [m["text"] for m in item["messages"]] == ["hola"]
    assert len(chatwoot.calls("note")) == 3, "the hand-over was retried"
    assert chatwoot.status_of(CONVERSATION) is None


async def test_each_conversation_is_answered_by_its_own_provider(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start()  # SENDER unset, no Graph API token: WhatsApp replies to the outbox
    await push_message(redis, prefix, "5491155550001", "wamid.m1", "hola wa", tenant=WA_TENANT)
    await post_message(receiver_url, 801, "hola cw")

    await chatwoot.await_for(lambda: chatwoot.replies(CONVERSATION), timeout=10)

    async def wa_replied() -> list[dict[str, Any]]:
        return await outbox(redis, prefix, WA_TENANT)

    (wa,) = await wait_for(wa_replied, "the WhatsApp reply in the outbox")
    assert wa["text"] == "Got 1 message: hola wa" and wa["person"] == "5491155550001"
    assert [m.content for m in chatwoot.replies()] == ["Got 1 message: hola cw"]
    assert await outbox(redis, prefix, TENANT) == []


async def test_without_a_chatwoot_token_a_whatsapp_only_worker_parks_chatwoot_batches(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    # SENDER becomes `whatsapp`, which cannot reach a Chatwoot conversation.
    await workers.start(
        CHATWOOT_API_ACCESS_TOKEN="",
        WHATSAPP_ACCESS_TOKEN="wa-token",
        WHATSAPP_API_BASE_URL="http://127.0.0.1:9",
    )
    await post_message(receiver_url, 901, "hola")

    (item,) = await in_review(redis, prefix, TENANT)
    assert item["reason"] == "no_sender" and "chatwoot" in item["error"]
    assert "hand_over" not in item
    assert chatwoot.requests == []


async def test_a_retried_turn_never_resends_a_part_chatwoot_accepted(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    brains.CALLS.clear()
    await workers.start(BRAIN="tests.chatwoot.brains:TwoPartBrain")
    chatwoot.fail_next(1, 503, kinds=["reply"], after=1)  # the second part fails once
    await post_message(receiver_url, 1001, "hola")

    counts = await ended(redis, prefix)
    assert [c.status for c in chatwoot.calls("reply")] == [200, 503, 200]
    assert [m.content for m in chatwoot.replies()] == list(brains.parts_of("hola"))
    assert counts["turns"] == 1 and counts["retries"] == 1 and counts["parts_out"] == 2
    assert len(brains.CALLS) == 1, "the stored reply was sent on, the AI not asked again"


async def test_markdown_goes_to_chatwoot_as_it_is(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    """Chatwoot renders Markdown itself: WhatsApp's conversion (shared/senders/formatting.py) is for
    WhatsApp conversations only."""
    await workers.start(BRAIN="tests.chatwoot.brains:MarkdownBrain")
    await post_message(receiver_url, 1101, "¿horarios?")
    (reply,) = await chatwoot.await_for(lambda: chatwoot.replies(CONVERSATION), timeout=10)
    assert reply.content == brains.MARKDOWN


async def test_a_reply_chatwoot_may_have_created_is_not_posted_again_and_the_agent_is_told(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    """Chatwoot creates the reply but its answer is lost (a timeout, then a connection cut
    mid-answer, one conversation each): a second POST would be a second message, so none is
    made. Each batch is in review as delivery_unknown, and the hand-over note asks the agent
    to look for that message in the conversation."""
    # A 1 s timeout: the other calls (typing, note, status) answer within it even on a loaded
    # machine, while the 3 s delay always outlasts it.
    await workers.start(CHATWOOT_TIMEOUT_S=1.0)
    chatwoot.add_fault(ChatwootFault(delay=3.0, conversation=42, kinds=frozenset({"reply"})))
    chatwoot.add_fault(ChatwootFault(drop=True, conversation=43, kinds=frozenset({"reply"})))
    await post_message(receiver_url, 1201, "hola", conversation=42)
    await post_message(receiver_url, 1202, "buenas", conversation=43)

    counts = await ended(redis, prefix, 2)
    items = {i["person"]: i for i in await review_items(redis, prefix, TENANT)}
    for conversation, error, text in (
        (42, "ReadTimeout", "Got 1 message: hola"),
        (43, "RemoteProtocolError", "Got 1 message: buenas"),
    ):
        item = items[str(conversation)]
        assert item["reason"] == "delivery_unknown" and item["hand_over"] == "done"
        assert item["delivery_unknown"]["text"] == text
        assert error in item["delivery_unknown"]["error"]
        assert len(chatwoot.calls("reply", conversation)) == 1, "not posted again"
        (note,) = chatwoot.notes(conversation)
        assert f'Check whether the bot\'s part 1 of 1, starting "{text}"' in note.content
        assert chatwoot.status_of(conversation) == "open"
    assert counts["review:delivery_unknown"] == 2 and counts["unknown:part"] == 2
    assert "retries" not in counts and "turns" not in counts
    # Both replies did reach the conversation: what nobody could know.
    await chatwoot.await_for(lambda: len(chatwoot.replies()) == 2, timeout=15)


async def test_a_hand_over_note_chatwoot_did_not_answer_is_not_posted_again(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    await workers.start(REVIEW_AFTER_S=600, CHATWOOT_TIMEOUT_S=1.0)  # see above
    chatwoot.hang_next(1, 3.0, kinds=["note"])
    await post_message(receiver_url, 1301, "hola", created_at=time.time() - 3600)

    (item,) = await in_review(redis, prefix, TENANT)
    assert item["reason"] == "too_old"
    assert item["hand_over"].startswith("unknown: Chatwoot did not answer: ReadTimeout")
    assert item["hand_over"].endswith("; status set to open")
    assert item["hand_over_steps"]["status"] == "open"
    assert len(chatwoot.calls("note")) == 1 and chatwoot.status_of(CONVERSATION) == "open"
    assert (await stats(redis, prefix, TENANT))["unknown:note"] == 1
    await chatwoot.await_for(lambda: chatwoot.notes(CONVERSATION), timeout=15)  # the hung one
    assert len(chatwoot.notes(CONVERSATION)) == 1
