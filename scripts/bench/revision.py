"""Benchmark another revision's product code with this checkout's benchmark.

`export(rev)` copies the product packages of a git revision into a temporary directory, and
`run_on(code, ...)` runs a benchmark module in a child Python whose `receiver`, `worker` and
`shared` come from there while `scripts` (the benchmark itself) comes from this checkout. The
child is told where the code is through the environment (`code_dir()`), and so are the worker
processes it starts. Other people edit the working tree while a benchmark runs; a revision is a
stable target, and an A/B comparison of two commits needs the same harness for both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("receiver", "worker", "shared")
CODE_ENV, DESC_ENV = "BENCH_CODE", "BENCH_CODE_DESC"


def code_dir() -> Path:
    """Where the product code under test lives: an exported revision in a child, else ROOT."""
    return Path(os.environ.get(CODE_ENV) or ROOT)


def exported() -> bool:
    """Whether this process is the child `run_on` started for an exported revision."""
    return bool(os.environ.get(CODE_ENV))


def describe() -> str:
    """One line naming the code under test, for a benchmark's report."""
    if exported():
        return os.environ.get(DESC_ENV, str(code_dir()))
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *PRODUCT],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    head = _git("rev-parse", "--short", "HEAD")
    return f"working tree at {head}" + (" with uncommitted changes" if dirty else "")


def export(rev: str) -> tuple[Path, str]:
    """The product packages of `rev` (those it has) in a new temporary directory, and a
    description of it. The caller removes the directory."""
    sha = _git("rev-parse", "--short", rev)
    present = set(_git("ls-tree", "--name-only", sha).split())
    target = Path(tempfile.mkdtemp(prefix=f"bench-code-{sha}-"))
    paths = [p for p in PRODUCT if p in present]
    archive = subprocess.run(
        ["git", "archive", sha, "--", *paths], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target, f"git {sha} (`{rev}`, exported with git archive)"


def run_on(code: Path, description: str, module: str, argv: list[str]) -> int:
    """`python -m module argv` on `code`'s product packages; returns its exit code."""
    env = {
        **os.environ,
        CODE_ENV: str(code),
        DESC_ENV: description,
        "PYTHONPATH": os.pathsep.join([str(code), str(ROOT)]),
    }
    # -P: the working directory (maybe a checkout of its own) must not shadow `code`.
    return subprocess.run([sys.executable, "-P", "-m", module, *argv], env=env).returncode


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
