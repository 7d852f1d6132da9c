"""The webhook POST served straight from the HTTP protocol (receiver/http_protocol.py), over real
HTTP: it answers what the ASGI path answers, and hands the ASGI path what it does not take.

Each test runs uvicorn in the test's own event loop with `ReceiverProtocol` (the Procfile's
`--http`), and counts the calls of `Receiver.webhook`, the ASGI path's handler: a request the
direct path served leaves the count at 0. Raw sockets send exact bytes (pipelining, HTTP/1.0,
`Expect`, chunked bodies) and read exact answers. A test that pauses or stops Redis does it to
a Redis of its own (`own_server`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from redis.asyncio import Redis
from starlette.types import Receive, Scope, Send

from receiver.app import ReceiverApp, create_app
from receiver.http_protocol import ReceiverProtocol
from receiver.providers.base import InboundProvider
from scripts.dev.redis_server import RedisServer, free_port
from scripts.webhooks import chatwoot_headers, message_created
from shared.keys import Keys
from shared.settings import Settings
from tests.receiver.support import (
    TENANT,
    TENANT_2,
    URL,
    deadletters,
    dumps,
    inbox,
    payload,
    procfile_process,
    text_message,
)
from tests.receiver.test_metrics import AUTH, metrics_settings, mine, parse
from tests.support.helpers import sign

# uvicorn decodes this to URL for the app; the direct path takes only the exact path, so a
# request to it goes the ASGI way: the same request through the other path.
ESCAPED_URL = "/webhooks/%77hatsapp"
CHATWOOT_URL = "/webhooks/chatwoot"
CHATWOOT_SECRET = "cw-protocol-secret"
CHATWOOT_TENANT = "cw-1-3"  # account 1, inbox 3: message_created's defaults
WRONG = "sha256=" + "0" * 64
MAX_BODY = 1000  # MAX_BODY_BYTES for these tests: small bodies cross it
BODY_TIMEOUT_S = 0.5
SLACK_S = 3.0  # on top of any deadline: a loaded two-core machine


def text_body(*message_ids: str, tenant: str = TENANT) -> bytes:
    """A webhook body with one text message per id."""
    return dumps(payload((tenant, [text_message(m) for m in message_ids], [])))


def part_valid(message_id: str) -> bytes:
    """One good message and one without an id: the good one is stored, the body dead-lettered."""
    bad = {"type": "text", "text": {"body": "no id"}}
    return dumps(payload((TENANT, [text_message(message_id), bad], [])))


def garbage(n: int) -> bytes:
    """A body nobody can parse (dead-lettered whole when signed)."""
    return f"garbage {n} ".encode().ljust(100, b"#")


def request(
    body: bytes,
    *,
    path: str = URL,
    signature: str | None = "sign",
    version: str = "1.1",
    headers: dict[str, str] | None = None,
    chunks: int = 0,
) -> bytes:
    """A webhook POST's exact bytes, signed with the test secret unless `signature` says
    otherwise (None: unsigned). `chunks`: the body chunked in that many pieces, without a
    Content-Length."""
    lines = [f"POST {path} HTTP/{version}", "Host: receiver", "Content-Type: application/json"]
    if signature == "sign":
        signature = sign(body)
    if signature is not None:
        lines.append(f"X-Hub-Signature-256: {signature}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if chunks:
        lines.append("Transfer-Encoding: chunked")
        size = -(-len(body) // chunks)
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        encoded = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    else:
        lines.append(f"Content-Length: {len(body)}")
        encoded = body
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + encoded


@dataclass
class Answer:
    """One HTTP answer as read off the socket."""

    status: int
    head: bytes  # the status line and headers, as sent
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def counts(self) -> dict[str, Any]:
        """A 200's counts (the body is empty), as tests/receiver/support.py's `counts`."""
        assert self.status == 200 and self.body == b"", self
        found: dict[str, Any] = {
            "stored": int(self.headers["x-stored"]),
            "duplicates": int(self.headers["x-duplicates"]),
        }
        if self.headers.get("x-deadlettered"):
            found["deadlettered"] = True
        return found

    @property
    def dateless(self) -> bytes:
        """The whole answer without its `date` line, the one part that changes each second."""
        return re.sub(rb"\r\ndate: [^\r]*", b"", self.head) + self.body


class Connection:
    """A raw client socket: exact bytes out, whole answers in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, timeout_s: float = 10.0) -> Answer:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout_s)
        lines = head[:-4].split(b"\r\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.decode().lower()] = value.strip().decode()
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(self.reader.readexactly(length), timeout_s)
        return Answer(int(lines[0].split()[1]), head, headers, body)

    async def post(self, data: bytes) -> Answer:
        await self.send(data)
        return await self.answer()

    async def closed_by_server(self, timeout_s: float = 5.0) -> bool:
        """Whether the server closes the connection (end of stream, nothing more sent)."""
        try:
            rest = await asyncio.wait_for(self.reader.read(), timeout_s)
        except ConnectionResetError:
            return True
        return rest == b""

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


@dataclass
class Served:
    """A receiver served by `ReceiverProtocol` in this test's loop."""

    app: ReceiverApp
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int
    asgi: list[str] = field(default_factory=list)  # the paths `Receiver.webhook` served

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        connection = Connection(reader, writer)
        try:
            yield connection
        finally:
            await connection.close()

    async def post(self, data: bytes) -> Answer:
        """`data` on a connection of its own; the answer."""
        async with self.connect() as connection:
            return await connection.post(data)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}")


