"""Nothing a Chatwoot customer said is lost to a Redis outage (invariant 1 for a provider that
never retries): Redis is stopped for 60 s while customers write; the receiver answers their
account webhooks 500 after the hold and the stand-in, like Chatwoot, never sends them again.
Once Redis is back every one of those messages is answered, exactly once, within a minute: the
receiver asks for a catch-up and a worker reads the messages back through the API stand-in.
A message whose webhook was stored before the outage is not answered again. A conversation a
person handles stays silent.

Real processes: the receiver on uvicorn, `python -m worker` processes, a `redis-server` of this
test alone (append-only, so what it had before the stop comes back), the real httpx.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from receiver.app import create_app
from scripts.dev.redis_server import RedisServer
from scripts.standins import (
    BackgroundServer,
    ChatwootApiStandIn,
    chatwoot_headers,
    message_created,
)
from scripts.webhooks import agent_user
from shared.keys import Keys
from shared.settings import Settings
from tests.chatwoot.support import API_TOKEN, TENANT, WEBHOOK_SECRET
from tests.support.helpers import APP_SECRET
from tests.worker.support import WorkerFleet, wait_for

pytestmark = pytest.mark.slow

OUTAGE_S = 60.0
HOLD_S = 1.0  # WEBHOOK_HOLD_S: shorter than the default 4 s, the test is long enough
WRITERS = 4  # conversations whose customer writes during the outage


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture
async def own_client(own_redis: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(own_redis.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def stack(
    own_redis: RedisServer,
    own_client: Redis,
    prefix: str,
    chatwoot: ChatwootApiStandIn,
    tmp_path: Path,
) -> AsyncIterator[WorkerFleet]:
    """The receiver and two workers on `own_redis`, answering through the stand-in."""
    settings = Settings.from_env(
        {
            "REDIS_URL": own_redis.url,
            "KEY_PREFIX": prefix,
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "CHATWOOT_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "WEBHOOK_HOLD_S": str(HOLD_S),
            "REDIS_TIMEOUT_S": "0.5",
        }
    )
    fleet = WorkerFleet(own_client, own_redis.url, prefix, tmp_path)
    async with BackgroundServer(create_app(settings), name="receiver") as receiver:
        chatwoot.configure(
            webhook_url=f"{receiver.url}/webhooks/chatwoot", webhook_secret=WEBHOOK_SECRET
        )
        try:
            await fleet.start(
                2,
                BRAIN="echo",
                CHATWOOT_BASE_URL=chatwoot.url,
                CHATWOOT_API_ACCESS_TOKEN=API_TOKEN,
                # Only the receiver's request and the workers' own recovery start a catch-up.
                CHATWOOT_CATCHUP_INTERVAL_S="0",
                REDIS_TIMEOUT_S="0.5",
            )
            yield fleet
        finally:
            fleet.close()
            print(fleet.dump())


async def replied(chatwoot: ChatwootApiStandIn, conversation: int, count: int = 1) -> None:
    await chatwoot.await_for(lambda: len(chatwoot.replies(conversation)) >= count, timeout=20)


async def test_messages_refused_during_a_60s_outage_are_answered_once_after_it(
    stack: WorkerFleet, own_redis: RedisServer, chatwoot: ChatwootApiStandIn
) -> None:
    chatwoot.customer_writes(41, "antes del corte")
    await replied(chatwoot, 41)
    chatwoot.agent_writes(49, "la atiendo yo")  # 49 is a person's now: the bot is silent
    await chatwoot.await_webhooks(timeout=10)
    before = len(chatwoot.webhook_deliveries)

    own_redis.stop()
    stopped = time.monotonic()
    refused = []
    for n in range(WRITERS):
        refused.append(chatwoot.customer_writes(50 + n, f"durante el corte {n}"))
        if n == 1:
            refused.append(chatwoot.customer_writes(41, "otra vez yo"))
            refused.append(chatwoot.customer_writes(49, "hola?"))
        await asyncio.sleep((OUTAGE_S - 10) / WRITERS)
    await chatwoot.await_webhooks(timeout=20)
    during = chatwoot.webhook_deliveries[before:]
    assert sorted(d.message_id for d in during) == sorted(refused)
    assert {d.response_status for d in during} == {500}  # and Chatwoot never sends them again
    await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))

    own_redis.start()
    back = time.monotonic()
    for n in range(WRITERS):
        await chatwoot.await_for(lambda n=n: chatwoot.replies(50 + n), timeout=60)
    await chatwoot.await_for(lambda: len(chatwoot.replies(41)) == 2, timeout=60)
    answered_s = time.monotonic() - back
    print(f"every refused message answered {answered_s:.1f}s after Redis was back")
    assert answered_s < 60
    await asyncio.sleep(5)  # any second answer would have come by now
    for n in range(WRITERS):
        (reply,) = chatwoot.replies(50 + n)
        assert f"durante el corte {n}" in reply.content
    first, second = chatwoot.replies(41)
    assert "antes del corte" in first.content and second.content == "Got 1 message: otra vez yo"
    assert chatwoot.replies(49) == []
    assert len(chatwoot.webhook_deliveries) - before == len(refused) + WRITERS + 1
    taken = await _stat(stack, "catchup_messages")
    assert taken == len(refused)


async def _stat(fleet: WorkerFleet, name: str) -> int:
    async def read() -> int | None:
        try:
            raw = await fleet.redis.hget(Keys(fleet.prefix).tenant(TENANT).stats, name)
        except RedisConnectionError:  # the connection from before the restart: a new one next
            return None
        return int(raw) if raw is not None else None

    return await wait_for(read, name, timeout_s=10)


async def test_the_periodic_catch_up_answers_once_whichever_way_comes_second(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    receiver_url: str,
    chatwoot: ChatwootApiStandIn,
) -> None:
    """No outage: a webhook that never came (the safety net), a webhook after the catch-up, a
    catch-up after the webhook; private notes and activity messages start nothing; a
    conversation a person handles stays silent."""
    await fleet.start(2, **{**env, "CHATWOOT_CATCHUP_INTERVAL_S": "1"})
    keys = Keys(prefix)
    # The webhook first: answered; the catch-up runs after it bring it again, a duplicate.
    chatwoot.customer_writes(41, "por webhook")
    await replied(chatwoot, 41)

    async def cursor() -> bytes | None:
        return await redis.hget(keys.chatwoot_catchup_cursor, TENANT)  # type: ignore[no-any-return]

    await wait_for(cursor, "the inbox's cursor", timeout_s=20)
    chatwoot.agent_writes(49, "la atiendo yo")  # 49 is a person's: the bot is silent there
    await chatwoot.await_webhooks(timeout=10)
    # No webhook at all: the periodic run brings it in, and it is answered.
    lost = chatwoot.customer_writes(42, "sin webhook", webhook=False)
    chatwoot.customer_writes(49, "hola?", webhook=False)
    chatwoot.add_message(43, "nota interna", 1, private=True, sender=agent_user(12, "Laura"))
    chatwoot.add_message(43, "Conversation was reopened", 2)
    await replied(chatwoot, 42)
    # Its webhook comes late: a duplicate.
    body = orjson.dumps(message_created(message_id=lost, content="sin webhook", conversation=42))
    async with httpx.AsyncClient() as client:
        late = await client.post(
            receiver_url, content=body, headers=chatwoot_headers(body, WEBHOOK_SECRET)
        )
    assert late.status_code == 200 and late.headers["x-duplicates"] == "1"
    runs = int(await redis.hget(keys.tenant(TENANT).stats, "catchup_runs") or 0)

    async def more_runs() -> bool:
        now = int(await redis.hget(keys.tenant(TENANT).stats, "catchup_runs") or 0)
        return now >= runs + 3

    await wait_for(more_runs, "three more catch-up runs", timeout_s=20)
    assert [r.content for r in chatwoot.replies(41)] == ["Got 1 message: por webhook"]
    assert [r.content for r in chatwoot.replies(42)] == ["Got 1 message: sin webhook"]
    assert chatwoot.replies(43) == [] and chatwoot.replies(49) == []
    assert await _stat(fleet, "catchup_messages") == 2  # 42's and 49's


async def test_workers_whose_redis_failed_catch_up_once_it_answers(
    stack: WorkerFleet, own_redis: RedisServer, chatwoot: ChatwootApiStandIn
) -> None:
    """A message whose webhook never reached a receiver while Redis was down (the receiver
    died, say): no receiver asks, and the periodic run is off; the workers, whose own Redis
    calls failed, catch up once it answers."""
    chatwoot.customer_writes(41, "antes del corte")
    await replied(chatwoot, 41)
    own_redis.stop()
    await asyncio.sleep(3)  # the workers' calls fail meanwhile
    chatwoot.customer_writes(42, "sin webhook, durante el corte", webhook=False)
    own_redis.start()
    await chatwoot.await_for(lambda: chatwoot.replies(42), timeout=30)
    (reply,) = chatwoot.replies(42)
    assert reply.content == "Got 1 message: sin webhook, durante el corte"
    assert len(chatwoot.replies(41)) == 1
