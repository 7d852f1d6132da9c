"""The conversation view and its actions over HTTP: what it shows (waiting messages, memory,
what was sent and its statuses, the bot's pause), pausing and resuming the bot for a person,
forgetting a person after a confirmation; bad input gets a clear error and changes nothing."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn
from shared.keys import Keys
from shared.ops import audit, takeover
from shared.ops.review import ReviewList
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.ops.support import PERSON, TENANT, ops_settings, park, sign_in
from tests.receiver.support import running
from tests.support.helpers import TOKEN
from tests.worker.support import close_window, ingest_one, message_event, quick_store

KEYS = Keys()
K = KEYS.tenant(TENANT)
PAGE = f"/ops/conversation?tenant={TENANT}&person={PERSON}"


@pytest.fixture
async def ops(settings: Settings, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    async with running(ops_settings(settings)) as client:
        yield client


async def test_the_view_shows_memory_what_was_sent_and_the_window(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await park(redis, settings, ["parked <b>one</b>"])
    exchange = {"user": "¿abren hoy?", "assistant": "Sí, hasta las 20.", "out": ["wamid.A"]}
    # A burst of an image only: its label is kept beside the (empty) text, and shown.
    photo = {"user": "", "assistant": "Qué linda.", "media": ["[image: la vidriera]"]}
    await redis.rpush(K.memory(PERSON), orjson.dumps(photo), orjson.dumps(exchange), b"not json")
    await redis.hset(
        K.outbound("wamid.A"),
        mapping={"person": PERSON, "part": 0, "status": "delivered", "sent_ms": 1},
    )
    # A batch in flight whose first part went out and was read.
    await redis.hset(K.batch(PERSON), mapping={"id": "b9", "size": 1, "part:0": "wamid.P0"})
    await redis.hset(K.outbound("wamid.P0"), mapping={"person": PERSON, "status": "read"})
    await sign_in(ops)
    page = (await ops.get(PAGE)).text
    assert 'wamid.P0</td><td data-label="Status">read' in page
    assert "¿abren hoy?" in page and "Sí, hasta las 20." in page and "not json" in page
    assert "[image: la vidriera]" in page and "Qué linda." in page
    assert "wamid.A" in page and "delivered" in page
    # The parked message opened the window (its ts is now): a day left.
    assert re.search(r"open, closes in (23h59m|24h00m)", page), "a day left"
    assert "parked &lt;b&gt;one&lt;/b&gt;" in page
    # A WhatsApp batch parked as max_attempts paused the bot for the person (takeover).
    assert "<strong>paused</strong>" in page and "Resume the bot" in page
    assert "Forget this person" in page


async def test_pause_and_resume_the_bot_for_a_person(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await park(redis, settings, ["hola"], reason="too_old")  # too_old does not pause
    csrf = await sign_in(ops, "Ana")
    form = {"tenant": TENANT, "person": PERSON, "csrf": csrf}
    answer = await ops.post("/ops/conversation/pause", data={**form, "seconds": "600"})
    assert answer.status_code == 303 and "done=paused" in answer.headers["location"]
    pause = await takeover.pause_state(redis, KEYS, TENANT, PERSON)
    assert pause is not None and pause["by"] == "Ana"
    assert pause["why"] == "a person took over on the ops page"
    page = (await ops.get(PAGE)).text
    assert "<strong>paused</strong>" in page and "Resume the bot" in page
    answer = await ops.post("/ops/conversation/resume", data=form)
    assert answer.status_code == 303 and "done=resumed" in answer.headers["location"]
    assert await takeover.pause_state(redis, KEYS, TENANT, PERSON) is None
    answer = await ops.post("/ops/conversation/resume", data=form)
    assert answer.status_code == 409 and "the bot was not paused for person" in answer.text
    actions = [(e.who, e.action) for e in await audit.entries(redis, KEYS)]
    assert actions == [("Ana", "resume"), ("Ana", "pause")]


async def test_bad_pauses_change_nothing(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await park(redis, settings, ["hola"], reason="too_old")
    csrf = await sign_in(ops)
    form = {"tenant": TENANT, "person": PERSON, "csrf": csrf}
    for seconds, message in [
        ("soon", "a pause lasts a number of seconds, not &#39;soon&#39;"),
        ("0", "a pause lasts more than 0 s"),
        ("99999999999", "at most a year"),
    ]:
        answer = await ops.post("/ops/conversation/pause", data={**form, "seconds": seconds})
        assert answer.status_code == 409 and message in answer.text, answer.text
    answer = await ops.post(
        "/ops/conversation/pause", data={**form, "tenant": "999", "seconds": "60"}
    )
    assert answer.status_code == 404 and "no tenant" in answer.text
    answer = await ops.post(
        "/ops/conversation/pause", data={**form, "person": "a}b", "seconds": "60"}
    )
    assert answer.status_code == 404 and "cannot be used in a Redis key" in answer.text
    answer = await ops.post(
        "/ops/conversation/pause", data={**form, "csrf": "forged", "seconds": "60"}
    )
    assert answer.status_code == 403
    assert await takeover.pause_state(redis, KEYS, TENANT, PERSON) is None
    assert await audit.entries(redis, KEYS) == []


async def test_forgetting_asks_first_then_deletes_and_audits(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["my address is Calle 1"], reason="too_old")
    csrf = await sign_in(ops, "Ana")
    confirm = await ops.get(f"/ops/forget?tenant={TENANT}&person={PERSON}")
    assert confirm.status_code == 200 and "Forget person 5491155550001" in confirm.text
    assert 'name="confirm" value="yes" required' in confirm.text
    form = {"tenant": TENANT, "person": PERSON, "csrf": csrf}
    answer = await ops.post("/ops/forget", data=form)
    assert answer.status_code == 409 and "tick the box to confirm" in answer.text
    assert await redis.hexists(K.review, item), "nothing deleted without the confirmation"
    answer = await ops.post("/ops/forget", data={**form, "csrf": "forged", "confirm": "yes"})
    assert answer.status_code == 403 and await redis.hexists(K.review, item)
    assert await audit.entries(redis, KEYS) == []

    answer = await ops.post("/ops/forget", data={**form, "confirm": "yes"})
    assert answer.status_code == 200 and "Forgotten" in answer.text, answer.text
    assert "review_items=1" in answer.text
    assert not await redis.hexists(K.review, item)
    assert not await redis.exists(K.last_inbound(PERSON))
    (entry,) = await audit.entries(redis, KEYS)
    assert (entry.who, entry.action, entry.person) == ("Ana", "forget", audit.FORGOTTEN)
    assert PERSON not in entry.detail
    assert (await ops.get(PAGE)).status_code == 404, "nothing is known of the person now"


async def test_forgetting_is_refused_only_while_a_turn_runs(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """A turn holds the person's lock: 409, nothing deleted. A batch no turn holds (waiting for
    a retry, or a late delivery failure behind the bot's pause: issue 21 answered 409 until
    the bot was resumed) is deleted with the rest."""
    item = await park(redis, settings, ["hola"], reason="too_old")
    await redis.hset(K.batch(PERSON), mapping={"id": "b", "attempt": 1, "size": 1})
    await redis.set(K.lock(PERSON), "worker-1:1", px=60_000)
    csrf = await sign_in(ops)
    form = {"tenant": TENANT, "person": PERSON, "csrf": csrf, "confirm": "yes"}
    answer = await ops.post("/ops/forget", data=form)
    assert answer.status_code == 409 and "a turn of person" in answer.text, answer.text
    assert await redis.hexists(K.review, item) and await redis.exists(K.batch(PERSON))
    assert (await ops.get(f"/ops/forget?tenant=999&person={PERSON}")).status_code == 404

    await redis.delete(K.lock(PERSON))  # the turn failed: its batch waits for a retry
    answer = await ops.post("/ops/forget", data=form)
    assert answer.status_code == 200 and "Forgotten" in answer.text, answer.text
    assert not await redis.hexists(K.review, item) and not await redis.exists(K.batch(PERSON))


# ----------------------------------------------------------------- replies by hand


@pytest.fixture
async def ops_graph(
    settings: Settings, redis: Redis, graph: GraphApiStandIn
) -> AsyncIterator[httpx.AsyncClient]:
    """The ops page of a receiver whose replies by hand go to the Graph API stand-in."""
    sending = settings.with_overrides(
        sender="whatsapp", whatsapp_access_token=TOKEN, whatsapp_api_base_url=graph.url
    )
    async with running(ops_settings(sending)) as client:
        yield client


async def test_a_reply_by_hand_reaches_the_graph_api_and_the_memory(
    ops_graph: httpx.AsyncClient, redis: Redis, settings: Settings, graph: GraphApiStandIn
) -> None:
    item = await park(redis, settings, ["¿tienen turno el jueves?"])
    csrf = await sign_in(ops_graph, "Ana")
    form = {"tenant": TENANT, "person": PERSON, "csrf": csrf}
    answer = await ops_graph.post(
        "/ops/conversation/reply", data={**form, "text": "Sí, <b>a las 10</b>."}
    )
    assert answer.status_code == 303 and "done=replied" in answer.headers["location"]
    (sent,) = graph.sent_texts(PERSON)
    assert sent.body == "Sí, <b>a las 10</b>." and sent.phone_number_id == TENANT
    (entry,) = await audit.entries(redis, KEYS)
    assert (entry.who, entry.action, entry.detail) == ("Ana", "reply", "Sí, <b>a las 10</b>.")
    page = (await ops_graph.get(PAGE)).text
    assert "Sí, &lt;b&gt;a las 10&lt;/b&gt;." in page, "in the memory, escaped"
    assert sent.wamid in page, "its outbound record, with its status"
    assert await redis.hexists(K.review, item), "the item stays until someone drops it"


async def test_a_reply_that_cannot_go_out_says_why_and_sends_nothing(
    ops_graph: httpx.AsyncClient, redis: Redis, settings: Settings, graph: GraphApiStandIn
) -> None:
    await park(redis, settings, ["hola"])
    csrf = await sign_in(ops_graph)
    form = {"tenant": TENANT, "person": PERSON, "csrf": csrf}
    for data, status, message in [
        ({"text": "   "}, 409, "the reply is empty"),
        ({"text": "x" * 16385}, 409, "more than 16384: shorten it"),
        ({"text": "hola", "tenant": "999"}, 404, "no tenant"),
        ({"text": "hola", "person": "a{b"}, 404, "cannot be used in a Redis key"),
        ({"text": "hola", "csrf": "forged"}, 403, "CSRF token does not match"),
    ]:
        answer = await ops_graph.post("/ops/conversation/reply", data={**form, **data})
        assert answer.status_code == status and message in answer.text, (data, answer.text)
    # A batch in flight: the worker owns the person's turn (invariant 3).
    await redis.hset(K.batch(PERSON), mapping={"id": "b", "attempt": 0, "size": 1})
    answer = await ops_graph.post("/ops/conversation/reply", data={**form, "text": "hola"})
    assert answer.status_code == 409 and "nothing was changed" in answer.text, answer.text
    await redis.delete(K.batch(PERSON))
    # The window closed and the tenant has no template: refused, not sent as text.
    await close_window(redis, K, PERSON)
    answer = await ops_graph.post("/ops/conversation/reply", data={**form, "text": "hola"})
    assert answer.status_code == 409 and "template" in answer.text, answer.text
    assert graph.sent_messages(PERSON) == []
    assert await audit.entries(redis, KEYS) == []


@pytest.mark.parametrize("action", ["drop", "requeue"])
async def test_a_pause_a_person_set_survives_any_action_on_the_review_item(
    ops_graph: httpx.AsyncClient,
    redis: Redis,
    settings: Settings,
    graph: GraphApiStandIn,
    action: str,
) -> None:
    """Issue 23: a reply by hand to an ai_hand_over person pauses the bot; dropping the item
    lifted that pause and the bot answered the customer's next message over the person."""
    item = await park(redis, settings, ["¿me pasás con alguien?"], reason="ai_hand_over")
    assert (await takeover.pause_state(redis, KEYS, TENANT, PERSON) or {})["by"] == (
        "review:ai_hand_over"
    ), "the hand-over paused the bot"
    csrf = await sign_in(ops_graph, "Ana")
    form = {"tenant": TENANT, "person": PERSON, "csrf": csrf}
    answer = await ops_graph.post("/ops/conversation/reply", data={**form, "text": "Hola, soy Ana"})
    assert answer.status_code == 303 and "done=replied" in answer.headers["location"]
    answer = await ops_graph.post(
        f"/ops/item/{action}", data={"tenant": TENANT, "id": item, "csrf": csrf}
    )
    assert answer.status_code == 303, answer.text
    assert not await redis.hexists(K.review, item)
    pause = await takeover.pause_state(redis, KEYS, TENANT, PERSON)
    assert pause is not None and pause["by"] == "Ana", "Ana's pause outlives the item"
    # The customer writes again: no turn for the bot while Ana has the conversation.
    event = message_event(TENANT, PERSON, "wamid.after", "¿Ana?")
    await ingest_one(redis, K, event, dedupe_ttl_s=60)
    store = quick_store(redis, settings)
    await store.claim(TENANT, 0, "t")
    await asyncio.sleep(0.05)
    assert (await store.claim(TENANT, 5, "t")).batches == []
    await takeover.resume(redis, KEYS, TENANT, PERSON, by="Ana")
    assert len((await store.claim(TENANT, 5, "t")).batches) == 1, "resumed: the bot answers"


