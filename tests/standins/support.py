"""Helpers of the stand-in tests: a stand-in started by its executable launcher."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from scripts.standins import free_port

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
