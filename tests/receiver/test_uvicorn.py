"""The real server process (`uvicorn receiver.app:create_app --factory`, as the Procfile runs
it) over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer, free_port
from tests.receiver.support import TENANT, URL, counts, dumps, inbox, payload, text_message
from tests.support.helpers import APP_SECRET, VERIFY_TOKEN, fixture_bytes, sign

ROOT = Path(__file__).resolve().parents[2]
MAX_BODY = 65536


class Uvicorn:
    def __init__(self, redis_url: str, access_log: bool = False, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "REDIS_TIMEOUT_S": "0.5",
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "WHATSAPP_VERIFY_TOKEN": VERIFY_TOKEN,
            "MAX_BODY_BYTES": str(MAX_BODY),
            **env,
        }
        command = [sys.executable, "-m", "uvicorn", "receiver.app:create_app", "--factory"]
        command += ["--port", str(self.port)]
        command += ["--loop", "uvloop", "--http", "httptools"]
        if not access_log:
            command.append("--no-access-log")  # as the Procfile runs it
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env,
            # Every log line goes to stdout, one JSON object per line (uvicorn's too).
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._wait_until_up()

    def _wait_until_up(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"uvicorn exited: {self.process.stdout.read()!r}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=0.5).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("uvicorn did not come up")

    def terminate(self) -> tuple[int, str]:
        """Stop the server; its exit code and everything it printed (stdout and stderr)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            output, _ = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            output, _ = self.process.communicate()
        return self.process.returncode, output.decode(errors="replace")


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
    logger is routed through our JSON handler; without the flag, access lines are JSON too."""
    process = Uvicorn(redis_server.url, access_log=access_log)
    try:
        for _ in range(3):
            assert httpx.get(f"{process.url}/healthz").status_code == 200
    finally:
        code, output = process.terminate()
    assert code in (0, -signal.SIGTERM)
    lines = [json.loads(line) for line in output.splitlines()]
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any(line["logger"] == "uvicorn.error" for line in lines), output
    if access_log:
        assert len(access) >= 3 and all("GET /healthz" in line["msg"] for line in access), output
    else:
        assert access == [], output