async def wait_until(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def serving(settings: Settings, **config: Any) -> AsyncIterator[Served]:
    """The app of `settings` under uvicorn with `ReceiverProtocol`, started in this loop and
    stopped (gracefully) after; `config`: more of uvicorn's options."""
    app = create_app(settings)
    receiver = app.receiver
    asgi: list[str] = []
    handler = receiver.webhook

    async def counted(
        scope: Scope, receive: Receive, send: Send, inbound: InboundProvider | None = None
    ) -> None:
        asgi.append(scope["path"])
        await handler(scope, receive, send, inbound)

    receiver.webhook = counted  # type: ignore[method-assign]
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            http=ReceiverProtocol,
            lifespan="on",
            log_config=None,  # the test process's logging stays as it is
            access_log=False,
            **config,
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: server.started or task.done(), 15, "uvicorn started")
        assert not task.done(), task.exception()
        yield Served(app, server, task, port, asgi)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


@pytest.fixture
def limited(settings: Settings) -> Settings:
    return settings.with_overrides(
        max_body_bytes=MAX_BODY,
        body_read_timeout_s=BODY_TIMEOUT_S,
        chatwoot_webhook_secrets=(CHATWOOT_SECRET,),
    )


@pytest.fixture
async def served(limited: Settings, redis: Redis) -> AsyncIterator[Served]:
    async with serving(limited) as s:
        yield s


def on_own_redis(settings: Settings, server: RedisServer, **changes: object) -> Settings:
    return settings.with_overrides(
        redis_url=server.url, chatwoot_webhook_secrets=(CHATWOOT_SECRET,), **changes
    )


async def pause_writes(admin: Redis, ms: int) -> None:
    await admin.client_pause(ms, all=False)  # CLIENT PAUSE ms WRITE


def stored_once(counts: dict[str, int]) -> bool:
    """A held webhook's answer: its one message stored, by the try that answered or by an
    earlier one. A try given up on at `REDIS_TIMEOUT_S` is dropped with its connection while
    Redis still pauses, unless a loaded machine closed that connection only after the pause
    ended: Redis then ran it, and the try that answers finds the message there (a duplicate).
    Either way it is stored once (the test's `ids` check) and the answer is 200."""
    return counts in ({"stored": 1, "duplicates": 0}, {"stored": 0, "duplicates": 1})


@contextmanager
def took(limits: tuple[float, float]) -> Iterator[None]:
    """The block took between `limits` seconds."""
    started = time.monotonic()
    yield
    elapsed = time.monotonic() - started
    assert limits[0] <= elapsed <= limits[1], elapsed


async def ids(redis: Redis, tenant: str = TENANT) -> list[str]:
    return [e["id"] for e in await inbox(redis, tenant)]


# --- what a webhook gets ------------------------------------------------------------------------


