"""Redis over TLS, as Heroku Redis serves it: TLS only, a self-signed certificate, a password.

Against a real `redis-server` started with TLS (`redis_tls`, tests/support/fixtures.py): with
`REDIS_TLS_VERIFY=none` the receiver (the Procfile's `web` line), a worker (`python -m worker`)
and the CLIs work over `rediss://`; with the default (`required`) the same server is refused
with a line that names the settings (readyz 503, the worker keeps retrying, the CLI exits 1);
with `REDIS_TLS_CA_FILE` naming the certificate it is accepted again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scripts.dev.redis_server import RedisServer, free_port, self_signed_certificate
from scripts.devstack import PROCFILE, procfile_argv, read_procfile
from shared.settings import Settings
from shared.storage.redis_client import explain, make_redis
from tests.receiver.support import TENANT, dumps, payload, text_message
from tests.support.fixtures import TLS_PASSWORD, TlsRedis
from tests.support.helpers import APP_SECRET, sign, stop_process
from tests.worker.support import WorkerFleet, outbox, run_module, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
UNTRUSTED = "CERTIFICATE_VERIFY_FAILED"
HINT = "REDIS_TLS_VERIFY=none"


@pytest.fixture
def prefix() -> str:
    return f"tls{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def tls_client(redis_tls: TlsRedis) -> AsyncIterator[Redis]:
    client = redis_tls.client()
    try:
        yield client
    finally:
        await client.aclose()


def settings_for(redis_tls: TlsRedis, verify: str, **env: str) -> Settings:
    return Settings.from_env({**redis_tls.env(verify), "REDIS_TIMEOUT_S": "2", **env})


async def ping(settings: Settings) -> bool:
    client = make_redis(settings)
    try:
        return bool(await client.ping())
    finally:
        await client.aclose()


# --- the server is what Heroku's is -------------------------------------------------------------
async def test_the_server_speaks_only_tls_and_wants_its_password(redis_tls: TlsRedis) -> None:
    plain = Redis.from_url(redis_tls.url.replace("rediss://", "redis://"), socket_timeout=2)
    nameless = Redis.from_url(redis_tls.url.replace(f":{TLS_PASSWORD}@", ""), ssl_cert_reqs="none")
    try:
        with pytest.raises((ConnectionError, RedisTimeoutError)):  # no plain answer, ever
            await plain.ping()
        with pytest.raises((AuthenticationError, ResponseError), match=r"(?i)auth"):
            await nameless.ping()
    finally:
        await plain.aclose()
        await nameless.aclose()


# --- the client: what each setting accepts ------------------------------------------------------
async def test_verify_none_accepts_the_self_signed_certificate(redis_tls: TlsRedis) -> None:
    assert await ping(settings_for(redis_tls, "none"))


async def test_the_default_refuses_it_with_a_line_that_names_the_settings(
    redis_tls: TlsRedis,
) -> None:
    settings = settings_for(redis_tls, "required")
    assert settings.redis_tls_verify == "required" and not settings.redis_tls_ca_file
    with pytest.raises(ConnectionError) as refused:
        await ping(settings)
    line = explain(refused.value)
    assert UNTRUSTED in line and HINT in line and "REDIS_TLS_CA_FILE" in line


async def test_the_certificate_as_ca_file_is_accepted(redis_tls: TlsRedis) -> None:
    assert await ping(settings_for(redis_tls, "ca_file"))
    by_name = redis_tls.url.replace("127.0.0.1", "localhost")  # the certificate names both
    assert await ping(settings_for(redis_tls, "ca_file", REDIS_URL=by_name))


async def test_a_trusted_certificate_for_another_host_is_refused(tmp_path: Path) -> None:
    files = self_signed_certificate(tmp_path / "tls", hosts=("localhost",))
    with RedisServer(tls=files, password=TLS_PASSWORD) as server:
        env = {"REDIS_URL": server.url, "REDIS_TLS_CA_FILE": str(files.ca_file)}
        with pytest.raises(ConnectionError, match=r"(?i)mismatch|doesn't match"):
            await ping(Settings.from_env(env))  # 127.0.0.1 is not in the certificate
        by_name = {**env, "REDIS_URL": server.url.replace("127.0.0.1", "localhost")}
        assert await ping(Settings.from_env(by_name))


# --- the receiver: the Procfile's web line ------------------------------------------------------
@contextmanager
def web(env: dict[str, str], log: Path) -> Iterator[str]:
    """The Procfile's `web` line as a platform runs it; its base URL once /healthz answers."""
    port = free_port()
    full_env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PORT": str(port),
        "WEB_HOST": "127.0.0.1",
        "WHATSAPP_APP_SECRET": APP_SECRET,
        "REDIS_TIMEOUT_S": "1",
        **env,
    }
    command = procfile_argv(read_procfile(PROCFILE)["web"])
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the receiver did not come up: {log.read_text()}"
            time.sleep(0.1)
        yield url
    finally:
        stop_process(process, 10)


