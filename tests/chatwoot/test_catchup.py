"""The Chatwoot catch-up (worker/fleet/chatwoot_catchup.py), one run at a time: what it reads from
the API stand-in (which keeps conversations and messages as Chatwoot does), what it takes in
(through the webhook's own parser and ingest, into the real Redis), its cursor, its bounds, its
lock, and its answers to 429 and 5xx. The real httpx client against the stand-in.

What each bad input gets: a 429 is waited out (Retry-After) and the run goes on; a 500, or a
call budget used up, leaves the tenant unfinished (its cursor where it was, the error counted)
for the next run; private notes, activity messages, templates and the agent bot's own messages
are never taken in.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from receiver.catchup_request import ask
from receiver.providers.chatwoot import parse_body
from receiver.providers.chatwoot_history import parse_message
from scripts.standins import ChatwootApiStandIn, chatwoot_headers, message_created
from scripts.webhooks import agent_user
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.chatwoot.support import API_TOKEN, TENANT, WEBHOOK_SECRET
from worker.fleet.chatwoot_catchup import OVERLAP_S, RETRY_S, ChatwootCatchUp
from worker.fleet.chatwoot_catchup_loop import ChatwootCatchUpLoop
from worker.fleet.chatwoot_reader import ChatwootReader


@pytest.fixture
def config(settings: Settings, chatwoot: ChatwootApiStandIn, prefix: str) -> Settings:
    return settings.with_overrides(
        key_prefix=prefix,
        chatwoot_base_url=chatwoot.url,
        chatwoot_api_access_token=API_TOKEN,
        chatwoot_webhook_secrets=(WEBHOOK_SECRET,),
        chatwoot_catchup_interval_s=0.0,
    )


@pytest.fixture
async def catchup(config: Settings, redis: Redis) -> AsyncIterator[ChatwootCatchUp]:
    reader = ChatwootReader(config)
    made = ChatwootCatchUp(config, redis, Keys(config.key_prefix), Scripts(), reader)
    try:
        yield made
    finally:
        await reader.aclose()


async def inbox(redis: Redis, prefix: str) -> list[dict[str, Any]]:
    """The tenant's inbox, oldest first."""
    raw = await redis.lrange(Keys(prefix).tenant(TENANT).inbox, 0, -1)
    return [orjson.loads(e) for e in reversed(raw)]


async def set_cursor(redis: Redis, prefix: str, cursor: float) -> None:
    await redis.hset(Keys(prefix).chatwoot_catchup_cursor, TENANT, int(cursor))


async def run(catchup: ChatwootCatchUp, asked_ms: int | None = None) -> Any:
    assert await catchup.acquire()
    try:
        report = await catchup.run({TENANT: asked_ms})
    finally:
        await catchup.release()
    (one,) = report.tenants
    return one


def test_an_api_message_makes_the_event_its_webhook_makes(chatwoot: ChatwootApiStandIn) -> None:
    """The same message read from the API and posted as a webhook: the same stored event
    (but for the receive time and the raw fields each shape has)."""
    when = time.time() - 5
    message_id = chatwoot.customer_writes(42, "hola", created_at=when, webhook=False)
    (message,) = chatwoot.messages(42)
    conversation = {"id": 42, "inbox_id": 3, "status": "pending", "meta": {"assignee": None}}
    from_api = parse_message(message, conversation, 1, 1_000)
    hook = orjson.dumps(message_created(message_id=message_id, content="hola", conversation=42))
    from_hook = parse_body(hook, 1_000)
    (api_event,), (hook_event,) = from_api.events[TENANT], from_hook.events[TENANT]
    assert [i for i, _ in from_api.items[TENANT]] == [i for i, _ in from_hook.items[TENANT]]
    for event in (api_event, hook_event):
        event.pop("raw")
        event.pop("ts")
    assert api_event == hook_event