async def test_a_signed_post_is_stored_then_a_repeat_is_a_duplicate_both_served_directly(
    served: Served, redis: Redis
) -> None:
    data = request(text_body("wamid.direct1"))
    first = await served.post(data)
    assert first.counts == {"stored": 1, "duplicates": 0}
    # uvicorn's own default headers lead, as on any answer it writes; then the counts.
    names = [line.split(b":")[0] for line in first.head.split(b"\r\n")[1:-2]]
    assert names == [b"date", b"server", b"content-length", b"x-stored", b"x-duplicates"]
    assert first.headers["server"] == "uvicorn"
    assert first.head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert await ids(redis) == ["wamid.direct1"]

    again = await served.post(data)
    assert again.counts == {"stored": 0, "duplicates": 1}
    assert await ids(redis) == ["wamid.direct1"]
    assert served.asgi == []  # neither went through the ASGI app


async def test_fifty_sequential_posts_on_one_keep_alive_connection_are_each_stored(
    served: Served, redis: Redis
) -> None:
    async with served.connect() as connection:
        for n in range(50):
            answer = await connection.post(request(text_body(f"wamid.seq{n}")))
            assert answer.counts == {"stored": 1, "duplicates": 0}, n
            assert "connection" not in answer.headers
    assert await ids(redis) == [f"wamid.seq{n}" for n in range(50)]
    assert served.asgi == []
    assert served.server.server_state.total_requests == 50


async def test_three_pipelined_posts_get_three_answers_in_order_each_stored_once(
    served: Served, redis: Redis
) -> None:
    """Told apart by their counts: the n-th request carries n new messages."""
    bodies = [text_body(*(f"wamid.pipe{n}.{i}" for i in range(n))) for n in (1, 2, 3)]
    async with served.connect() as connection:
        await connection.send(b"".join(request(body) for body in bodies))
        answers = [await connection.answer() for _ in bodies]
        assert [a.counts for a in answers] == [{"stored": n, "duplicates": 0} for n in (1, 2, 3)]
        # the connection serves on after the pipeline
        again = await connection.post(request(bodies[0]))
        assert again.counts == {"stored": 0, "duplicates": 1}
    stored = await ids(redis)
    assert sorted(stored) == sorted(f"wamid.pipe{n}.{i}" for n in (1, 2, 3) for i in range(n))
    # The first went the direct way; the two queued behind it, uvicorn's way (the ASGI app).
    assert served.asgi == [URL, URL]


async def test_connection_close_is_answered_with_close_and_the_socket_is_closed(
    served: Served, redis: Redis
) -> None:
    async with served.connect() as connection:
        answer = await connection.post(
            request(text_body("wamid.close"), headers={"Connection": "close"})
        )
        assert answer.counts == {"stored": 1, "duplicates": 0}
        assert answer.headers["connection"] == "close"
        assert await connection.closed_by_server()
    assert await ids(redis) == ["wamid.close"]
    assert served.asgi == []


async def test_an_http_1_0_post_is_answered_by_the_asgi_path_and_closed(
    served: Served, redis: Redis
) -> None:
    async with served.connect() as connection:
        answer = await connection.post(request(text_body("wamid.http10"), version="1.0"))
        assert answer.counts == {"stored": 1, "duplicates": 0}
        assert answer.headers["connection"] == "close"  # 1.0 without keep-alive
        assert await connection.closed_by_server()
    assert await ids(redis) == ["wamid.http10"]
    assert served.asgi == [URL]


async def test_expect_100_continue_gets_100_then_200_from_the_asgi_path(
    served: Served, redis: Redis
) -> None:
    body = text_body("wamid.expect")
    data = request(body, headers={"Expect": "100-continue"})
    headers, _ = data.split(b"\r\n\r\n", 1)
    async with served.connect() as connection:
        await connection.send(headers + b"\r\n\r\n")  # no body until told to continue
        interim = await connection.answer()
        assert interim.head == b"HTTP/1.1 100 Continue\r\n\r\n"
        final = await connection.post(body)
        assert final.counts == {"stored": 1, "duplicates": 0}
    assert await ids(redis) == ["wamid.expect"]
    assert served.asgi == [URL]


# --- refusals -----------------------------------------------------------------------------------


async def test_unsigned_is_401_and_wrongly_signed_is_403_and_nothing_is_stored(
    served: Served, redis: Redis
) -> None:
    body = text_body("wamid.refused")
    async with served.connect() as connection:
        unsigned = await connection.post(request(body, signature=None))
        assert (unsigned.status, unsigned.body) == (401, b"missing signature")
        wrong = await connection.post(request(body, signature=WRONG))
        assert (wrong.status, wrong.body) == (403, b"forbidden")
        for answer in (unsigned, wrong):
            assert answer.headers["content-type"] == "text/plain; charset=utf-8"
            assert "connection" not in answer.headers  # a refusal keeps the connection
    assert await redis.dbsize() == 0
    assert served.asgi == []


