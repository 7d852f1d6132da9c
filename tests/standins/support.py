"""Helpers of the stand-in tests: a stand-in started by its executable launcher, the real
anthropic SDK pointed at the Messages API stand-in, and a process stopped politely."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import anthropic
import httpx

from scripts.standins import MessagesApiStandIn, free_port
from tests.support.helpers import API_KEY

REPO = Path(__file__).resolve().parents[2]


def launch(name: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [str(REPO / "scripts" / name), "--port", str(port), "--log-level", "warning", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            if httpx.get(url + "/_health", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"{name} did not start: {err.decode()[-2000:]}")
        time.sleep(0.05)


def sdk_client(ai: MessagesApiStandIn) -> anthropic.AsyncAnthropic:
    """The real SDK on the stand-in, without retries of its own: a test sees every answer."""
    return anthropic.AsyncAnthropic(base_url=ai.url, api_key=API_KEY, max_retries=0, timeout=5.0)