async def test_a_first_look_starts_the_cursor_and_takes_in_nothing_older(
    catchup: ChatwootCatchUp, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    chatwoot.customer_writes(42, "de antes", webhook=False)
    one = await run(catchup)
    assert one.complete and one.taken == 0 and one.calls == 0
    assert (
        abs(int(await redis.hget(Keys(prefix).chatwoot_catchup_cursor, TENANT)) - time.time()) < 5
    )
    assert await inbox(redis, prefix) == []


async def test_only_customers_and_agents_messages_are_taken_in(
    catchup: ChatwootCatchUp, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    await set_cursor(redis, prefix, time.time() - 60)
    customer = chatwoot.customer_writes(42, "hola", webhook=False)
    chatwoot.add_message(42, "nota interna", 1, private=True, sender=agent_user(12, "Laura"))
    chatwoot.add_message(42, "Conversation was assigned", 2)
    chatwoot.add_message(42, "plantilla", 3, sender=agent_user(12, "Laura"))
    chatwoot.add_message(42, "respuesta del bot", 1, sender={"id": 1, "type": "agent_bot"})
    agent = chatwoot.add_message(42, "soy Laura", 1, sender=agent_user(12, "Laura"))
    chatwoot.add_message(42, "privada del cliente", 0, private=True, sender={"type": "contact"})
    one = await run(catchup)
    assert one.complete and one.taken == 2
    events = await inbox(redis, prefix)
    assert [(e["id"], e["kind"], e["text"]) for e in events] == [
        (str(customer), "message", "hola"),
        (str(agent), "human", "soy Laura"),
    ]


async def test_a_message_the_webhook_brought_is_a_duplicate_and_so_is_a_late_webhook(
    config: Settings,
    catchup: ChatwootCatchUp,
    chatwoot: ChatwootApiStandIn,
    redis: Redis,
    prefix: str,
) -> None:
    from receiver.app import create_app
    from scripts.standins import BackgroundServer

    await set_cursor(redis, prefix, time.time() - 60)
    async with BackgroundServer(create_app(config), name="receiver") as receiver:
        url = f"{receiver.url}/webhooks/chatwoot"
        chatwoot.configure(webhook_url=url, webhook_secret=WEBHOOK_SECRET)
        # The webhook first, then the catch-up: the catch-up's copy is a duplicate.
        first = chatwoot.customer_writes(42, "por webhook")
        await chatwoot.await_webhooks(timeout=10)
        assert [d.response_status for d in chatwoot.webhook_deliveries] == [200]
        assert (await run(catchup)).taken == 0
        # The catch-up first, then the webhook (late): the webhook is a duplicate.
        second = chatwoot.customer_writes(43, "por la API", webhook=False)
        assert (await run(catchup)).taken == 1
        body = orjson.dumps(message_created(message_id=second, content="x", conversation=43))
        async with httpx.AsyncClient() as client:
            late = await client.post(
                url, content=body, headers=chatwoot_headers(body, WEBHOOK_SECRET)
            )
        assert late.status_code == 200 and late.headers["x-duplicates"] == "1"
    assert sorted(e["id"] for e in await inbox(redis, prefix)) == sorted([str(first), str(second)])


async def test_pages_of_conversations_and_messages_are_read_down_to_the_floor(
    catchup: ChatwootCatchUp, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    now = time.time()
    old = now - 3600
    for conversation in range(100, 140):  # quiet for an hour: below the floor
        chatwoot.customer_writes(conversation, "viejo", created_at=old, webhook=False)
    await set_cursor(redis, prefix, now - 60)
    for conversation in range(200, 230):  # 30 active ones: two pages
        chatwoot.customer_writes(conversation, "nuevo", webhook=False)
    for n in range(45):  # one long conversation: three message reads
        chatwoot.customer_writes(300, f"m{n}", webhook=False)
    one = await run(catchup)
    assert one.complete and one.taken == 30 + 45
    lists = chatwoot.calls("list")
    assert [r.extra["query"]["page"] for r in lists] == ["1", "2"]
    assert {r.extra["query"]["status"] for r in lists} == {"all"}
    assert len(chatwoot.calls("history", conversation=300)) == 3
    assert not any(chatwoot.calls("history", conversation=c) for c in range(100, 140))
    texts = [e["text"] for e in await inbox(redis, prefix) if e["person"] == "300"]
    assert texts == [f"m{n}" for n in range(45)]  # in order


async def test_the_cursor_advances_and_the_next_run_reads_only_what_is_newer(
    catchup: ChatwootCatchUp, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    base = time.time() - 1000
    await set_cursor(redis, prefix, base)
    chatwoot.customer_writes(42, "uno", created_at=base + 100, webhook=False)
    chatwoot.customer_writes(43, "dos", created_at=base + 500, webhook=False)
    assert (await run(catchup)).taken == 2
    cursor = int(await redis.hget(Keys(prefix).chatwoot_catchup_cursor, TENANT))
    assert cursor == int(base + 500)
    before = len(chatwoot.requests)
    chatwoot.customer_writes(44, "tres", webhook=False)
    one = await run(catchup)
    assert one.taken == 1
    # 42 is older than the cursor less the overlap: not read again.
    read = [r.extra["conversation"] for r in chatwoot.requests[before:] if r.kind == "history"]
    assert read == [44, 43]
    assert OVERLAP_S < 400


async def test_a_429_is_waited_out(
    catchup: ChatwootCatchUp, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    await set_cursor(redis, prefix, time.time() - 60)
    chatwoot.customer_writes(42, "hola", webhook=False)
    chatwoot.fail_next(1, 429, kinds=["list"], retry_after=0.5)
    chatwoot.fail_next(1, 429, kinds=["history"], retry_after=0.5)
    started = time.monotonic()
    one = await run(catchup)
    assert one.complete and one.taken == 1 and one.errors == 0
    assert time.monotonic() - started >= 0.9
    assert [r.status for r in chatwoot.requests] == [429, 200, 429, 200]


async def test_a_5xx_leaves_the_tenant_unfinished_and_the_cursor_where_it_was(
    catchup: ChatwootCatchUp, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    cursor = int(time.time() - 60)
    await set_cursor(redis, prefix, cursor)
    chatwoot.customer_writes(42, "uno", webhook=False)
    chatwoot.customer_writes(43, "dos", webhook=False)
    chatwoot.fail_next(1, 502, kinds=["history"], conversation=42)
    one = await run(catchup)
    assert not one.complete and one.errors == 1 and "502" in one.why
    assert int(await redis.hget(Keys(prefix).chatwoot_catchup_cursor, TENANT)) == cursor
    stats = await redis.hgetall(Keys(prefix).tenant(TENANT).stats)
    assert stats[b"catchup_api_errors"] == b"1" and stats[b"catchup_runs"] == b"1"
    # The next run reads it all (what it had taken is a duplicate now).
    again = await run(catchup)
    assert again.complete and again.taken == 1
    assert sorted(e["text"] for e in await inbox(redis, prefix)) == ["dos", "uno"]


async def test_a_run_makes_at_most_its_budget_of_calls(
    config: Settings, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    await set_cursor(redis, prefix, time.time() - 60)
    for conversation in range(100, 160):
        chatwoot.customer_writes(conversation, "hola", webhook=False)
    small = config.with_overrides(chatwoot_catchup_max_calls=5)
    reader = ChatwootReader(small)
    try:
        catchup = ChatwootCatchUp(small, redis, Keys(prefix), Scripts(), reader)
        one = await run(catchup)
    finally:
        await reader.aclose()
    assert not one.complete and one.why == "call budget used up"
    assert len(chatwoot.requests) == 5 and one.taken == 4


async def test_one_worker_at_a_time(
    config: Settings, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    loops = [ChatwootCatchUpLoop(config, redis, Keys(prefix), Scripts()) for _ in range(2)]
    try:
        assert await loops[0].catchup.acquire()
        # A run Redis broke off could not release the lock: its worker takes it back at once.
        assert await loops[0].catchup.acquire()
        await redis.hset(Keys(prefix).chatwoot_catchup_wanted, TENANT, int(time.time() * 1000))
        assert await loops[1].tick() is None  # asked for, but the lock is held
        assert await redis.exists(Keys(prefix).chatwoot_catchup_wanted)
        await loops[0].catchup.release()
        report = await loops[1].tick()
        assert report is not None and [t.tenant for t in report.tenants] == [TENANT]
        assert not await redis.exists(Keys(prefix).chatwoot_catchup_wanted)
        assert not await redis.exists(Keys(prefix).chatwoot_catchup_lock)
    finally:
        for loop in loops:
            await loop.aclose()


async def test_a_receiver_that_could_not_store_a_webhook_asks_for_a_catch_up(
    config: Settings, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    """Redis refuses the receiver's writes (a paused client: the writes time out) for longer
    than the hold: the webhook is answered 500, and once Redis answers the receiver sets the
    request the workers' catch-up takes."""
    from receiver.app import create_app
    from scripts.standins import BackgroundServer

    paused = config.with_overrides(webhook_hold_s=0.5, redis_timeout_s=0.3)
    app = create_app(paused)
    async with BackgroundServer(app, name="receiver") as receiver:
        body = orjson.dumps(message_created(message_id=9, content="hola", conversation=42))
        await redis.execute_command("CLIENT", "PAUSE", 2000)
        try:
            async with httpx.AsyncClient() as client:
                answer = await client.post(
                    f"{receiver.url}/webhooks/chatwoot",
                    content=body,
                    headers=chatwoot_headers(body, WEBHOOK_SECRET),
                )
        finally:
            await redis.execute_command("CLIENT", "UNPAUSE")
        assert answer.status_code == 500
        wanted = Keys(prefix).chatwoot_catchup_wanted

        async def asked() -> Any:
            return await redis.hget(wanted, TENANT)

        from tests.worker.support import wait_for

        since = int(await wait_for(asked, "the catch-up request", timeout_s=10))
        assert abs(since / 1000 - time.time()) < 10


async def test_a_request_keeps_the_earliest_time_and_an_unfinished_run_asks_again(
    config: Settings, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    keys, scripts = Keys(prefix), Scripts()
    await ask(redis, keys, scripts, {TENANT: 5_000})
    await ask(redis, keys, scripts, {TENANT: 9_000})
    assert await redis.hget(keys.chatwoot_catchup_wanted, TENANT) == b"5000"
    since = 3_000  # earlier still: kept
    await ask(redis, keys, scripts, {TENANT: since})
    chatwoot.fail_always(503, kinds=["list"])
    loops = [ChatwootCatchUpLoop(config, redis, keys, scripts) for _ in range(2)]
    try:
        report = await loops[0].tick()
        assert report is not None and [t.why[:8] for t in report.unfinished] == ["HTTP 503"]
        # Asked for again, from the same time; nobody runs again before RETRY_S.
        assert await redis.hget(keys.chatwoot_catchup_wanted, TENANT) == str(since).encode()
        assert 0 < await redis.pttl(keys.chatwoot_catchup_lock) <= RETRY_S * 1000
        assert await loops[1].tick() is None
        assert await loops[0].tick() is None  # the worker that held it waits too
    finally:
        for loop in loops:
            await loop.aclose()


async def test_the_periodic_run_covers_every_chatwoot_tenant_once_an_interval(
    config: Settings, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    keys = Keys(prefix)
    await redis.sadd(keys.tenants, "cw-1-3", "cw-2-8", "106540352242922")
    periodic = config.with_overrides(chatwoot_catchup_interval_s=60.0)
    loops = [ChatwootCatchUpLoop(periodic, redis, keys, Scripts()) for _ in range(2)]
    try:
        report = await loops[0].tick()
        assert report is not None
        assert [t.tenant for t in report.tenants] == ["cw-1-3", "cw-2-8"]
        assert {t.why for t in report.tenants} == {"cursor started"}
        assert await loops[1].tick() is None  # one periodic run an interval, fleet-wide
        assert await loops[0].tick() is None
    finally:
        for loop in loops:
            await loop.aclose()


async def test_nothing_older_than_the_horizon_is_taken_in(
    config: Settings, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    """Asked to read back two days, with a horizon of an hour: only the last hour is read."""
    now = time.time()
    chatwoot.customer_writes(42, "hace dos días", created_at=now - 2 * 86400, webhook=False)
    chatwoot.customer_writes(43, "hace media hora", created_at=now - 1800, webhook=False)
    short = config.with_overrides(chatwoot_catchup_horizon_s=3600.0)
    reader = ChatwootReader(short)
    try:
        catchup = ChatwootCatchUp(short, redis, Keys(prefix), Scripts(), reader)
        one = await run(catchup, asked_ms=int((now - 2 * 86400) * 1000))
    finally:
        await reader.aclose()
    assert one.complete and one.taken == 1
    assert [e["text"] for e in await inbox(redis, prefix)] == ["hace media hora"]
    # Never beyond half of DEDUPE_TTL_S, whatever is set.
    capped = config.with_overrides(dedupe_ttl_s=3600, chatwoot_catchup_horizon_s=86400.0)
    assert ChatwootCatchUp(capped, redis, Keys(prefix), Scripts(), reader).horizon_s == 1800


def test_an_attachment_read_from_the_api_is_the_webhook_s(chatwoot: ChatwootApiStandIn) -> None:
    image = {"file_type": "image", "data_url": "https://chatwoot.example/rails/photo.jpg"}
    message_id = chatwoot.customer_writes(42, "la canilla", attachments=[image], webhook=False)
    (message,) = chatwoot.messages(42)
    conversation = {"id": 42, "inbox_id": 3, "status": "pending", "meta": {}}
    (from_api,) = parse_message(message, conversation, 1, 1_000).events[TENANT]
    hook = message_created(
        message_id=message_id, content="la canilla", conversation=42, attachments=[image]
    )
    (from_hook,) = parse_body(orjson.dumps(hook), 1_000).events[TENANT]
    assert from_api["type"] == from_hook["type"] == "image"
    assert from_api["text"] == from_hook["text"] == "[image: la canilla]"
    assert from_api["raw"]["attachments"][0]["data_url"] == image["data_url"]


async def test_runs_the_budget_stops_go_on_where_the_last_one_ended(
    config: Settings, chatwoot: ChatwootApiStandIn, redis: Redis, prefix: str
) -> None:
    """60 active conversations, 10 calls a run: each run goes on from where the last one
    stopped (a customer writing meanwhile moves a conversation to the top), until the pass
    reached its floor; then the cursor moves, and the next pass reads what came meanwhile.
    Every message taken in once."""
    keys = Keys(prefix)
    await set_cursor(redis, prefix, time.time() - 60)
    for conversation in range(100, 160):
        chatwoot.customer_writes(conversation, f"hola {conversation}", webhook=False)
    small = config.with_overrides(chatwoot_catchup_max_calls=10)
    reader = ChatwootReader(small)
    runs = []
    try:
        catchup = ChatwootCatchUp(small, redis, keys, Scripts(), reader)
        while not runs or not runs[-1].complete:
            assert len(runs) < 12, [r.why for r in runs]
            before = len(chatwoot.requests)
            runs.append(await run(catchup))
            assert len(chatwoot.requests) - before <= 10
            if len(runs) == 2:  # a customer read already writes again: to the top
                chatwoot.customer_writes(155, "otra vez", webhook=False)
        assert all(r.why == "call budget used up" for r in runs[:-1]) and len(runs) >= 6
        assert not await redis.hexists(keys.chatwoot_catchup_resume, TENANT)
        texts = sorted(e["text"] for e in await inbox(redis, prefix))
        assert texts == sorted(f"hola {c}" for c in range(100, 160))
        assert (await run(catchup)).taken == 1  # the next pass: what came meanwhile
    finally:
        await reader.aclose()
    texts = sorted(e["text"] for e in await inbox(redis, prefix))
    assert texts == sorted([f"hola {c}" for c in range(100, 160)] + ["otra vez"])