async def test_a_chunked_body_over_the_limit_is_413_and_the_connection_serves_on(
    served: Served, redis: Redis
) -> None:
    """Refused as soon as the body crosses MAX_BODY_BYTES; the rest is read and dropped, and
    the connection stays open for the next request (as on the ASGI path)."""
    oversize = b'{"x": "' + b"y" * (2 * MAX_BODY) + b'"}'
    async with served.connect() as connection:
        answer = await connection.post(request(oversize, chunks=20))
        assert (answer.status, answer.body) == (413, b"body too large")
        assert "connection" not in answer.headers
        after = await connection.post(request(text_body("wamid.after413")))
        assert after.counts == {"stored": 1, "duplicates": 0}
    assert await ids(redis) == ["wamid.after413"]
    assert await redis.llen(Keys().deadletter) == 0
    assert served.asgi == []


async def test_a_content_length_over_the_limit_is_413_from_the_asgi_path(
    served: Served, redis: Redis
) -> None:
    async with served.connect() as connection:
        answer = await connection.post(request(b"z" * (MAX_BODY + 1)))
        assert (answer.status, answer.body) == (413, b"body too large")
        after = await connection.post(request(text_body("wamid.after")))
        assert after.counts == {"stored": 1, "duplicates": 0}
    assert await ids(redis) == ["wamid.after"]
    assert served.asgi == [URL]  # refused before its body: uvicorn's way; the next one direct


async def test_no_secret_configured_is_403_from_the_asgi_path(
    settings: Settings, redis: Redis
) -> None:
    async with serving(settings.with_overrides(whatsapp_app_secrets=())) as served:
        answer = await served.post(request(text_body("wamid.nosecret")))
        assert (answer.status, answer.body) == (403, b"forbidden")
        assert served.asgi == [URL]
    assert await redis.dbsize() == 0


async def test_a_body_that_never_completes_is_408_with_close_within_the_body_deadline(
    served: Served, redis: Redis
) -> None:
    data = request(text_body("wamid.slow"))
    async with served.connect() as connection:
        with took((BODY_TIMEOUT_S * 0.9, BODY_TIMEOUT_S * 1.25 + SLACK_S)):
            await connection.send(data[:-10])  # the last ten bytes never come
            answer = await connection.answer()
        assert (answer.status, answer.body) == (408, b"request body too slow")
        assert answer.headers["connection"] == "close"
        assert await connection.closed_by_server()
    assert await redis.dbsize() == 0
    assert served.asgi == []


async def test_a_part_valid_body_stores_the_good_message_and_dead_letters_the_body(
    served: Served, redis: Redis
) -> None:
    body = dumps(
        payload(
            (TENANT, [text_message("good1"), {"type": "text", "text": {"body": "no id"}}], []),
            (TENANT_2, [text_message("good2", person="1555")], []),
        )
    )
    answer = await served.post(request(body))
    assert answer.counts == {"stored": 2, "duplicates": 0, "deadlettered": True}
    assert answer.headers["x-deadlettered"] == "1"
    assert await ids(redis, TENANT) == ["good1"]
    assert await ids(redis, TENANT_2) == ["good2"]
    assert await deadletters(redis) == [body]
    assert served.asgi == []


# --- the same answers on both paths -------------------------------------------------------------

# Each case: the request, given a message id (each path gets its own, so neither sees the
# other's duplicates), and whether the rest of its body is held back (408).
CASES: dict[str, tuple[Callable[[str, str], bytes], bool]] = {
    "new message": (lambda path, m: request(text_body(m), path=path), False),
    "two messages": (lambda path, m: request(text_body(m, m + "b"), path=path), False),
    "unsigned": (lambda path, m: request(text_body(m), path=path, signature=None), False),
    "wrongly signed": (lambda path, m: request(text_body(m), path=path, signature=WRONG), False),
    "signed garbage": (lambda path, m: request(garbage(len(m)), path=path), False),
    "part-valid": (lambda path, m: request(part_valid(m), path=path), False),
    "chunked, over the limit": (
        lambda path, m: request(b"q" * (MAX_BODY + 500), path=path, chunks=5),
        False,
    ),
    "chunked": (lambda path, m: request(text_body(m), path=path, chunks=3), False),
    "body never completes": (lambda path, m: request(text_body(m), path=path)[:-5], True),
}