async def test_dropping_lifts_the_pause_the_review_set_and_gives_back_a_persons(
    redis: Redis, settings: Settings
) -> None:
    """The pause a review set is the review's: dropping its item lifts it. A person's shorter
    pause it had replaced comes back for what is left of it."""
    review = ReviewList(redis, KEYS, Scripts())
    item = await park(redis, settings, ["hola"], reason="ai_hand_over")
    await review.drop(TENANT, item)
    assert await takeover.pause_state(redis, KEYS, TENANT, PERSON) is None
    # Ana pauses the bot while a turn runs; the turn then parks its batch as a hand-over.
    await ingest_one(redis, K, message_event(TENANT, PERSON, "wamid.again", "otra vez"))
    store = quick_store(redis, settings)
    await store.claim(TENANT, 0, "t")
    await asyncio.sleep(0.05)
    (batch,) = (await store.claim(TENANT, 5, "t")).batches
    await takeover.pause(redis, KEYS, TENANT, PERSON, by="Ana", why="mine", seconds=600)
    assert await store.finish_review(batch, "ai_hand_over", "wants a person", 0)
    item = batch.id
    paused = await takeover.pause_state(redis, KEYS, TENANT, PERSON) or {}
    assert paused["by"] == "review:ai_hand_over", "the review's pause is longer"
    await review.drop(TENANT, item)
    back = await takeover.pause_state(redis, KEYS, TENANT, PERSON) or {}
    assert back["by"] == "Ana" and back["why"] == "mine"
    assert 590_000 < await redis.pttl(K.human(PERSON)) <= 600_000