def webhook(message_id: str, person: str = "5491155550070") -> bytes:
    """A text message written now (an old one would go to review, unanswered)."""
    message = {**text_message(message_id, person), "timestamp": str(int(time.time()))}
    return dumps(payload((TENANT, [message], [])))


async def readyz(url: str) -> int:
    async with httpx.AsyncClient(timeout=10) as http:
        return (await http.get(f"{url}/readyz")).status_code


async def post(url: str, body: bytes) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(
            f"{url}/webhooks/whatsapp",
            content=body,
            headers={"X-Hub-Signature-256": sign(body), "Content-Type": "application/json"},
        )


async def test_a_webhook_becomes_a_reply_over_tls_with_verify_none(
    redis_tls: TlsRedis, tls_client: Redis, prefix: str, tmp_path: Path
) -> None:
    env = {**redis_tls.env("none"), "KEY_PREFIX": prefix}
    fleet = WorkerFleet(tls_client, redis_tls.url, prefix, tmp_path)
    try:
        await fleet.start(1, BRAIN="echo", REDIS_TLS_VERIFY="none")
        with web(env, tmp_path / "web.log") as url:
            assert (await readyz(url)) == 200
            response = await post(url, webhook("wamid.tls1"))
            assert (response.status_code, response.headers["x-stored"]) == (200, "1")
            (reply,) = await wait_for(
                lambda: outbox(tls_client, prefix, TENANT), "the reply", timeout_s=20
            )
        assert reply["message_ids"] == ["wamid.tls1"]
        assert "Traceback" not in fleet.dump() + (tmp_path / "web.log").read_text()
    finally:
        fleet.close()
        print(fleet.dump())


async def test_the_receiver_refuses_an_untrusted_certificate_until_given_the_ca_file(
    redis_tls: TlsRedis, tls_client: Redis, prefix: str, tmp_path: Path
) -> None:
    refusing = {**redis_tls.env("required"), "KEY_PREFIX": prefix, "WEBHOOK_HOLD_S": "0.5"}
    log = tmp_path / "refusing.log"
    with web(refusing, log) as url:
        assert (await readyz(url)) == 503
        assert (await post(url, webhook("wamid.tls2"))).status_code == 503  # WhatsApp retries
    lines = [line for line in log.read_text().splitlines() if UNTRUSTED in line]
    assert lines and all(HINT in line for line in lines), log.read_text()
    assert "Traceback" not in log.read_text()

    trusting = {**redis_tls.env("ca_file"), "KEY_PREFIX": prefix}
    with web(trusting, tmp_path / "trusting.log") as url:
        assert (await readyz(url)) == 200
        response = await post(url, webhook("wamid.tls2"))
        assert (response.status_code, response.headers["x-stored"]) == (200, "1")


# --- the worker ----------------------------------------------------------------------------------
async def test_a_worker_refuses_an_untrusted_certificate_and_keeps_retrying(
    redis_tls: TlsRedis, tls_client: Redis, prefix: str, tmp_path: Path
) -> None:
    fleet = WorkerFleet(tls_client, redis_tls.url, prefix, tmp_path)
    try:
        refusing = fleet.launch(REDIS_TLS_VERIFY="required")

        def refusals() -> list[str]:
            return [line for line in fleet.dump().splitlines() if UNTRUSTED in line]

        async def retried() -> bool:
            assert refusing.poll() is None, fleet.dump()
            return len(refusals()) >= 2

        await wait_for(retried, "two logged attempts", timeout_s=20)
        assert all(
            "redis not reachable at start-up" in line and HINT in line for line in refusals()
        )
        fleet.launch(REDIS_TLS_CA_FILE=redis_tls.ca_file)
        await fleet.wait_listening(1)  # the second worker: the first still cannot connect
        assert refusing.poll() is None  # still waiting, not crashed
        assert "Traceback" not in fleet.dump()
    finally:
        fleet.close()
        print(fleet.dump())


# --- the CLIs -----------------------------------------------------------------------------------
def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_module(*args, env={"PATH": os.environ.get("PATH", ""), **env}, timeout_s=60)


@pytest.mark.parametrize(
    "args",
    [["worker.inspect"], ["worker.review", "list", "--tenant", TENANT]],
    ids=["inspect", "review"],
)
def test_the_clis_work_over_tls_and_refuse_an_untrusted_certificate_in_one_line(
    redis_tls: TlsRedis, prefix: str, args: list[str]
) -> None:
    for verify in ("none", "ca_file"):
        done = cli(args, {**redis_tls.env(verify), "KEY_PREFIX": prefix})
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert done.stdout
    done = cli(args, {**redis_tls.env("required"), "KEY_PREFIX": prefix})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: cannot"), done.stderr
    assert UNTRUSTED in done.stderr and HINT in done.stderr
    assert TLS_PASSWORD not in done.stderr  # the URL is shown masked
