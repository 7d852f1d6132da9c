"""Nothing a sender does grows the receiver or Redis without bound (issue 21, finding 4).

- The dead-letter list keeps the newest `DEADLETTER_MAX` bodies in `DEADLETTER_MAX_BYTES` of
  memory, trimmed in the same script that pushes, and expires `DEADLETTER_TTL_S` after its last
  body; `wa_webhook_deadletters_dropped_total` counts what was dropped. Each bad body still gets
  200 with `x-deadlettered` (signed: Meta must not retry it); nothing else changes.
- Garbage never registers a tenant: the registry (`wa:tenants`) grows only with stored items.
- The Procfile's receiver cuts off a body that is not in within `BODY_READ_TIMEOUT_S` (408,
  connection closed), so 200 idle sockets and trickled bodies hold nothing for long, and
  `--limit-concurrency` (`WEB_MAX_CONNECTIONS`) answers 503 beyond its count.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer
from shared.keys import Keys
from shared.settings import Settings
from tests.receiver.support import (
    TENANT,
    URL,
    counts,
    deadletters,
    dumps,
    inbox,
    payload,
    post,
    procfile_process,
    running,
    text_message,
)
from tests.receiver.test_metrics import AUTH, metrics_settings, mine, parse
from tests.support.helpers import sign

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


def garbage(n: int, size: int = 100) -> bytes:
    """A signed body nobody can parse, `size` bytes, told apart by `n`."""
    return f"garbage {n} ".encode().ljust(size, b"#")


async def dropped(client: httpx.AsyncClient) -> float:
    response = await client.get("/metrics", headers=AUTH)
    return mine(parse(response.text), "wa_webhook_deadletters_dropped_total")


# --- dead letters --------------------------------------------------------------------------------


async def test_dead_letters_keep_the_newest_by_count_and_the_metric_counts_the_rest(
    settings: Settings, redis: Redis
) -> None:
    async with running(metrics_settings(settings, deadletter_max=3)) as client:
        for n in range(5):
            # each bad body: 200, marked dead-lettered, kept whole
            assert counts(await post(client, garbage(n))) == {
                "stored": 0,
                "duplicates": 0,
                "deadlettered": True,
            }
        assert await deadletters(redis) == [garbage(2), garbage(3), garbage(4)]
        assert await dropped(client) == 2


async def test_dead_letters_are_capped_by_memory_not_only_by_count(
    settings: Settings, redis: Redis
) -> None:
    """Five signed 4 MiB garbage bodies grew Redis 24 MiB for ever; now the list stays within
    DEADLETTER_MAX_BYTES of memory and keeps the newest."""
    bounded = metrics_settings(settings, max_body_bytes=4 * MiB, deadletter_max_bytes=12 * MiB)
    async with running(bounded) as client:
        for n in range(5):
            response = await post(client, garbage(n, 4 * MiB - 1))
            assert response.headers["x-deadlettered"] == "1"
        kept = await deadletters(redis)
        assert kept == [garbage(3, 4 * MiB - 1), garbage(4, 4 * MiB - 1)]
        assert await redis.memory_usage(Keys().deadletter, samples=0) <= 12 * MiB
        assert await dropped(client) == 3


async def test_the_newest_dead_letter_stays_even_above_the_memory_bound(
    settings: Settings, redis: Redis
) -> None:
    async with running(settings.with_overrides(deadletter_max_bytes=1)) as client:
        await post(client, garbage(1))
        await post(client, garbage(2))
    assert await deadletters(redis) == [garbage(2)]


async def test_dead_letters_expire_and_nothing_else_gets_a_ttl(
    settings: Settings, redis: Redis
) -> None:
    async with running(settings.with_overrides(deadletter_ttl_s=0.5)) as client:
        good_and_bad = dumps(
            payload((TENANT, [text_message("good1"), {"type": "text", "no": "id"}], []))
        )
        assert counts(await post(client, good_and_bad))["deadlettered"]
        assert 0 < await redis.pttl(Keys().deadletter) <= 500
        # The good item, its tenant's keys and the registry are as before: no expiry.
        assert [e["id"] for e in await inbox(redis)] == ["good1"]
        assert await redis.ttl(Keys().tenant(TENANT).inbox) == -1
        assert await redis.ttl(Keys().tenants) == -1
        await asyncio.sleep(0.7)
        assert await redis.exists(Keys().deadletter) == 0
        assert [e["id"] for e in await inbox(redis)] == ["good1"]


async def test_garbage_registers_no_tenant(client: httpx.AsyncClient, redis: Redis) -> None:
    """Only stored items add to `wa:tenants` (receiver/store.py is the one writer)."""
    unroutable = dumps(payload(("{tag}", [text_message("w1")], [])))
    for body in (garbage(1), unroutable):
        assert counts(await post(client, body))["deadlettered"]
    assert await redis.exists(Keys().tenants) == 0
    assert counts(await post(client, dumps(payload((TENANT, [text_message("w2")], [])))))
    assert await redis.smembers(Keys().tenants) == {TENANT.encode()}


# --- the Procfile's receiver: body deadline and concurrency limit -------------------------------

BODY_TIMEOUT_S = 1.0
RESET = b"<connection reset>"
# A body the receiver would accept by size (MAX_BODY_BYTES, 4 MiB) that never completes.
HEADERS = (
    f"POST {URL} HTTP/1.1\r\nHost: receiver\r\nContent-Type: application/json\r\n"
    f"Content-Length: {4 * MiB - 1}\r\nX-Hub-Signature-256: sha256={'0' * 64}\r\n\r\n"
).encode()


@contextmanager
def procfile_web(redis_url: str, tmp_path: Path, **env: str) -> Iterator[str]:
    """The Procfile's `web` line with short deadlines; its base URL once /healthz answers."""
    timeouts = {
        "BODY_READ_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "HEADERS_TIMEOUT_S": str(BODY_TIMEOUT_S),
    }
    with procfile_process(redis_url, tmp_path / "web.log", **(timeouts | env)) as (_, port):
        yield f"http://127.0.0.1:{port}"