async def test_both_paths_answer_every_case_with_the_same_bytes(
    served: Served, redis: Redis
) -> None:
    """The direct path and the ASGI path (the same request to the escaped path) answer every
    case alike, byte for byte but the date; all cases at once."""

    async def both(name: str, n: int) -> tuple[str, Answer, Answer]:
        make, _ = CASES[name]
        direct, asgi = await asyncio.gather(
            served.post(make(URL, f"wamid.d{n}")), served.post(make(ESCAPED_URL, f"wamid.a{n}"))
        )
        return name, direct, asgi

    results = await asyncio.gather(*(both(name, n) for n, name in enumerate(CASES)))
    for name, direct, asgi in results:
        assert direct.dateless == asgi.dateless, name
    statuses = {name: direct.status for name, direct, _ in results}
    assert statuses == {
        "new message": 200,
        "two messages": 200,
        "unsigned": 401,
        "wrongly signed": 403,
        "signed garbage": 200,
        "part-valid": 200,
        "chunked, over the limit": 413,
        "chunked": 200,
        "body never completes": 408,
    }
    assert sorted(served.asgi) == [URL] * len(CASES)
    stored = await ids(redis)
    assert len(stored) == len(set(stored))
    assert sorted(stored) == sorted(
        [f"wamid.{p}{n}" for p in "da" for n in (0, 1, 5, 7)] + ["wamid.d1b", "wamid.a1b"]
    )


