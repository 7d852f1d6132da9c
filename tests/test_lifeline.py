"""scripts/dev/lifeline.py: the trampoline that ties a child to its parent's life, then execs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.dev import lifeline
from tests.support.helpers import alive

REPO = Path(__file__).resolve().parents[1]
TRAMPOLINE = lifeline.__file__

pytestmark = pytest.mark.skipif(not lifeline.supported(), reason="PR_SET_PDEATHSIG is Linux's")


def test_the_command_is_execd_with_its_own_exit_code_and_pid() -> None:
    done = subprocess.run(
        lifeline.command(["sh", "-c", 'echo "$$"; exit 3']), capture_output=True, text=True
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.strip().isdigit()


def test_the_kernel_signals_the_child_when_its_parent_dies(tmp_path: Path) -> None:
    """A middle process starts `sleep` through the trampoline, reports its pid, is SIGKILLed."""
    pid_file = tmp_path / "pid"
    middle = (
        "import subprocess, sys, time\n"
        "from scripts.dev import lifeline\n"
        "child = subprocess.Popen(lifeline.command(['sleep', '60']))\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", middle], cwd=REPO)  # imports scripts.dev
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the middle process never started its child"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        time.sleep(0.5)  # let the trampoline arm the signal and exec sleep
        assert alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_does_not_run() -> None:
    wrong_parent = str(os.getpid())  # the trampoline's parent is the shell below, not us
    argv = [sys.executable, TRAMPOLINE, wrong_parent, "15", "--", "echo", "ran"]
    done = subprocess.run(["sh", "-c", '"$@"; exit $?', "sh", *argv], capture_output=True)
    assert done.returncode == 1 and b"ran" not in done.stdout


def test_bad_usage_is_refused() -> None:
    done = subprocess.run([sys.executable, TRAMPOLINE, "1", "15", "echo"], capture_output=True)
    assert done.returncode == 1 and b"usage: python scripts/dev/lifeline.py" in done.stderr
