"""The ops page's inbox over HTTP, against the real receiver app and a real Redis: the index of
conversations the worker's scripts keep (never the webhook path), the conversations view with
each one's state at a glance, paging, search, a conversation as a thread in the tenant's time
zone, the overview, and the files of customers' messages fetched through the product.

Conversations are made as the product makes them: messages stored as the receiver stores them,
taken in and claimed by the worker's ConversationStore (claim.lua), answered by its finish
(finish.lua) with the exchange a turn remembers (shared/conversation/presentation.py)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from receiver.providers.chatwoot import parse_body
from receiver.providers.whatsapp import parse_payload
from scripts.standins import GraphApiStandIn
from scripts.webhooks import agent_user, message_created
from shared import events
from shared.conversation import index
from shared.conversation.presentation import exchange
from shared.keys import Keys
from shared.ops import takeover
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.ops.support import PERSON, TENANT, ops_settings, park, sign_in
from tests.receiver.support import running
from tests.support.helpers import TOKEN, fixture_json
from tests.worker.support import (
    claim_due_now,
    ingest_one,
    message_event,
    now_ms,
    quick_store,
)
from worker import conversation_store

KEYS = Keys()
K = KEYS.tenant(TENANT)
ZONE = "America/Argentina/Buenos_Aires"  # UTC-3, no daylight saving time


@pytest.fixture
async def ops(settings: Settings, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    async with running(ops_settings(settings, timezone=ZONE)) as client:
        await sign_in(client)
        yield client


async def store_message(
    redis: Redis,
    person: str,
    text: str,
    *,
    name: str = "",
    ts: int | None = None,
    raw: dict[str, Any] | None = None,
    type: str = "text",
    message_id: str = "",
) -> str:
    """Store one message of `person` as the receiver does (ingest.lua), unread by any worker."""
    message_id = message_id or f"wamid.{person}.{time.monotonic_ns()}"
    event = message_event(
        TENANT, person, message_id, text, ts=ts, raw=raw, type=type, received_ms=now_ms()
    )
    if name:
        event["name"] = name
    await redis.sadd(KEYS.tenants, TENANT)
    await ingest_one(redis, K, event, dedupe_ttl_s=60)
    return message_id


async def answered(
    redis: Redis,
    settings: Settings,
    person: str,
    text: str,
    reply: str,
    media: tuple[str, ...] = (),
    **fields: Any,
) -> None:
    """A message of `person` taken in, claimed and answered by a turn's finish; `media`: what
    the turn read of its files (a voice note's transcription)."""
    await store_message(redis, person, text, **fields)
    store = quick_store(redis, settings)
    batch = await claim_due_now(redis, store, "wa", person, "turn", tenant=TENANT)
    sent = [f"wamid.out.{person}"]
    remember = orjson.dumps(exchange(batch, settings, reply, sent, media))
    assert await store.finish_done(batch, remember, (0, f"wamid.out.{person}"))


async def intake(redis: Redis, settings: Settings) -> None:
    await Scripts().load(redis)
    await quick_store(redis, settings).claim(TENANT, 0, "intake")


# --- the index ------------------------------------------------------------------------------------
async def test_the_worker_keeps_the_index_and_the_webhook_path_does_not_write_it(
    redis: Redis, settings: Settings
) -> None:
    await Scripts().load(redis)
    await store_message(redis, PERSON, "hola")
    assert not await redis.exists(K.conversations), "the receiver's ingest writes no index"
    store = quick_store(redis, settings)
    await store.claim(TENANT, 0, "intake")
    taken = await redis.zscore(K.conversations, PERSON)
    assert taken is not None
    batch = await claim_due_now(redis, store, "wa", PERSON, "turn", tenant=TENANT)
    remember = orjson.dumps(exchange(batch, settings, "¡Hola!", ["wamid.r"]))
    assert await store.finish_done(batch, remember, (0, "wamid.r"))
    replied = await redis.zscore(K.conversations, PERSON)
    assert replied is not None and replied >= taken, "the reply is activity too"
    # What the finish remembered says when the message came and the reply went.
    (entry,) = [orjson.loads(e) for e in await redis.lrange(K.memory(PERSON), 0, -1)]
    assert entry["in"] == batch.messages[0].ts and entry["at"] >= taken


async def test_a_new_person_trims_the_index_by_age_and_by_count(
    redis: Redis, settings: Settings
) -> None:
    await Scripts().load(redis)
    now_ms = int(time.time() * 1000)
    old = now_ms - index.KEPT_MS - 60_000
    await redis.zadd(K.conversations, {"old-one": old})
    await redis.zadd(K.conversations, {f"p{i}": now_ms - 10_000 + i for i in range(index.KEPT)})
    await store_message(redis, "5491100000000", "hola")
    await quick_store(redis, settings).claim(TENANT, 0, "intake")
    assert await redis.zcard(K.conversations) == index.KEPT
    assert await redis.zscore(K.conversations, "old-one") is None, "older than the age bound"
    assert await redis.zscore(K.conversations, "p0") is None, "past the newest KEPT"
    assert await redis.zscore(K.conversations, "5491100000000") is not None


async def test_one_intake_of_thousands_of_people_lists_them_all(
    redis: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More people in one call than Lua's unpack takes at once (the benchmark's intake)."""
    monkeypatch.setattr(conversation_store, "MAX_INTAKE_PER_CALL", 10_000)
    await Scripts().load(redis)
    people = [f"549110{i:07d}" for i in range(4500)]
    pipe = redis.pipeline(transaction=False)
    for person in people:
        pipe.lpush(K.inbox, events.encode(message_event(TENANT, person, f"w.{person}", "hola")))
    await pipe.execute()
    claim = await quick_store(redis, settings).claim(TENANT, 0, "intake")
    assert not claim.more
    assert await redis.zcard(K.conversations) == len(people)


# --- the conversations view -----------------------------------------------------------------------
async def test_the_view_shows_who_waits_paused_who_is_in_review_and_who_is_running(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await answered(redis, settings, "5491100000001", "¿abren hoy?", "Sí, hasta las 20.")
    await park(redis, settings, ["<script>x</script> nadie responde"], person="5491100000002")
    # Paused by a person, and the customer wrote again: someone must answer by hand.
    await answered(redis, settings, "5491100000003", "quiero hablar", "Te paso con alguien.")
    await takeover.pause(redis, KEYS, TENANT, "5491100000003", by="Ana", why="x", seconds=600)
    await store_message(redis, "5491100000003", "¿hola? ¿alguien?", name="Rosa Páez")
    await store_message(redis, "5491100000004", "una consulta", name="Juan")
    await intake(redis, settings)
    page = await ops.get(f"/ops/conversations?tenant={TENANT}")
    assert page.status_code == 200, page.text
    html = page.text
    rows = html.split("<tr")[2:]
    assert len(rows) == 4
    newest_first = [re.search(r"person=(\d+)", r).group(1) for r in rows]  # type: ignore[union-attr]
    assert newest_first[:2] == ["5491100000004", "5491100000003"] or set(newest_first[:2]) == {
        "5491100000004",
        "5491100000003",
    }
    paused = next(r for r in rows if "5491100000003" in r)
    assert "Rosa Páez" in paused and "paused, 1 waiting" in paused and "attention" in paused
    review = next(r for r in rows if "5491100000002" in r)
    assert "review: max_attempts" in review
    assert "&lt;script&gt;x&lt;/script&gt;" in review and "<script>x" not in html
    waiting = next(r for r in rows if "5491100000004" in r)
    assert "Juan" in waiting and "1 waiting" in waiting
    done = next(r for r in rows if "5491100000001" in r)
    assert "Bot:" in done and "Sí, hasta las 20." in done
    # The overview above the list.
    assert "Workers alive" in html and "answering" in html
    assert "in review: max_attempts" in html


async def test_a_running_turn_shows(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await store_message(redis, PERSON, "hola")
    store = quick_store(redis, settings)
    await claim_due_now(redis, store, "wa", PERSON, "turn", tenant=TENANT)
    html = (await ops.get(f"/ops/conversations?tenant={TENANT}")).text
    assert "turn running" in html


async def test_paging_is_newest_first_and_its_links_say_where_they_lead(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    for i in range(55):
        await store_message(redis, f"54911{i:08d}", f"mensaje {i}")
        await intake(redis, settings)  # one claim each: each a later activity
    first = (await ops.get(f"/ops/conversations?tenant={TENANT}")).text
    assert "55 conversations" in first
    assert first.count('<tr class="') == 50
    assert "5491100000054" in first and "5491100000004" not in first
    assert "Newer conversations" not in first
    older = re.search(r'href="([^"]+)">Older conversations', first)
    assert older, first
    second = (await ops.get(older.group(1).replace("&amp;", "&"))).text
    assert second.count('<tr class="') == 5
    assert "5491100000004" in second and "5491100000000" in second
    assert "5491100000054" not in second and "Older conversations" not in second
    assert "Newer conversations" in second


async def test_search_by_number_name_or_word_says_what_it_looked_at(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await answered(redis, settings, "5491155550011", "¿Tienen turno el sábado?", "Sí.")
    await store_message(redis, "5491166660022", "hola", name="Mariana López")
    await store_message(redis, "5491177770033", "precio del envío", name="Pedro")
    await intake(redis, settings)

    async def found(query: str) -> list[str]:
        page = await ops.get("/ops/conversations", params={"tenant": TENANT, "q": query})
        assert page.status_code == 200
        said = "among the numbers of all 3" if query[-1].isdigit() else "among the newest 3"
        assert said in page.text
        return re.findall(r'href="/ops/thread\?tenant=\d+&amp;person=(\d+)"', page.text)

    assert await found("6666") == ["5491166660022"]
    assert await found("+54 9 11 7777") == ["5491177770033"]
    assert await found("mariana") == ["5491166660022"]
    assert await found("SÁBADO") == ["5491155550011"]
    assert await found("envío") == ["5491177770033"]
    assert await found("nothing like it") == []


async def test_the_overview_lists_every_tenant_workers_and_the_ai_pause(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await store_message(redis, PERSON, "hola")
    await intake(redis, settings)
    until = int(time.time() * 1000) + 60_000
    await redis.set(
        KEYS.ai_paused, orjson.dumps({"until_ms": until, "level": 1, "why": "AI down"}), px=90_000
    )
    html = (await ops.get("/ops/conversations")).text
    assert f"/ops/conversations?tenant={TENANT}" in html
    assert "paused fleet-wide" in html and "AI down" in html
    assert "none</strong>: nothing is answered" in html, "no worker runs in this test"


async def test_bad_input_gets_a_clear_page(ops: httpx.AsyncClient, redis: Redis) -> None:
    page = await ops.get("/ops/conversations?tenant=nobody")
    assert page.status_code == 404 and "never received traffic" in page.text
    page = await ops.get("/ops/thread?tenant=nobody&person=1")
    assert page.status_code == 404
    await redis.sadd(KEYS.tenants, TENANT)
    page = await ops.get(f"/ops/thread?tenant={TENANT}&person={{bad}}")
    assert page.status_code == 404 and "cannot be used in a Redis key" in page.text
    page = await ops.get(f"/ops/thread?tenant={TENANT}&person=5491100009999")
    assert page.status_code == 200, "a person the product holds nothing of: an empty thread"
    assert "Nothing of this conversation is held" in page.text
    page = await ops.get(f"/ops/conversations?tenant={TENANT}&offset=-5")
    assert page.status_code == 200 and "No conversation yet" in page.text
    page = await ops.get("/ops/media", params={"tenant": TENANT, "person": "1", "id": "x"})
    assert page.status_code == 404 and "no file" in page.text


# --- the thread -----------------------------------------------------------------------------------
@pytest.fixture
async def ops_graph(
    settings: Settings, redis: Redis, graph: GraphApiStandIn
) -> AsyncIterator[httpx.AsyncClient]:
    sending = settings.with_overrides(
        sender="whatsapp",
        whatsapp_access_token=TOKEN,
        whatsapp_api_base_url=graph.url,
        timezone=ZONE,
    )
    async with running(ops_settings(sending)) as client:
        yield client


async def test_the_thread_is_in_time_order_with_who_wrote_in_the_tenants_zone(
    ops_graph: httpx.AsyncClient, redis: Redis, settings: Settings, graph: GraphApiStandIn
) -> None:
    await answered(
        redis, settings, PERSON, "Hola, ¿hacen envíos?", "Sí, a todo el país.", name="Rosa"
    )
    # An exchange remembered before times were kept: shown without one, first.
    older = {"header": "Date and time: Monday 30 November 2026, 10:00 (UTC)", "user": "antes"}
    await redis.lpush(K.memory(PERSON), orjson.dumps({**older, "assistant": "respuesta vieja"}))
    # A Chatwoot-style stretch a person of the business handled (lib/silence.lua's format).
    stretch = {
        "human": True,
        "lines": [{"by": "agent", "name": "Laura", "text": "Soy Laura, te ayudo", "ts": 0}],
    }
    await redis.rpush(K.memory(PERSON), orjson.dumps(stretch))
    csrf = await sign_in(ops_graph, "Ana")
    answer = await ops_graph.post(
        "/ops/conversation/reply",
        data={"tenant": TENANT, "person": PERSON, "csrf": csrf, "then": "thread"},
        params={},
        headers={},
    )
    assert answer.status_code == 409  # no text: nothing sent
    form = {"tenant": TENANT, "person": PERSON, "csrf": csrf, "then": "thread"}
    answer = await ops_graph.post("/ops/conversation/reply", data={**form, "text": "Te escribo yo"})
    assert answer.status_code == 303 and answer.headers["location"].startswith("/ops/thread?")
    # Provider times are whole seconds: this message's is the reply's second; it shows after it
    # by when it reached the receiver (ms).
    before_s = time.time()
    await store_message(redis, PERSON, "gracias <b>!</b>", ts=int(before_s), name="Rosa")
    after_s = time.time()
    await intake(redis, settings)
    page = await ops_graph.get(answer.headers["location"])
    assert page.status_code == 200, page.text
    html = page.text
    order = [
        "antes",
        "respuesta vieja",
        "Hola, ¿hacen envíos?",
        "Sí, a todo el país.",
        "Soy Laura, te ayudo",
        "Te escribo yo",
        "gracias &lt;b&gt;!&lt;/b&gt;",
    ]
    at = [html.find(text) for text in order]
    assert -1 not in at, (at, html)
    assert at == sorted(at), "in time order"
    bubbles = html.split('<li class="bubble ')[1:]
    assert bubbles[0].startswith("customer") and "Monday 30 November 2026, 10:00" in bubbles[0]
    assert bubbles[1].startswith("bot")
    assert bubbles[2].startswith("customer") and "Rosa" in bubbles[2]
    laura = next(b for b in bubbles if "Soy Laura" in b)
    assert laura.startswith("business") and "Laura" in laura
    by_hand = next(b for b in bubbles if "Te escribo yo" in b)
    assert by_hand.startswith("business") and "Ana" in by_hand
    assert "person of the business" in by_hand
    # The waiting message shows at its time in the tenant's zone, three hours behind UTC.
    waiting = bubbles[-1]
    shown = {
        datetime.fromtimestamp(at - 3 * 3600, UTC).strftime("%Y-%m-%d %H:%M")
        for at in (before_s, after_s)
    }
    assert any(local in waiting for local in shown) and "waiting" in waiting
    assert f"Times in {ZONE}" in html
    assert "Status and actions" in html and "Send reply" in html


# --- files ----------------------------------------------------------------------------------------
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


async def test_an_image_is_shown_through_the_product_without_its_token(
    ops_graph: httpx.AsyncClient, redis: Redis, settings: Settings, graph: GraphApiStandIn
) -> None:
    graph.media.add("media-1", PNG, "image/png")
    raw = {"type": "image", "image": {"id": "media-1", "mime_type": "image/png", "caption": "mi"}}
    message_id = await store_message(redis, PERSON, "mi", type="image", raw=raw)
    await intake(redis, settings)
    await sign_in(ops_graph)
    html = (await ops_graph.get(f"/ops/thread?tenant={TENANT}&person={PERSON}")).text
    src = re.search(r'<img src="([^"]+)" alt="\[image: mi\]"', html)
    assert src, html
    assert TOKEN not in html and "media-1" not in html, "no token, no provider reference"
    answer = await ops_graph.get(src.group(1).replace("&amp;", "&"))
    assert answer.status_code == 200 and answer.content == PNG
    assert answer.headers["content-type"] == "image/png"
    assert "sandbox" in answer.headers["content-security-policy"]
    (info,) = graph.media.infos()
    assert info.headers.get("authorization") == f"Bearer {TOKEN}", "the token went to Graph"
    # Only a file of a message this person sent, stored by the product: nothing else is fetched.
    for query in (
        {"id": "wamid.someone-else", "n": "0"},
        {"id": message_id, "n": "1"},
        {"id": message_id, "n": "x"},
    ):
        answer = await ops_graph.get(
            "/ops/media", params={"tenant": TENANT, "person": PERSON, **query}
        )
        assert answer.status_code == 404, query
    assert len(graph.media.downloads()) == 1


async def test_a_file_on_a_host_the_fetch_does_not_allow_is_refused(
    ops_graph: httpx.AsyncClient, redis: Redis, settings: Settings, graph: GraphApiStandIn
) -> None:
    raw = {"type": "image", "image": {"url": "http://169.254.169.254/latest/meta-data"}}
    message_id = await store_message(redis, PERSON, "", type="image", raw=raw)
    await intake(redis, settings)
    await sign_in(ops_graph)
    answer = await ops_graph.get(
        "/ops/media", params={"tenant": TENANT, "person": PERSON, "id": message_id, "n": "0"}
    )
    assert answer.status_code == 404 and "could not be had" in answer.text
    assert graph.media.infos() == [] and graph.media.downloads() == []


async def test_a_file_of_another_type_is_a_download_never_shown_inline(
    ops_graph: httpx.AsyncClient, redis: Redis, settings: Settings, graph: GraphApiStandIn
) -> None:
    graph.media.add("media-svg", b"<svg><script>alert(1)</script></svg>", "image/svg+xml")
    raw = {"type": "document", "document": {"id": "media-svg", "filename": "x.svg"}}
    message_id = await store_message(redis, PERSON, "", type="document", raw=raw)
    await intake(redis, settings)
    await sign_in(ops_graph)
    html = (await ops_graph.get(f"/ops/thread?tenant={TENANT}&person={PERSON}")).text
    assert "[document: x.svg]</a>" in html and "<img" not in html
    answer = await ops_graph.get(
        "/ops/media", params={"tenant": TENANT, "person": PERSON, "id": message_id, "n": "0"}
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/octet-stream"
    assert answer.headers["content-disposition"] == "attachment"


# --- live -----------------------------------------------------------------------------------------
async def test_the_pages_offer_their_live_part_and_allow_only_their_own_script(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await store_message(redis, PERSON, "hola", name="Rosa")
    await intake(redis, settings)
    for path in (
        "/ops/conversations",
        f"/ops/conversations?tenant={TENANT}",
        f"/ops/thread?tenant={TENANT}&person={PERSON}",
    ):
        page = await ops.get(path)
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp, path
        assert "unsafe-inline'; img" in csp and "script-src 'unsafe" not in csp, "styles only"
        assert '<script src="/ops/live.js" defer></script>' in page.text
        assert page.text.count("<script") == 1, "no inline script"
        live_url = re.search(r'data-live="([^"]+)"', page.text)
        assert live_url and "part=live" in live_url.group(1), path
        part = await ops.get(live_url.group(1).replace("&amp;", "&"))
        assert part.status_code == 200 and "<html" not in part.text and "<script" not in part.text
        assert "script-src" not in part.headers["content-security-policy"], "a part runs nothing"
    part = await ops.get(f"/ops/thread?tenant={TENANT}&person={PERSON}&part=live")
    assert "hola" in part.text and "Rosa" in part.text
    script = await ops.get("/ops/live.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith(
        "text/javascript"
    )
    assert script.headers["x-content-type-options"] == "nosniff"
    assert "fetch(url" in script.text


async def test_signed_out_the_live_part_is_refused(ops: httpx.AsyncClient) -> None:
    ops.cookies.clear()
    part = await ops.get(f"/ops/conversations?tenant={TENANT}&part=live")
    assert part.status_code == 303 and "/ops/signin" in part.headers["location"]


async def test_a_chatwoot_agents_message_shows_as_the_agents_not_the_bots(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """Through the receiver's parser and the real intake: the agent's message silences the bot
    and joins the memory (lib/silence.lua); the thread names the agent."""
    tenant, conversation = "cw-1-3", "42"
    k = KEYS.tenant(tenant)
    await redis.sadd(KEYS.tenants, tenant)
    laura = agent_user(12, "Laura Gómez")
    for payload in (
        message_created(message_id=7001, content="¿tienen stock?", conversation=42),
        message_created(
            message_id=7002,
            content="Sí, te lo aparto",
            conversation=42,
            message_type="outgoing",
            sender=laura,
        ),
    ):
        parsed = parse_body(orjson.dumps(payload), int(time.time() * 1000))
        for event in parsed.events[tenant]:
            assert await ingest_one(redis, k, event)
    await Scripts().load(redis)
    await quick_store(redis, settings).claim(tenant, 0, "intake")
    assert await redis.zscore(k.conversations, conversation) is not None
    html = (await ops.get(f"/ops/thread?tenant={tenant}&person={conversation}")).text
    bubbles = html.split('<li class="bubble ')[1:]
    assert [b.split('"')[0] for b in bubbles] == ["customer", "business"], html
    assert "Laura Gómez" in bubbles[1] and "Sí, te lo aparto" in bubbles[1]
    assert "Chatwoot conversation" in html and "24-hour window" not in html
    listing = (await ops.get(f"/ops/conversations?tenant={tenant}")).text
    assert "agent handles it" in listing and "Business:" in listing


async def test_a_voice_note_plays_with_its_transcript_and_a_document_is_named(
    ops_graph: httpx.AsyncClient, redis: Redis, settings: Settings, graph: GraphApiStandIn
) -> None:
    graph.media.add("media-voice", b"OggS fake voice", "audio/ogg")
    voice = {"type": "audio", "audio": {"id": "media-voice", "voice": True}}
    heard = "[voice note, transcribed]: ¿a qué hora abren?"
    await answered(redis, settings, PERSON, "", "A las 9.", media=(heard,), type="audio", raw=voice)
    pdf = {"type": "document", "document": {"id": "media-pdf", "filename": "lista.pdf"}}
    await store_message(redis, PERSON, "", type="document", raw=pdf)
    await intake(redis, settings)
    await sign_in(ops_graph)
    page = await ops_graph.get(f"/ops/thread?tenant={TENANT}&person={PERSON}")
    assert "media-src 'self'" in page.headers["content-security-policy"]
    html = page.text
    assert "[voice note]" in html and heard in html
    audio = re.search(r'<audio controls preload="none" src="([^"]+)">', html)
    assert audio, html
    answer = await ops_graph.get(audio.group(1).replace("&amp;", "&"))
    assert answer.status_code == 200 and answer.headers["content-type"] == "audio/ogg"
    assert "[document: lista.pdf]</a>" in html


async def test_an_echo_from_the_business_app_and_an_undelivered_reply_say_so(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """The echo through the receiver's parser and the real intake (lib/human.lua)."""
    await answered(redis, settings, PERSON, "¿tienen talle M?", "Sí, en azul.")
    # The reply Meta reported undelivered later, as mark_memory.lua rewrites it.
    (raw,) = await redis.lrange(K.memory(PERSON), 0, -1)
    entry = orjson.loads(raw)
    entry["assistant"] = "[not delivered: 131047] " + entry["assistant"]
    await redis.lset(K.memory(PERSON), 0, orjson.dumps(entry))
    doc = fixture_json("whatsapp/echo_text.json")
    item = doc["entry"][0]["changes"][0]["value"]["message_echoes"][0]
    item.update(id="wamid.ECHO", text={"body": "Te lo mando hoy"}, timestamp=str(int(time.time())))
    parsed = parse_payload(doc, now_ms())
    for event in parsed.events[TENANT]:
        assert await ingest_one(redis, K, event)
    await intake(redis, settings)
    html = (await ops.get(f"/ops/thread?tenant={TENANT}&person={PERSON}")).text
    bubbles = html.split('<li class="bubble ')[1:]
    assert [b.split('"')[0] for b in bubbles] == ["customer", "bot", "business"], html
    assert "not delivered: 131047" in bubbles[1] and "[not delivered" not in bubbles[1]
    assert "WhatsApp Business app" in bubbles[2] and "Te lo mando hoy" in bubbles[2]
    assert "bot paused until" in html


async def test_items_the_previous_release_parked_show_before_they_are_indexed(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """An item stored without its index entries (as the release before stored them): the view
    reads the items themselves until the backfill has indexed them."""
    await answered(redis, settings, PERSON, "hola", "¡Hola!")
    item = {
        "id": "1764421200000-1",
        "person": PERSON,
        "reason": "too_old",
        "reviewed_ms": now_ms(),
        "messages": [message_event(TENANT, PERSON, "wamid.old", "¿siguen?", ts=1)],
    }
    await redis.hset(K.review, item["id"], orjson.dumps(item))
    html = (await ops.get(f"/ops/conversations?tenant={TENANT}")).text
    assert "review: too_old" in html and "1 in review: too_old" in html
    thread_html = (await ops.get(f"/ops/thread?tenant={TENANT}&person={PERSON}")).text
    assert "¿siguen?" in thread_html and "parked for review: too_old" in thread_html
