"""`scripts/run`'s dev stack as a real process: embedded Redis, Graph API and Chatwoot API
stand-ins, receiver, worker, demo bursts.

Each test runs `scripts/devstack.py` in a subprocess with its own ports and data directory, and
with none of the product's variables from the developer's shell, so the stack's dev defaults
apply (a 3 s debounce window).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from prometheus_client.parser import text_string_to_metric_families

from scripts.dev.redis_server import RedisServer, free_port
from shared.keys import Keys
from shared.ops import markers, outbound
from shared.settings import env_names
from tests.support.helpers import alive, counters, stop_process

REPO = Path(__file__).resolve().parent.parent
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
PYTHON = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable
DEVSTACK = REPO / "scripts" / "devstack.py"
# Every setting the product reads, so a developer's own values never reach the stack.
PRODUCT_VARIABLES = env_names() | {"ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"}

# What `--no-demo --workers 2` runs: the embedded Redis and each Procfile line's processes.
TWO_WORKERS_STACK = {"redis", "graph.1", "chatwoot.1", "stt.1", "web.1", "worker.1", "worker.2"}


def load_devstack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devstack", DEVSTACK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def clean_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PRODUCT_VARIABLES}
    env["NO_COLOR"] = "1"
    return env


class Stack:
    """`devstack.py` in a subprocess; its output is collected line by line by a thread."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        argv = [PYTHON, "-m", "scripts.devstack", "--data-dir", str(data_dir)]
        argv += ["--port", str(free_port()), "--redis-port", str(free_port()), *args]
        self.process = subprocess.Popen(
            argv,
            cwd=REPO,
            env=clean_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            self._new.put(line)
        self._new.put(None)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._new.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                break
            if found := re.search(pattern, line):
                return found
        pytest.fail(f"no line matching {pattern!r} in:\n{self.output}")

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"devstack still running after {timeout_s}s:\n{self.output}")
        self._reader.join(5)  # the rest of the output
        return code

    def stop(self) -> None:
        """SIGTERM (the stack stops its children and Redis), then SIGKILL as a last resort."""
        if self.process.poll() is None:
            stop_process(self.process, 20)

    def run_demo(self, timeout_s: float = 90) -> str:
        """Until the stack exits by itself (`--exit-after-demo`), which must be with 0; all it
        printed. Stopped whatever happens."""
        try:
            code = self.wait(timeout_s)
        finally:
            self.stop()
        assert code == 0, self.output
        return self.output

    def pids(self) -> dict[str, int]:
        """Every process the stack said it started, by name ("redis", "web.1", ...)."""
        found = {}
        for line in self.lines:
            if m := re.search(r"(?:started (\S+)|embedded (Redis)) .*?\(pid (\d+)\)", line):
                found[(m.group(1) or "redis").lower()] = int(m.group(3))
        return found


SUMMARY = re.compile(
    r"summary: sent (\d+) messages in (\d+) bursts \(\+(\d+) duplicate deliveries, "
    r"(\d+) statuses\); receiver stored (\d+), dropped (\d+) duplicates; Redis: (\d+) "
    r"messages in, (\d+) turns, (\d+) replies, (\d+) retries, (\d+) new review items"
)