async def test_an_unexpected_error_on_the_direct_path_is_503_not_500(
    served: Served, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure inside the direct path (here a writer that is not one) is logged and answered
    503, which the provider retries; nothing is stored."""
    served.app.receiver.writer = object()  # type: ignore[assignment]
    answer = await served.post(request(text_body("wamid.broken")))
    assert (answer.status, answer.body) == (503, b"unavailable, retry later")
    assert any(r.levelno == logging.ERROR for r in caplog.records)
    assert served.asgi == []
    assert await ids(redis) == []


# --- Redis slow or gone -------------------------------------------------------------------------


async def test_a_redis_pause_shorter_than_the_hold_is_answered_200_once_redis_is_back(
    settings: Settings, own_server: RedisServer, admin: Redis
) -> None:
    config = on_own_redis(settings, own_server, redis_timeout_s=0.3, webhook_hold_s=4.0)
    async with serving(config) as served:
        # Timed from before the pause: no write can be confirmed before it ends (a lower bound
        # that holds however late a loaded machine sends the request), answered within the hold.
        with took((0.95, 4.0 + SLACK_S)):
            await pause_writes(admin, 1000)
            answer = await served.post(request(text_body("wamid.held")))
        assert stored_once(answer.counts)
        assert served.asgi == []
    assert await ids(admin) == ["wamid.held"]


async def test_redis_down_longer_than_the_hold_is_503_on_both_paths_then_a_retry_is_stored(
    settings: Settings, own_server: RedisServer
) -> None:
    config = on_own_redis(settings, own_server, redis_timeout_s=0.3, webhook_hold_s=1.0)
    body = text_body("wamid.down")
    async with serving(config) as served:
        await asyncio.to_thread(own_server.stop)
        with took((0.9, 1.0 + SLACK_S)):
            direct, asgi = await asyncio.gather(
                served.post(request(body)), served.post(request(body, path=ESCAPED_URL))
            )
        assert (direct.status, direct.body) == (503, b"unavailable, retry later")
        assert direct.dateless == asgi.dateless
        assert served.asgi == [URL]  # the escaped one

        await asyncio.to_thread(own_server.start)  # empty: nothing was acknowledged
        retry = await served.post(request(body))
        assert retry.counts == {"stored": 1, "duplicates": 0}
    check = Redis.from_url(own_server.url)
    try:
        assert await ids(check) == ["wamid.down"]
    finally:
        await check.aclose()


async def test_a_chatwoot_webhook_held_past_the_hold_is_500(
    settings: Settings, own_server: RedisServer
) -> None:
    """Chatwoot's agent bots retry a 500, not a 503: its unavailable status, as on the ASGI
    path."""
    config = on_own_redis(settings, own_server, redis_timeout_s=0.3, webhook_hold_s=0.5)
    body = orjson.dumps(message_created(message_id=9401, content="hola", conversation=42))
    headers = chatwoot_headers(body, CHATWOOT_SECRET)
    async with serving(config) as served:
        await asyncio.to_thread(own_server.stop)
        answer = await served.post(
            request(body, path=CHATWOOT_URL, signature=None, headers=headers)
        )
        assert (answer.status, answer.body) == (500, b"unavailable, retry later")
        assert served.asgi == []


async def test_a_client_gone_before_its_answer_still_has_its_message_stored(
    settings: Settings, own_server: RedisServer, admin: Redis
) -> None:
    config = on_own_redis(settings, own_server, redis_timeout_s=0.3, webhook_hold_s=4.0)
    async with serving(config) as served:
        await pause_writes(admin, 800)
        async with served.connect() as connection:
            await connection.send(request(text_body("wamid.gone")))
            await asyncio.sleep(0.2)  # parsed and waiting for Redis
        # gone: the server notices, and stores the message all the same once Redis is back
        state = served.server.server_state
        await wait_until(lambda: not state.connections, 5, "the connection dropped")

        async def stored() -> bool:
            return await ids(admin) == ["wamid.gone"]

        deadline = time.monotonic() + 4.0 + SLACK_S
        while not await stored():
            assert time.monotonic() < deadline, "the message was not stored"
            await asyncio.sleep(0.05)
        # and the server serves on
        after = await served.post(request(text_body("wamid.next")))
        assert after.counts == {"stored": 1, "duplicates": 0}
        assert served.asgi == []
    assert await ids(admin) == ["wamid.gone", "wamid.next"]


@pytest.mark.parametrize(
    ("pause_ms", "hold_s", "status"),
    [(1000, 4.0, 200), (3000, 0.8, 503)],
    ids=["redis-back-within-the-hold", "hold-runs-out"],
)
async def test_a_graceful_shutdown_answers_the_held_request_before_the_server_stops(
    settings: Settings,
    own_server: RedisServer,
    admin: Redis,
    pause_ms: int,
    hold_s: float,
    status: int,
) -> None:
    config = on_own_redis(settings, own_server, redis_timeout_s=0.3, webhook_hold_s=hold_s)
    async with serving(config) as served:
        await pause_writes(admin, pause_ms)
        async with served.connect() as connection:
            await connection.send(request(text_body("wamid.shutdown")))
            await asyncio.sleep(0.2)  # parsed and held
            served.server.should_exit = True  # what SIGTERM does
            answer = await connection.answer(timeout_s=hold_s + SLACK_S + 2)
            assert answer.status == status
            assert answer.headers["connection"] == "close"  # the server is going away
            assert await connection.closed_by_server()
        assert served.asgi == []  # held and answered by the direct path
        await asyncio.wait_for(served.task, 10)  # then it stops
    await admin.client_unpause()
    if status == 200:
        assert answer.counts == {"stored": 1, "duplicates": 0}
        assert await ids(admin) == ["wamid.shutdown"]  # 200 only once stored


async def test_a_request_after_a_refusal_in_the_same_read_keeps_its_connection_until_answered(
    settings: Settings, own_server: RedisServer, admin: Redis
) -> None:
    """An unsigned POST and a signed one in one write: the 401 is answered from the parser's
    callback, before the second request is even parsed. uvicorn then arms its keep-alive timer
    (idle between requests); it must not close the connection under the second request, which
    Redis holds longer than that timer."""
    config = on_own_redis(settings, own_server, redis_timeout_s=0.3, webhook_hold_s=4.0)
    async with serving(config, timeout_keep_alive=0.5) as served:
        await pause_writes(admin, 1500)
        async with served.connect() as connection:
            unsigned = request(text_body("wamid.pair"), signature=None)
            await connection.send(unsigned + request(text_body("wamid.pair")))
            assert (await connection.answer()).status == 401
            answer = await connection.answer(timeout_s=4.0 + SLACK_S)
            assert answer.counts == {"stored": 1, "duplicates": 0}
    assert await ids(admin) == ["wamid.pair"]


# --- Chatwoot and metrics -----------------------------------------------------------------------


async def test_a_chatwoot_webhook_is_served_directly_and_stored(
    served: Served, redis: Redis
) -> None:
    body = orjson.dumps(message_created(message_id=9301, content="hola", conversation=42))
    headers = chatwoot_headers(body, CHATWOOT_SECRET)
    data = request(body, path=CHATWOOT_URL, signature=None, headers=headers)
    answer = await served.post(data)
    assert answer.counts == {"stored": 1, "duplicates": 0}
    assert await ids(redis, CHATWOOT_TENANT) == ["9301"]
    wrong = chatwoot_headers(body, "not-the-secret")
    refused = await served.post(request(body, path=CHATWOOT_URL, signature=None, headers=wrong))
    assert refused.status == 403
    assert served.asgi == []


async def test_the_webhook_metrics_count_what_the_direct_path_answered(
    limited: Settings, redis: Redis
) -> None:
    async with serving(metrics_settings(limited)) as served:
        body = text_body("wamid.metric")
        async with served.connect() as connection:
            assert (await connection.post(request(body))).status == 200
            assert (await connection.post(request(body))).counts["duplicates"] == 1
            assert (await connection.post(request(body, signature=WRONG))).status == 403
            assert (await connection.post(request(body, signature=None))).status == 401
            assert (await connection.post(request(garbage(1)))).counts["deadlettered"]
            over = request(b"q" * (2 * MAX_BODY), chunks=4)
            assert (await connection.post(over)).status == 413
        assert served.asgi == []
        async with served.http() as http:
            response = await http.get("/metrics", headers=AUTH)
        assert response.status_code == 200
        samples = parse(response.text)
    assert mine(samples, "wa_webhook_requests_total", status="200") == 3
    assert mine(samples, "wa_webhook_requests_total", status="403") == 1
    assert mine(samples, "wa_webhook_requests_total", status="401") == 1
    assert mine(samples, "wa_webhook_requests_total", status="413") == 1
    assert mine(samples, "wa_webhook_items_stored_total") == 1
    assert mine(samples, "wa_webhook_items_duplicate_total") == 1
    assert mine(samples, "wa_webhook_deadlettered_total") == 1
    assert mine(samples, "wa_webhook_request_seconds_count") == 6
    assert 0 < mine(samples, "wa_webhook_request_seconds_sum") < 10


# --- the Procfile's web line: uvloop, SIGTERM ---------------------------------------------------


async def test_the_procfile_receiver_serves_pipelines_and_answers_a_held_request_on_sigterm(
    own_server: RedisServer, admin: Redis, tmp_path: Path
) -> None:
    """Under the Procfile's web line (uvloop): a POST, three pipelined ones, then SIGTERM while
    Redis holds a request: that request is answered 200 (stored) before the process exits."""
    env = {"REDIS_TIMEOUT_S": "0.3", "WEBHOOK_HOLD_S": "4"}
    with procfile_process(own_server.url, tmp_path / "web.log", **env) as (process, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        connection = Connection(reader, writer)
        try:
            first = await connection.post(request(text_body("wamid.p0")))
            assert first.counts == {"stored": 1, "duplicates": 0}
            bodies = [text_body(*(f"wamid.p{n}.{i}" for i in range(n))) for n in (1, 2, 3)]
            await connection.send(b"".join(request(body) for body in bodies))
            answers = [(await connection.answer()).counts["stored"] for _ in bodies]
            assert answers == [1, 2, 3]

            await pause_writes(admin, 1000)
            await connection.send(request(text_body("wamid.sigterm")))
            await asyncio.sleep(0.2)  # parsed and held
            process.send_signal(signal.SIGTERM)
            held = await connection.answer(timeout_s=4.0 + SLACK_S)
            assert stored_once(held.counts)
            assert held.headers["connection"] == "close"
            assert await connection.closed_by_server()
        finally:
            await connection.close()
        # uvicorn re-raises the signal after a graceful stop
        assert await asyncio.to_thread(process.wait, 10) in (0, -signal.SIGTERM)
    log = (tmp_path / "web.log").read_text()
    assert "receiver stopped" in log and "Traceback" not in log, log
    assert sorted(await ids(admin)) == sorted(
        ["wamid.p0", "wamid.sigterm"] + [f"wamid.p{n}.{i}" for n in (1, 2, 3) for i in range(n)]
    )