async def slow_client(port: int, trickle: bool) -> tuple[bytes, float]:
    """Headers of a 4 MiB body, then nothing (`trickle`: 1 KiB every 0.1 s); what the server
    answered up to closing the connection (RESET if the close reset it), and when it closed
    (monotonic)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEADERS + b"{" * 1024)
    await writer.drain()

    async def dribble() -> None:
        while trickle:
            await asyncio.sleep(0.1)
            writer.write(b" " * 1024)
            await writer.drain()

    sending = asyncio.create_task(dribble())
    try:
        answer = await asyncio.wait_for(reader.read(), 15)  # until the server closes
    except ConnectionResetError:
        # Bytes trickling in after the server's close make its kernel answer RST, which may
        # overtake the 408 in the client's buffer: cut off all the same.
        answer = RESET
    try:
        return answer, time.monotonic()
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        writer.close()


@pytest.fixture
async def web(redis_server: RedisServer, redis: Redis, tmp_path: Path) -> AsyncIterator[str]:
    with procfile_web(redis_server.url, tmp_path) as url:
        yield url


async def test_idle_sockets_and_trickled_bodies_are_cut_off_with_408(
    web: str, redis: Redis
) -> None:
    port = int(web.rsplit(":", 1)[1])
    started = time.monotonic()
    answers = await asyncio.gather(
        *(slow_client(port, trickle=False) for _ in range(200)),
        *(slow_client(port, trickle=True) for _ in range(20)),
    )
    for n, (answer, closed_at) in enumerate(answers):
        if answer == RESET:
            assert n >= 200, "only a trickling client may see its 408 overtaken by a reset"
        else:
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"connection: close" in answer.lower()
        # the deadline, plus the watcher's tick (a quarter of it), plus a loaded machine's slack
        assert closed_at - started < BODY_TIMEOUT_S * 1.25 + 3
    async with httpx.AsyncClient(base_url=web) as http:
        body = dumps(payload((TENANT, [text_message("after")], [])))
        response = await http.post(URL, content=body, headers={"X-Hub-Signature-256": sign(body)})
    assert counts(response) == {"stored": 1, "duplicates": 0}
    assert await redis.llen(Keys().deadletter) == 0  # unsigned: nothing stored


async def test_the_concurrency_limit_answers_503_until_the_slow_ones_are_cut(
    redis_server: RedisServer, redis: Redis, tmp_path: Path
) -> None:
    with procfile_web(redis_server.url, tmp_path, WEB_MAX_CONNECTIONS="5") as url:
        port = int(url.rsplit(":", 1)[1])
        # uvicorn counts the connection asking too: the fifth is refused
        slow = [asyncio.create_task(slow_client(port, trickle=False)) for _ in range(4)]
        await asyncio.sleep(0.3)  # all four connected and waiting for their bodies
        body = dumps(payload((TENANT, [text_message("w1")], [])))
        headers = {"X-Hub-Signature-256": sign(body)}
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.post(URL, content=body, headers=headers)).status_code == 503
            for answer, _ in await asyncio.gather(*slow):
                assert answer.startswith(b"HTTP/1.1 408 ")
            response = await http.post(URL, content=body, headers=headers)
    assert counts(response) == {"stored": 1, "duplicates": 0}  # Meta's retry gets in


async def no_headers_client(port: int, sent: bytes) -> tuple[bytes, float]:
    """Open a connection, send `sent` (nothing, or the start of a request's headers) and then
    nothing more; what the server answered before closing, and when it closed (monotonic)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if sent:
            writer.write(sent)
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 15)  # until the server closes
        return answer, time.monotonic()
    finally:
        writer.close()