def check_summary_against_redis(output: str, data_dir: Path, statuses: int) -> None:
    """The summary's counts are what the replies showed and what the fleet recorded in Redis
    (read back from the stopped stack's AOF)."""
    found = SUMMARY.search(output)
    assert found, output
    sent, bursts, dups, sent_statuses, stored, dropped, *fleet = map(int, found.groups())
    shown = sum(int(n) for n in re.findall(r"\[sim\] \d+ sent (\d) messages -> turn", output))
    assert (sent, bursts, sent_statuses) == (shown, 2, statuses), output
    # A status delivered again is taken in again and changes nothing (it has no dedupe
    # marker: docs/invariants.md, invariant 2); a message delivered again is dropped.
    assert dups >= 1 and stored == sent + statuses and dropped == dups, output
    with RedisServer(directory=data_dir / "redis", appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        keys = Keys()
        totals = dict.fromkeys(("messages", "turns", "replies", "retries", "review"), 0)
        for tenant in client.smembers(keys.tenants):
            if tenant.startswith(b"cw-"):  # Chatwoot's: check_chatwoot_against_redis
                continue
            k = keys.tenant(tenant.decode())
            stats = client.hgetall(k.stats)
            for name in ("messages", "turns", "replies", "retries"):
                totals[name] += int(stats.get(name.encode(), 0))
            totals["review"] += int(client.hlen(k.review))
        client.close()
    assert fleet == list(totals.values()), (fleet, totals)
    assert fleet == [sent, bursts, bursts, 0, 0], output


CHATWOOT_SUMMARY = re.compile(
    r"summary \(Chatwoot\): sent (\d+) messages in (\d+) bursts \(\+(\d+) duplicate "
    r"deliveries\); receiver stored (\d+), dropped (\d+) duplicates; the stand-in posted (\d+) "
    r"of the bot's replies back: (\d+) answered 200, (\d+) stored; Redis: (\d+) messages in, "
    r"(\d+) turns, (\d+) replies, (\d+) retries, (\d+) new review items"
)
CHATWOOT_REPLY = re.compile(
    r"\[sim\] chatwoot conversation (\d+) sent (\d) messages -> turn (\d+-\d+) -> 1 reply "
    r"\(message (\d+)\) .*: \"Got \2 messages: .*\" \(echoed back as an outgoing "
    r"message_created: 200, not stored\)$",
    re.MULTILINE,
)


def check_chatwoot_against_redis(output: str, data_dir: Path) -> None:
    """One Chatwoot burst, one turn, one reply; the reply's echo never stored (read back from
    the stopped stack's AOF, not from what the simulator says)."""
    (reply,) = CHATWOOT_REPLY.findall(output)
    conversation, count, turn, reply_id = reply
    found = CHATWOOT_SUMMARY.search(output)
    assert found, output
    sent, bursts, dups, stored, dropped, echoed, taken, echo_stored, *fleet = map(
        int, found.groups()
    )
    assert (sent, bursts, stored, echoed, taken, echo_stored) == (int(count), 1, sent, 1, 1, 0)
    assert dups == dropped == 1, output
    assert fleet == [sent, 1, 1, 0, 0], output
    with RedisServer(directory=data_dir / "redis", appendonly=True) as server:
        stats, marked, count, record = asyncio.run(_chatwoot_state(server.url, reply_id))
    # The bot's reply came back as a webhook and was not taken in: no marker, no second turn.
    assert marked == [False], output
    assert count == sent
    assert (stats.get("messages"), stats.get("turns"), stats.get("replies")) == (sent, 1, 1)
    assert record["batch"] == turn and record["person"] == conversation


async def _chatwoot_state(url: str, reply_id: str) -> tuple[dict[str, int], list[bool], int, Any]:
    """The Chatwoot tenant's counters, whether the reply's echo is marked, how many dedupe
    markers it has, the reply's outbound record."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        keys = Keys()
        assert b"cw-1-3" in await client.smembers(keys.tenants)
        k = keys.tenant("cw-1-3")
        stats = counters(await client.hgetall(k.stats))
        marked = await markers.marked(client, k, [f"chatwoot:{reply_id}"])
        (record,) = await outbound.records(client, k, [reply_id])
        return stats, marked, await markers.count(client, k), record
    finally:
        await client.aclose()


@pytest.mark.slow
def test_each_demo_burst_becomes_one_reply_through_the_graph_standin(tmp_path: Path) -> None:
    """worker -> Graph API stand-in -> signed statuses -> receiver -> worker, as in production."""
    stack = Stack(tmp_path, "--bursts", "2", "--exit-after-demo")
    output = stack.run_demo()
    assert re.search(r"devstack +\| graph +http://127\.0\.0\.1:\d+ ", output), output
    assert "sender whatsapp" in output, output
    # The reply line is printed once the worker recorded the stand-in's statuses in Redis
    # (the outbound record's status reached read).
    replies = re.findall(
        r"\[sim\] (\d+) sent (\d) messages -> turn \d+-\d+ -> 1 reply .*: \"Got \2 messages: .*\" "
        r"\(sent, delivered, read\)$",
        output,
        re.MULTILINE,
    )
    assert len(replies) == 2, output
    assert all(int(n) >= 3 for _, n in replies), output
    assert "-> 2 replies via the Graph API stand-in (2 delivered and read)" in output, output
    assert "-> 1 replies via the Chatwoot API stand-in (1 echoed back and ignored)" in output
    assert "every burst became exactly one reply" in output
    assert re.search(r"\[sim\] \d+ \(\w+\): .* delivered twice", output), "a duplicate was sent"
    assert "WARNING" not in output and "FAILED" not in output, output
    assert "stand-in answered" not in output, output
    assert list((tmp_path / "redis").rglob("appendonly*")), "the embedded Redis keeps an AOF"
    assert output.count("a late 'delivered' for reply") == 2, output
    check_summary_against_redis(output, tmp_path, statuses=2)
    # Chatwoot in the same run: the stand-in, its dev credentials in the banner, one reply.
    assert re.search(r"devstack +\| chatwoot +http://127\.0\.0\.1:\d+ ", output), output
    assert "dev CHATWOOT_API_ACCESS_TOKEN=dev-chatwoot-token, " in output, output
    assert "CHATWOOT_WEBHOOK_SECRET=dev-chatwoot-secret" in output, output
    assert "with a new X-Chatwoot-Delivery" in output, "a Chatwoot duplicate was sent"
    check_chatwoot_against_redis(output, tmp_path)
    pids = stack.pids()
    assert {"redis", "graph.1", "chatwoot.1", "web.1", "worker.1", "demo"} <= set(pids), output
    assert not [name for name, pid in pids.items() if alive(pid)], output


@pytest.mark.slow
def test_each_demo_burst_becomes_one_reply_in_the_outbox(tmp_path: Path) -> None:
    stack = Stack(
        tmp_path, "--bursts", "2", "--exit-after-demo", "--sender", "outbox", "--no-chatwoot"
    )
    output = stack.run_demo()
    assert "started graph.1" not in output and "sender outbox" in output, output
    assert "started chatwoot.1" not in output and "[sim] chatwoot" not in output, output
    replies = re.findall(r"\[sim\] (\d+) sent (\d) messages -> turn \d+-\d+ -> 1 reply", output)
    assert len(replies) == 2, output
    assert all(int(n) >= 3 for _, n in replies), output
    assert "every burst became exactly one reply" in output
    assert re.search(r"\[sim\] \d+ \(\w+\): .* delivered twice", output), "a duplicate was sent"
    assert "WARNING" not in output and "FAILED" not in output, output
    assert list((tmp_path / "redis").rglob("appendonly*")), "the embedded Redis keeps an AOF"
    check_summary_against_redis(output, tmp_path, statuses=0)
    assert not [name for name, pid in stack.pids().items() if alive(pid)], output


@pytest.mark.slow
def test_sigint_stops_children_then_redis(tmp_path: Path) -> None:
    stack = Stack(tmp_path, "--no-demo", "--workers", "2")
    try:
        stack.wait_for(r"Ctrl-C to stop")
        pids = stack.pids()
        assert set(pids) == TWO_WORKERS_STACK
        stack.process.send_signal(signal.SIGINT)
        code = stack.wait(timeout_s=30)
    finally:
        stack.stop()
    output = stack.output
    assert code == 0, output
    assert "started demo" not in output
    assert output.index(
        "stopping graph.1, chatwoot.1, stt.1, web.1, worker.1, worker.2"
    ) < output.index("stopping embedded Redis")
    assert not [name for name, pid in pids.items() if alive(pid)], output


@pytest.mark.slow
def test_a_child_that_dies_stops_the_stack(tmp_path: Path) -> None:
    stack = Stack(tmp_path, "--no-demo")
    try:
        stack.wait_for(r"Ctrl-C to stop")
        pids = stack.pids()
        os.kill(pids["worker.1"], signal.SIGKILL)
        code = stack.wait(timeout_s=30)
    finally:
        stack.stop()
    assert code != 0, stack.output
    assert "worker.1 exited unexpectedly (exit -9); stopping the stack" in stack.output
    assert not [name for name, pid in pids.items() if alive(pid)], stack.output


@pytest.mark.slow
def test_the_stack_runs_the_procfiles_lines_and_its_children_die_with_it(tmp_path: Path) -> None:
    """SIGKILL leaves the stack no chance to stop anything: the kernel must (PR_SET_PDEATHSIG)."""
    stack = Stack(tmp_path, "--no-demo", "--workers", "2")
    try:
        port = stack.wait_for(r"receiver +http://127\.0\.0\.1:(\d+) ").group(1)
        stack.wait_for(r"Ctrl-C to stop")
        pids = stack.pids()
        assert set(pids) == TWO_WORKERS_STACK
        procfile = load_devstack().read_procfile(REPO / "Procfile")
        web = procfile["web"].replace("${PORT:-8000}", port)
        web = web.replace("${WEB_HOST:-0.0.0.0}", "127.0.0.1")
        web = web.replace("${WEB_MAX_CONNECTIONS:-1000}", "1000").split()
        venv_bin = Path(PYTHON).parent
        web_cmdline = cmdline(pids["web.1"])
        assert Path(web_cmdline[1]) == venv_bin / web[0], web_cmdline  # the venv's uvicorn
        assert web_cmdline[2:] == web[1:], web_cmdline
        for name in ("worker.1", "worker.2"):
            assert cmdline(pids[name]) == procfile["worker"].split(), cmdline(pids[name])
            # `python` found first on PATH: the venv's
            path = environ(pids[name])["PATH"].split(os.pathsep)
            assert path[0] == str(venv_bin), path
        # The simulator as a load generator against the stack, checked against its Redis...
        found_url = re.search(r"redis +(redis://127\.0\.0\.1:\d+/0) ", stack.output)
        assert found_url, stack.output
        redis_url = found_url.group(1)
        load = run_simulate(
            "--url",
            f"http://127.0.0.1:{port}",
            "--rate",
            "15",
            "--duration",
            "2",
            "--seed",
            "7",
            REDIS_URL=redis_url,
        )
        assert load.returncode == 0, load.stdout + load.stderr
        found = SUMMARY.search(load.stdout)
        assert found, load.stdout
        sent, bursts, dups, statuses, stored, dropped, *fleet = map(int, found.groups())
        assert 10 <= sent <= 60 and stored == sent and dropped == dups and statuses == 0
        assert fleet == [sent, bursts, bursts, 0, 0], load.stdout
        assert re.search(r"^\[sim\] +1s +sent \d+ ", load.stdout, re.MULTILINE), load.stdout
        client = redis.Redis.from_url(redis_url)
        turns = sum(
            int(client.hget(Keys().tenant(t.decode()).stats, "turns") or 0)
            for t in client.smembers(Keys().tenants)
        )
        client.close()
        assert turns == bursts, (turns, load.stdout)
        # /metrics of the live receiver moved with that traffic (fleet figures from Redis).
        metrics = scrape(f"http://127.0.0.1:{port}/metrics")
        # (stored: our messages, plus the stand-in's status webhooks for the replies)
        assert metrics["wa_webhook_items_stored_total"] >= sent, metrics
        assert metrics["wa_webhook_items_duplicate_total"] == dups, metrics
        assert metrics["wa_messages_total"] == sent and metrics["wa_turns_total"] == bursts
        assert metrics["wa_dispatch_lag_seconds_count"] == bursts, metrics
        # The receiver and the workers write text for a person (LOG_FORMAT=text), a level first
        # and without a date (the console's prefix has the time), none with message text.
        product = [
            line.split("| ", 1)[1]
            for line in stack.lines
            if re.match(r"\S+ (web|worker)\.\d+ +\| ", line)
        ]
        levels = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL)[: ]")
        assert product and all(levels.match(line) for line in product), stack.output
        starting = [line for line in product if " starting: " in line]
        assert len(starting) == 3 and all(len(line) < 200 for line in starting), starting
        texts = ("una consulta", "tienen turno", "a la tarde", "gracias!")
        assert not [line for line in product if any(t in line for t in texts)], stack.output
        # ...then the stack dies without a chance to stop anything.
        os.kill(stack.process.pid, signal.SIGKILL)
        stack.wait(timeout_s=10)
        deadline = time.monotonic() + 30
        while [pid for pid in pids.values() if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = [name for name, pid in pids.items() if alive(pid)]
    finally:
        stack.stop()
        for pid in stack.pids().values():  # never leave one behind if the test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not survivors, stack.output


def test_a_procfile_without_a_worker_line_is_refused_by_name(tmp_path: Path) -> None:
    devstack = load_devstack()
    procfile = tmp_path / "Procfile"
    procfile.write_text("# comment\n\nweb: uvicorn receiver.app:create_app --factory\n")
    with pytest.raises(devstack.ProcfileError, match="no 'worker:' line"):
        devstack.read_procfile(procfile)
    procfile.write_text("web uvicorn receiver.app:create_app --factory\nworker: python -m worker\n")
    with pytest.raises(devstack.ProcfileError, match=r"Procfile:1: not a 'name: command' line"):
        devstack.read_procfile(procfile)
    procfile.write_text(
        "web: uvicorn receiver.app:create_app --factory\nworker:  python -m worker  \n"
    )
    assert devstack.read_procfile(procfile) == {
        "web": "uvicorn receiver.app:create_app --factory",
        "worker": "python -m worker",
    }


def scrape(url: str) -> dict[str, float]:
    """Each sample of a Prometheus text page, summed over its labels (all tenants)."""
    totals: dict[str, float] = {}
    page = httpx.get(url, timeout=10, headers={"Authorization": "Bearer dev-metrics"})
    for family in text_string_to_metric_families(page.text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def run_simulate(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = clean_environment()
    env.update({"WHATSAPP_APP_SECRET": "dev-secret", **variables})
    return subprocess.run(
        [PYTHON, "-m", "scripts.simulate", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_the_simulator_refuses_other_hosts_and_unbounded_load() -> None:
    for args, problem in (
        (["--url", "http://10.0.0.5:8000"], "only 127.0.0.1 is allowed"),
        (["--redis-url", "redis://redis.example.com:6379/0"], "only 127.0.0.1 is allowed"),
        (["--rate", "10"], "--rate and --duration go together"),
        (["--rate", "100000", "--duration", "5"], "--rate must be more than 0"),
        (["--rate", "10", "--duration", "86400"], "--duration must be more than 0"),
        (["--rate", "10", "--duration", "5", "--bursts", "2"], "drop it with --rate"),
        (["--chatwoot-url", "http://chatwoot.example.com"], "only 127.0.0.1 is allowed"),
        (["--provider", "chatwoot"], "--provider chatwoot needs --chatwoot-url"),
        (["--provider", "both"], "--provider both needs --chatwoot-url"),
        (["--provider", "slack"], "invalid choice: 'slack'"),
        (
            ["--chatwoot-url", "http://127.0.0.1:9", "--rate", "10", "--duration", "5"],
            "the load generator (--rate) sends WhatsApp traffic only",
        ),
    ):
        done = run_simulate(*args)
        assert done.returncode == 2 and problem in done.stderr, (args, done.stderr)


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def test_dev_defaults_never_override_the_users_settings() -> None:
    devstack = load_devstack()
    user = {"DEBOUNCE_WINDOW_S": "20", "LEASE_S": "6", "WHATSAPP_APP_SECRET": "mine"}
    env = devstack.dev_environment(user, "redis://127.0.0.1:7000/0", 9000)
    assert env["DEBOUNCE_WINDOW_S"] == "20"
    assert env["WHATSAPP_APP_SECRET"] == "mine"
    assert env["WHATSAPP_VERIFY_TOKEN"] == "dev-verify"
    assert env["MAX_WAIT_S"] == "20"  # never shorter than the user's window
    assert env["LEASE_RENEW_S"] == "2"  # renewed well within the user's lease
    assert (env["REDIS_URL"], env["PORT"]) == ("redis://127.0.0.1:7000/0", "9000")
    assert env["LOG_FORMAT"] == "text"  # for a person to read...
    json_logs = devstack.dev_environment({"LOG_FORMAT": "json"}, "redis://127.0.0.1:7000/0", 9000)
    assert json_logs["LOG_FORMAT"] == "json"  # ...unless the user asked for production's


def test_the_graph_standin_stands_in_for_what_the_user_left_unset() -> None:
    devstack = load_devstack()
    standin = "http://127.0.0.1:9100"
    env = devstack.dev_environment({}, "redis://127.0.0.1:7000/0", 9000, standin, "standin")
    assert env["WHATSAPP_API_BASE_URL"] == standin
    assert env["WHATSAPP_ACCESS_TOKEN"] == devstack.DEV_GRAPH_TOKEN
    assert env["SENDER"] == "whatsapp"
    mine = {"WHATSAPP_ACCESS_TOKEN": "mine", "SENDER": "whatsapp"}
    env = devstack.dev_environment(mine, "redis://127.0.0.1:7000/0", 9000, standin, "standin")
    assert env["WHATSAPP_ACCESS_TOKEN"] == "mine"
    env = devstack.dev_environment({}, "redis://127.0.0.1:7000/0", 9000, None, "outbox")
    assert env["SENDER"] == "outbox" and "WHATSAPP_ACCESS_TOKEN" not in env


def test_the_chatwoot_standin_stands_in_for_what_the_user_left_unset() -> None:
    devstack = load_devstack()
    standin = "http://127.0.0.1:9200"
    env = devstack.dev_environment({}, "redis://127.0.0.1:7000/0", 9000, None, "env", standin)
    assert env["CHATWOOT_BASE_URL"] == standin
    assert env["CHATWOOT_API_ACCESS_TOKEN"] == devstack.DEV_CHATWOOT_TOKEN
    assert env["CHATWOOT_WEBHOOK_SECRET"] == devstack.DEV_CHATWOOT_SECRET
    mine = {"CHATWOOT_WEBHOOK_SECRET": "s1", "CHATWOOT_API_ACCESS_TOKEN": "t1"}
    env = devstack.dev_environment(mine, "redis://127.0.0.1:7000/0", 9000, None, "env", standin)
    assert (env["CHATWOOT_WEBHOOK_SECRET"], env["CHATWOOT_API_ACCESS_TOKEN"]) == ("s1", "t1")
    # A URL token of the user's: no dev secret beside it (the stand-in then sends the token).
    token = {"CHATWOOT_WEBHOOK_TOKEN": "tok"}
    env = devstack.dev_environment(token, "redis://127.0.0.1:7000/0", 9000, None, "env", standin)
    assert "CHATWOOT_WEBHOOK_SECRET" not in env
    env = devstack.dev_environment({}, "redis://127.0.0.1:7000/0", 9000)
    assert not [name for name in env if name.startswith("CHATWOOT_")]
    assert devstack.parse_options([], {}).chatwoot_standin
    assert not devstack.parse_options(["--no-chatwoot"], {}).chatwoot_standin
    for own in ("CHATWOOT_API_ACCESS_TOKEN", "CHATWOOT_BASE_URL"):
        assert not devstack.parse_options([], {own: "x"}).chatwoot_standin


def test_the_speech_to_text_standin_transcribes_unless_the_user_set_a_transcriber() -> None:
    devstack = load_devstack()
    standin = "http://127.0.0.1:9300"
    redis_url = "redis://127.0.0.1:7000/0"
    env = devstack.dev_environment({}, redis_url, 9000, None, "env", None, standin)
    assert env["TRANSCRIBE_BASE_URL"] == f"{standin}/v1"
    assert env["TRANSCRIBE_API_KEY"] == devstack.DEV_TRANSCRIBE_KEY
    mine = {"TRANSCRIBE_BASE_URL": "https://api.groq.com/openai/v1", "TRANSCRIBE_API_KEY": "k"}
    env = devstack.dev_environment(mine, redis_url, 9000, None, "env", None, standin)
    assert (env["TRANSCRIBE_BASE_URL"], env["TRANSCRIBE_API_KEY"]) == tuple(mine.values())
    env = devstack.dev_environment({}, redis_url, 9000)
    assert "TRANSCRIBE_BASE_URL" not in env


def test_the_standin_is_the_default_sender_without_the_users_own() -> None:
    devstack = load_devstack()
    assert devstack.parse_options([], {}).sender == "standin"
    assert devstack.parse_options([], {"SENDER": "whatsapp"}).sender == "standin"
    assert devstack.parse_options(["--sender", "outbox"], {}).sender == "outbox"
    assert devstack.parse_options([], {"WHATSAPP_ACCESS_TOKEN": "t"}).sender == "env"
    assert devstack.parse_options([], {"WHATSAPP_API_BASE_URL": "http://x"}).sender == "env"
    assert devstack.parse_options([], {"SENDER": "outbox"}).sender == "env"
    with pytest.raises(SystemExit):
        devstack.parse_options(["--sender", "standin"], {"WHATSAPP_API_BASE_URL": "http://x"})


def test_demo_is_on_without_credentials_only() -> None:
    devstack = load_devstack()
    assert devstack.parse_options([], {}).demo
    assert not devstack.parse_options([], {"ANTHROPIC_API_KEY": "k"}).demo
    assert not devstack.parse_options([], {"WHATSAPP_ACCESS_TOKEN": "t"}).demo
    assert devstack.parse_options(["--demo"], {"ANTHROPIC_API_KEY": "k"}).demo
    assert not devstack.parse_options(["--no-demo"], {}).demo
