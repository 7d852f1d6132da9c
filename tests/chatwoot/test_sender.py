"""The Chatwoot sender with its real httpx client against the Chatwoot API stand-in: what it
sends, and how each answer is classified (retry later, review, or unknown)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from scripts.standins import ChatwootApiStandIn, free_port
from shared.conversation.batch import Batch, Message
from shared.conversation.errors import DeliveryUnknown, NeedsReview, RetryLater
from shared.conversation.review_journal import SENDING, ReviewJournal
from shared.conversation.turn_state import Delivery, TurnState
from shared.conversation.unknowns import UnknownDelivery
from shared.senders.chatwoot import ChatwootError, ChatwootSender
from shared.settings import Settings
from tests.chatwoot.support import API_TOKEN, TENANT_API_TOKEN
from tests.worker.support import batch_of

TENANT = "cw-1-3"
OTHER_TENANT = "cw-7-9"


def batch(tenant: str = TENANT, conversation: int = 42) -> Batch:
    message = Message(id="9001", type="text", text="hola", ts=0, channel="chatwoot")
    return batch_of([message], tenant=tenant, person=str(conversation), id="b-1")


@pytest.fixture
async def sender(chatwoot: ChatwootApiStandIn) -> AsyncIterator[ChatwootSender]:
    settings = Settings(
        chatwoot_base_url=chatwoot.url,
        chatwoot_api_access_token=API_TOKEN,
        tenants={OTHER_TENANT: {"access_token": TENANT_API_TOKEN}},
    )
    # 1 s: no ordinary answer of the stand-in takes that long, even on a loaded machine; the
    # hangs below (3 s) always outlast it.
    client = httpx.AsyncClient(base_url=chatwoot.url, timeout=1.0)
    cw = ChatwootSender(settings, client=client, hand_over_backoff_s=0.01)
    try:
        yield cw
    finally:
        await cw.aclose()


async def test_a_part_is_an_outgoing_public_message_and_its_id_is_returned(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    first = await sender.send(batch(), "¡Hola! Sí, el sábado a las 16.", 0)
    second = await sender.send(batch(OTHER_TENANT, 5), "segunda", 1)
    a, b = chatwoot.replies()
    assert (first, second) == (str(a.id), str(b.id)) and a.id != b.id
    assert (a.account, a.conversation, a.content) == (1, 42, "¡Hola! Sí, el sábado a las 16.")
    assert (b.account, b.conversation) == (7, 5)
    calls = chatwoot.calls("reply")
    assert calls[0].path == "/api/v1/accounts/1/conversations/42/messages"
    assert calls[0].body == {
        "content": "¡Hola! Sí, el sábado a las 16.",
        "message_type": "outgoing",
        "private": False,
    }
    # The global token, and the tenant's own from TENANTS_FILE.
    assert [c.headers["api_access_token"] for c in calls] == [API_TOKEN, TENANT_API_TOKEN]


async def test_begin_turn_shows_typing_and_never_fails_the_turn(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    await sender.begin_turn(batch())
    chatwoot.fail_next(1, 404, kinds=["typing"])
    await sender.begin_turn(batch())
    chatwoot.hang_next(1, 3.0, kinds=["typing"])
    await sender.begin_turn(batch())  # times out: logged, not raised
    typing = chatwoot.calls("typing")
    assert [c.body for c in typing] == [{"typing_status": "on"}] * 3
    assert [c.status for c in typing[:2]] == [200, 404]


@pytest.mark.parametrize("status", [429, 500, 502, 503])
async def test_rate_limits_and_server_errors_are_retried_later(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn, status: int
) -> None:
    chatwoot.fail_next(1, status, kinds=["reply"])
    with pytest.raises(RetryLater, match=f"Chatwoot HTTP {status}"):
        await sender.send(batch(), "hola", 0)
    assert chatwoot.replies() == []


async def test_a_proxy_error_page_and_no_connection_are_retried_later(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    chatwoot.fail_raw(1, 502, "<h1>502 Bad Gateway</h1>")
    with pytest.raises(RetryLater, match="502: <h1>502 Bad Gateway</h1>"):
        await sender.send(batch(), "hola", 0)
    gone = ChatwootSender(
        Settings(chatwoot_api_access_token=API_TOKEN),
        client=httpx.AsyncClient(base_url=f"http://127.0.0.1:{free_port()}", timeout=0.3),
    )
    with pytest.raises(RetryLater, match="unreachable"):
        await gone.send(batch(), "hola", 0)
    await gone.aclose()
    assert chatwoot.replies() == []


async def test_a_part_chatwoot_may_have_created_is_an_unknown_delivery_not_a_retry(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    """A timeout and a connection dropped before the answer: Chatwoot created the message
    each time, and the sender says it cannot know, instead of asking for a retry."""
    chatwoot.hang_next(1, 3.0, kinds=["reply"])
    with pytest.raises(DeliveryUnknown, match="ReadTimeout") as timed_out:
        await sender.send(batch(), "hola", 0)
    chatwoot.drop_next(1, kinds=["reply"])
    with pytest.raises(DeliveryUnknown, match="RemoteProtocolError"):
        await sender.send(batch(), "chau", 1)
    assert timed_out.value.reason == "delivery_unknown" and timed_out.value.what == "part"
    await chatwoot.await_for(lambda: len(chatwoot.replies()) == 2, timeout=15)
    assert [m.content for m in chatwoot.replies()] == ["hola", "chau"]


@pytest.mark.parametrize(
    ("status", "reason"),
    [(401, "token_invalid"), (403, "forbidden"), (404, "not_found"), (422, "invalid_request")],
)
async def test_errors_a_retry_cannot_fix_go_to_review_with_status_and_message(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn, status: int, reason: str
) -> None:
    chatwoot.fail_next(1, status, message="the stand-in says no", kinds=["reply"])
    with pytest.raises(NeedsReview) as caught:
        await sender.send(batch(), "hola", 0)
    assert caught.value.reason == reason
    assert caught.value.detail == f"HTTP {status}: the stand-in says no"


async def test_a_wrong_token_is_chatwoots_own_401(chatwoot: ChatwootApiStandIn) -> None:
    settings = Settings(chatwoot_base_url=chatwoot.url, chatwoot_api_access_token="wrong")
    cw = ChatwootSender(settings)
    with pytest.raises(NeedsReview) as caught:
        await cw.send(batch(), "hola", 0)
    await cw.aclose()
    assert caught.value.reason == "token_invalid"
    assert caught.value.detail == "HTTP 401: Invalid Access Token"


async def test_other_errors_are_unknown_and_a_2xx_without_id_is_not_sent_again(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    chatwoot.fail_next(1, 400, message="odd", kinds=["reply"])
    with pytest.raises(ChatwootError, match="HTTP 400: odd"):
        await sender.send(batch(), "hola", 0)
    chatwoot.fail_raw(1, 200, "<html>ok</html>", kinds=["reply"])
    assert await sender.send(batch(), "hola", 0) == ""


async def test_hand_over_leaves_a_private_note_then_opens_the_conversation(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    assert await sender.hand_over(batch(), "too_old", "oldest message 1000s old") is True
    (note,) = chatwoot.notes(42)
    assert note.private and "too_old: oldest message 1000s old" in note.content
    assert chatwoot.replies() == [], "nothing the customer sees"
    assert chatwoot.status_of(42) == "open"
    note_call, status_call = chatwoot.calls("note") + chatwoot.calls("status")
    assert note_call.time < status_call.time
    assert status_call.body == {"status": "open"}
    assert status_call.path == "/api/v1/accounts/1/conversations/42/toggle_status"


async def test_hand_over_retries_transient_errors_and_gives_up_on_the_rest(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    chatwoot.fail_next(2, 503, kinds=["note"])
    chatwoot.fail_next(1, 429, kinds=["status"])
    assert await sender.hand_over(batch(), "max_attempts", "boom") is True
    assert [c.status for c in chatwoot.calls("note")] == [503, 503, 200]
    assert [c.status for c in chatwoot.calls("status")] == [429, 200]
    chatwoot.clear()

    chatwoot.fail_always(503, kinds=["status"])
    with pytest.raises(RetryLater):
        await sender.hand_over(batch(), "max_attempts", "boom")
    assert len(chatwoot.calls("status")) == 3, "three attempts, then the failure is reported"
    chatwoot.reset()

    chatwoot.fail_always(403, kinds=["note"])
    with pytest.raises(NeedsReview):
        await sender.hand_over(batch(), "max_attempts", "boom")
    assert len(chatwoot.calls("note")) == 1 and chatwoot.calls("status") == []


def journaled(steps: dict[str, str] | None = None) -> Delivery:
    """A turn whose review journal holds these hand-over steps (as a resumed one would)."""
    journal = ReviewJournal("too_old", "oldest message 1000s old", 0, steps=dict(steps or {}))
    return Delivery(TurnState(journal=journal))


async def test_a_note_chatwoot_did_not_answer_is_not_posted_again(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    """The note's request times out: retrying could post a second note, so the outcome is
    recorded as unknown and the hand-over goes on to open the conversation."""
    chatwoot.hang_next(1, 3.0, kinds=["note"])
    d = journaled()
    outcome = await sender.hand_over(batch(), "too_old", "oldest message 1000s old", delivery=d)
    assert isinstance(outcome, str) and outcome.startswith("unknown: Chatwoot did not answer")
    assert outcome.endswith("; status set to open")
    journal = d.state.journal
    assert journal is not None and journal.steps["note"].startswith("unknown: ")
    assert journal.unknown_steps == ["note"]
    assert len(chatwoot.calls("note")) == 1, "not retried"
    assert chatwoot.status_of(42) == "open"
    await chatwoot.await_for(lambda: chatwoot.notes(42), timeout=15)  # the hung one, once


async def test_setting_open_is_retried_even_when_its_answer_was_lost(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    """`open` twice is `open`: a lost answer is retried, unlike a note's."""
    chatwoot.hang_next(1, 3.0, kinds=["status"])
    assert await sender.hand_over(batch(), "too_old", "old") is True
    assert len(chatwoot.calls("status")) == 2 and chatwoot.status_of(42) == "open"
    assert len(chatwoot.calls("note")) == 1


