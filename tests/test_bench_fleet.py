"""`scripts/bench_fleet` at toy sizes: every reply arrives, every webhook is answered 200, and
the report names each run, so the benchmark cannot rot unnoticed between real runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_a_tiny_fleet_benchmark_runs_end_to_end_on_one_redis_and_on_the_cluster() -> None:
    command = [str(REPO / "scripts" / "bench_fleet"), "--only", "scaling"]
    command += ["--shapes", "1x1", "--messages", "60", "--connections", "4"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^\| (single|cluster) 1r 1w \| ([\d,]+) \|", done.stdout, re.MULTILINE)
    assert [name for name, _ in rows] == ["single", "cluster"], done.stdout
    assert all(int(rate.replace(",", "")) > 0 for _, rate in rows)
    assert "Non-200 answers over every run: 0." in done.stdout