async def test_sockets_whose_headers_never_end_are_closed(web: str, redis: Redis) -> None:
    """uvicorn arms no timer before a request's headers are in: without the Procfile's
    protocol (receiver/header_deadline.py) these sockets stayed open for ever, each counting
    against WEB_MAX_CONNECTIONS. Each gets its connection closed, without an answer."""
    port = int(web.rsplit(":", 1)[1])
    started = time.monotonic()
    partial = b"POST /webhooks/whatsapp HTTP/1.1\r\nHost: x\r\nContent-Len"
    closed = await asyncio.gather(
        *(no_headers_client(port, b"") for _ in range(100)),
        *(no_headers_client(port, partial) for _ in range(100)),
    )
    for answer, closed_at in closed:
        assert answer == b""  # closed, nothing written
        assert closed_at - started < BODY_TIMEOUT_S + 3  # the deadline, plus a loaded machine
    async with httpx.AsyncClient(base_url=web) as http:
        body = dumps(payload((TENANT, [text_message("afterheaders")], [])))
        response = await http.post(URL, content=body, headers={"X-Hub-Signature-256": sign(body)})
    assert counts(response) == {"stored": 1, "duplicates": 0}


async def test_a_keep_alive_connection_serves_requests_after_the_header_deadline(
    web: str, redis: Redis
) -> None:
    """The deadline runs from a request's first byte, not from the connection's start: a
    client that keeps one connection for several webhooks is not cut off."""
    async with httpx.AsyncClient(base_url=web) as http:
        for n in range(3):
            body = dumps(payload((TENANT, [text_message(f"kept{n}")], [])))
            response = await http.post(
                URL, content=body, headers={"X-Hub-Signature-256": sign(body)}
            )
            assert counts(response) == {"stored": 1, "duplicates": 0}
            await asyncio.sleep(BODY_TIMEOUT_S * 0.6)  # past the deadline across requests