@pytest.mark.parametrize(
    ("note", "outcome"),
    [
        ("done", True),
        (SENDING, "unknown: the worker posting it stopped before Chatwoot answered"),
        ("unknown: Chatwoot did not answer: ReadTimeout", "unknown: Chatwoot did not answer"),
    ],
)
async def test_a_resumed_hand_over_never_posts_a_note_that_was_begun(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn, note: str, outcome: bool | str
) -> None:
    """What a worker finds on a batch whose earlier worker died mid-hand-over: the note done,
    in flight, or unanswered. None of them is posted again; the conversation is opened."""
    d = journaled({"note": note})
    told = await sender.hand_over(batch(), "too_old", "oldest message 1000s old", delivery=d)
    if isinstance(outcome, str):
        assert isinstance(told, str) and told.startswith(outcome), told
        assert told.endswith("; status set to open")
    else:
        assert told is outcome
    assert chatwoot.calls("note") == [], "no second note"
    assert chatwoot.status_of(42) == "open"
    assert d.state.journal is not None and d.state.journal.steps["status"] == "open"


async def test_a_refused_note_leaves_no_trace_so_a_resumed_hand_over_may_post_it(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    chatwoot.fail_always(403, kinds=["note"])
    d = journaled()
    with pytest.raises(NeedsReview):
        await sender.hand_over(batch(), "too_old", "old", delivery=d)
    assert d.state.journal is not None and "note" not in d.state.journal.steps


async def test_the_note_of_an_unknown_delivery_tells_the_agent_what_to_look_for(
    sender: ChatwootSender, chatwoot: ChatwootApiStandIn
) -> None:
    unknown = UnknownDelivery(
        what="part", part=1, parts_total=2, at_ms=0, error="ReadTimeout", text="B" * 200
    )
    d = Delivery(TurnState(delivery_unknown=unknown))
    told = await sender.hand_over(batch(), "delivery_unknown", "part 2 of 2: no answer", delivery=d)
    assert told is True
    (note,) = chatwoot.notes(42)
    assert "delivery_unknown: part 2 of 2: no answer" in note.content
    assert f'the bot\'s part 2 of 2, starting "{"B" * 80}", appears above' in note.content
    assert "B" * 81 not in note.content
