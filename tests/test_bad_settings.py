"""A bad setting stops every process before it does anything: one line on stderr naming the
variable, exit code 2, no traceback. Run as real processes: the Procfile's `web` and `worker`
lines through the shell, as a platform runs them, and the operators' CLIs. A CLI that cannot
reach Redis says so in one line too (exit code 1); a worker waits for it
(tests/worker/test_startup.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import certifi
import pytest

from scripts.dev.redis_server import RedisServer, free_port
from scripts.devstack import PROCFILE, procfile_argv, read_procfile

REPO = Path(__file__).resolve().parents[1]
PROCFILE_LINES = read_procfile(PROCFILE)
COMMANDS = {
    "web": procfile_argv(PROCFILE_LINES["web"]),
    "worker": procfile_argv(PROCFILE_LINES["worker"]),
    "inspect": [sys.executable, "-m", "worker.inspect"],
    "review": [sys.executable, "-m", "worker.review", "list", "--tenant", "106500000000001"],
}


def run(command: list[str], **settings: str) -> subprocess.CompletedProcess[str]:
    env = {
        # The Procfile says `uvicorn` and `python`: this environment's.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens: none is needed
        "PORT": str(free_port()),
        "WEB_HOST": "127.0.0.1",
        **settings,
    }
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


CA_FILE = "configuration error: REDIS_TLS_CA_FILE must name a readable PEM file of CA certificates"


@pytest.mark.parametrize("process", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"LEASE_S": "2m"}, "configuration error: LEASE_S must be a number, got '2m'"),
        ({"KEY_PREFIX": "wa:x"}, "configuration error: KEY_PREFIX must be non-empty"),
        (
            {"REDIS_TLS_VERIFY": "off"},
            "configuration error: REDIS_TLS_VERIFY must be required or none, got 'off'",
        ),
        ({"REDIS_TLS_CA_FILE": "/nonexistent/ca.pem"}, f"{CA_FILE}, got '/nonexistent/ca.pem'"),
        ({"REDIS_TLS_CA_FILE": str(REPO / "README.md")}, CA_FILE),  # a file, but not PEM
        (
            {"REDIS_TLS_VERIFY": "none", "REDIS_TLS_CA_FILE": certifi.where()},  # a real bundle
            "configuration error: REDIS_TLS_CA_FILE is set but REDIS_TLS_VERIFY=none turns",
        ),
        (
            {"WEBHOOK_HOLD_S": "5"},
            "configuration error: WEBHOOK_HOLD_S must be >= 0 and < 5 (Chatwoot waits 5 s",
        ),
        (
            {"TENANTS_FILE": "/nonexistent/tenants.toml"},
            "configuration error: TENANTS_FILE '/nonexistent/tenants.toml' cannot be read",
        ),
        (  # review events are always signed: a URL alone would send them unsigned
            {"REVIEW_WEBHOOK_URL": "https://hooks.example/review"},
            "configuration error: REVIEW_WEBHOOK_URL is set but REVIEW_WEBHOOK_SECRET is not",
        ),
        (
            {"REVIEW_WEBHOOK_URL": "hooks.example/review", "REVIEW_WEBHOOK_SECRET": "s"},
            "configuration error: REVIEW_WEBHOOK_URL must be an http:// or https:// URL, got",
        ),
        (  # issue 21: `OPS_TOKEN=a` was accepted, a token one could guess in a few tries
            {"OPS_TOKEN": "a"},
            "configuration error: OPS_TOKEN must be at least 32 characters (make one: `openssl"
            " rand -hex 32`), got '***'",
        ),
    ],
    ids=[
        *("number", "rule", "tls-verify", "ca-missing", "ca-not-pem", "ca-and-none", "hold"),
        *("file", "hook-unsigned", "hook-url", "ops-token-short"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_code_2(
    process: str, settings: dict[str, str], line: str
) -> None:
    done = run(COMMANDS[process], **settings)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(line), done.stderr
    assert done.stdout == "", done.stdout


def test_a_brain_that_cannot_be_loaded_stops_the_worker_the_same_way(
    redis_server: RedisServer,
) -> None:
    # The worker loads its brain once Redis answers.
    done = run(
        COMMANDS["worker"],
        REDIS_URL=redis_server.url,
        KEY_PREFIX="badbrain",
        BRAIN="no_such_package.brain:Brain",
        LOG_LEVEL="ERROR",
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("configuration error: BRAIN='no_such_package.brain:Brain'")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("process", ["inspect", "review"])
def test_a_cli_that_cannot_reach_redis_says_so_in_one_line(process: str) -> None:
    done = run(COMMANDS[process])  # nothing listens at REDIS_URL
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: cannot"), done.stderr
    assert "Error 111 connecting" in done.stderr and done.stdout == ""  # ECONNREFUSED
