"""The real server process (`uvicorn receiver.app:create_app --factory`, as the Procfile runs
it) over real HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer, free_port
from tests.receiver.support import (
    MAX_BODY,
    TENANT,
    URL,
    Uvicorn,
    counts,
    dumps,
    inbox,
    payload,
    text_message,
)
from tests.support.helpers import VERIFY_TOKEN, fixture_bytes, sign


@pytest.fixture(scope="module")
def server(redis_server: RedisServer) -> Iterator[Uvicorn]:
    process = Uvicorn(redis_server.url)
    try:
        yield process
    finally:
        process.terminate()


@pytest.fixture
async def http(server: Uvicorn, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


async def signed_post(client: httpx.AsyncClient, body: bytes) -> httpx.Response:
    return await client.post(URL, content=body, headers={"X-Hub-Signature-256": sign(body)})


async def test_five_concurrent_deliveries_one_item(http: httpx.AsyncClient, redis: Redis) -> None:
    body = fixture_bytes("whatsapp/burst_one_post.json")
    responses = await asyncio.gather(*(signed_post(http, body) for _ in range(5)))
    assert [r.status_code for r in responses] == [200] * 5
    assert sum(counts(r)["stored"] for r in responses) == 3
    assert [e["id"] for e in await inbox(redis)] == [
        "wamid.FIXTURE0002",
        "wamid.FIXTURE0003",
        "wamid.FIXTURE0004",
    ]


async def test_many_concurrent_requests_each_confirmed(
    http: httpx.AsyncClient, redis: Redis
) -> None:
    bodies = [dumps(payload((TENANT, [text_message(f"w{i}")], []))) for i in range(200)]
    responses = await asyncio.gather(*(signed_post(http, b) for b in bodies))
    assert all(counts(r) == {"stored": 1, "duplicates": 0} for r in responses)
    assert sorted(e["id"] for e in await inbox(redis)) == sorted(f"w{i}" for i in range(200))


async def test_handshake_and_signature_over_http(http: httpx.AsyncClient, redis: Redis) -> None:
    params = {"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "42"}
    assert (await http.get(URL, params=params)).text == "42"
    body = fixture_bytes("whatsapp/text.json")
    assert (await http.post(URL, content=body)).status_code == 401
    bad = {"X-Hub-Signature-256": sign(body, "nope")}
    assert (await http.post(URL, content=body, headers=bad)).status_code == 403
    assert await redis.dbsize() == 0


async def test_oversize_over_http(http: httpx.AsyncClient, redis: Redis) -> None:
    body = b"{" + b" " * MAX_BODY
    headers = {"X-Hub-Signature-256": sign(body)}
    assert (await http.post(URL, content=body, headers=headers)).status_code == 413

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY // 1024 + 8):
            yield b" " * 1024

    response = await http.post(URL, content=chunks(), headers={"X-Hub-Signature-256": "sha256=00"})
    assert response.status_code == 413
    assert await redis.dbsize() == 0


def test_starts_without_redis_and_stops_cleanly() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    process = Uvicorn(dead, WHATSAPP_APP_SECRET="")
    try:
        assert httpx.get(f"{process.url}/healthz").status_code == 200
        assert httpx.get(f"{process.url}/readyz").status_code == 503
        body = fixture_bytes("whatsapp/text.json")
        response = httpx.post(
            f"{process.url}{URL}", content=body, headers={"X-Hub-Signature-256": sign(body)}
        )
        assert response.status_code == 403  # no secret configured: refused, never accepted
    finally:
        code, output = process.terminate()
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a graceful stop
    assert "WHATSAPP_APP_SECRET is not set" in output
    assert "receiver stopped" in output
    assert "Traceback" not in output
    # Every line is one JSON object, uvicorn's own ("Started server process", ...) included.
    ours = [json.loads(line) for line in output.splitlines()]
    assert any(line["logger"] == "uvicorn.error" for line in ours), output
    assert not [line for line in ours if "color_message" in line], output
    assert any(line["level"] == "WARNING" and "WHATSAPP_APP_SECRET" in line["msg"] for line in ours)
    (last_of_ours,) = [line for line in ours if line["logger"] == "receiver.app"][-1:]
    assert last_of_ours["msg"] == "receiver stopped", output
    assert ours[-1]["msg"].startswith("Finished server process"), output


@pytest.mark.parametrize("access_log", [False, True])
def test_uvicorns_access_log_flag_holds_under_our_json_logging(
    redis_server: RedisServer, access_log: bool
) -> None:
    """`--no-access-log` (the Procfile's) means no line per request, though every other uvicorn
    logger is routed through our JSON handler; without the flag, access lines are JSON too,
    webhook POSTs' included (the protocol then leaves them to uvicorn's own path)."""
    process = Uvicorn(redis_server.url, access_log=access_log)
    try:
        for n in range(3):
            assert httpx.get(f"{process.url}/healthz").status_code == 200
            body = dumps(payload((TENANT, [text_message(f"wamid.logged{access_log}{n}")], [])))
            signature = {"X-Hub-Signature-256": sign(body)}
            answer = httpx.post(f"{process.url}{URL}", content=body, headers=signature)
            assert counts(answer) == {"stored": 1, "duplicates": 0}
    finally:
        code, output = process.terminate()
    assert code in (0, -signal.SIGTERM)
    lines = [json.loads(line) for line in output.splitlines()]
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any(line["logger"] == "uvicorn.error" for line in lines), output
    if access_log:
        messages = [line["msg"] for line in access]
        assert sum("GET /healthz" in m for m in messages) >= 3, output
        assert sum(f"POST {URL}" in m for m in messages) == 3, output
    else:
        assert access == [], output
