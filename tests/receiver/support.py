"""Helpers of the receiver tests, used by other directories too: the app running in-process,
the real server process (`Uvicorn`), signed posts, webhook bodies as Meta shapes them, and
readers of what the receiver stored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis
from starlette.applications import Starlette

from receiver.app import create_app
from receiver.http_protocol import UVICORN_HTTP
from scripts.dev.redis_server import free_port
from scripts.devstack import PROCFILE, procfile_argv, read_procfile
from shared.events import decode
from shared.keys import Keys
from shared.settings import Settings
from tests.support.helpers import APP_SECRET, VERIFY_TOKEN, sign

URL = "/webhooks/whatsapp"
TENANT = "106500000000001"
TENANT_2 = "106500000000002"


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app of `settings` with its lifespan started, and a client talking to it in-process."""
    app: Starlette = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
            yield client


async def post(
    client: httpx.AsyncClient, body: bytes, signature: str | None = "sign", **headers: str
) -> httpx.Response:
    """POST `body`, signed with the test secret unless `signature` is given (None: unsigned)."""
    if signature == "sign":
        signature = sign(body)
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    headers.setdefault("Content-Type", "application/json")
    return await client.post(URL, content=body, headers=headers)


def dumps(payload: Any) -> bytes:
    return orjson.dumps(payload)


async def inbox(redis: Redis, tenant: str = TENANT) -> list[dict[str, Any]]:
    """The tenant's inbox in arrival order (the receiver LPUSHes, so the list is reversed)."""
    raw = await redis.lrange(Keys().tenant(tenant).inbox, 0, -1)
    return [decode(item) for item in reversed(raw)]


async def deadletters(redis: Redis) -> list[bytes]:
    return list(reversed(await redis.lrange(Keys().deadletter, 0, -1)))


def text_message(message_id: str, person: str = "5491155550001", body: str = "hola") -> Any:
    return {
        "from": person,
        "id": message_id,
        "timestamp": "1764421200",
        "type": "text",
        "text": {"body": body},
    }


def payload(*changes: tuple[str, list[Any], list[Any]]) -> dict[str, Any]:
    """A webhook body with one entry per (tenant, messages, statuses)."""
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": f"waba-{tenant}",
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {"display_phone_number": "1555", "phone_number_id": tenant},
                            "messages": messages,
                            "statuses": statuses,
                        },
                    }
                ],
            }
            for tenant, messages, statuses in changes
        ],
    }


def counts(response: httpx.Response) -> dict[str, Any]:
    """What a 200 webhook answer reports, from its headers (the body is empty)."""
    assert response.status_code == 200 and response.content == b""
    answer: dict[str, Any] = {
        "stored": int(response.headers["x-stored"]),
        "duplicates": int(response.headers["x-duplicates"]),
    }
    if response.headers.get("x-deadlettered"):
        answer["deadlettered"] = True
    return answer


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
        command += ["--loop", "uvloop", "--http", UVICORN_HTTP]
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


@contextmanager
def procfile_process(
    redis_url: str, log: Path, **env: str
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The Procfile's `web` line as a platform runs it (`ReceiverProtocol` on uvloop), once
    /healthz answers: the process and its port. Stopped (SIGTERM, then SIGKILL after 10 s)
    if the test left it running; its output in `log`."""
    port = free_port()
    full_env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PORT": str(port),
        "WEB_HOST": "127.0.0.1",
        "REDIS_URL": redis_url,
        "WHATSAPP_APP_SECRET": APP_SECRET,
        **env,
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            procfile_argv(read_procfile(PROCFILE)["web"]),
            cwd=PROCFILE.parent,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield process, port
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()
