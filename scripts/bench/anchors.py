"""Anchors: BullMQ, arq and SAQ on the terms of the worker's throughput scenario.

    scripts/bench_worker --only throughput --anchors all     # beside the project, same run
    scripts/bench_anchors --n 30000                          # the anchors alone

Each anchor is a program in scripts/bench/anchors/ (bullmq_bench.mjs, arq_bench.py,
saq_bench.py) run as its own process against a private Redis (`RedisServer`, as the project's
runs): it enqueues N one-message jobs (not timed), starts one worker with the given
concurrency and a no-op handler, times from the worker's start until the library has recorded
the N-th completion, and prints one JSON line (jobs/s, its own CPU and Redis's per job).

The libraries are not dependencies of this project: on first use they are fetched into
$BENCH_ANCHORS_CACHE (default ~/.cache/wa-inbox-bench/): `npm install bullmq@5` into node/,
and a venv made with this Python with arq and saq into py/. A fetch that fails (no network,
no node) is reported and that anchor skipped; nothing else stops.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scripts.dev.redis_server import RedisServer

HERE = Path(__file__).resolve().parent / "anchors"
NAMES = ("bullmq", "arq", "saq")
LABELS = {"bullmq": "BullMQ", "arq": "arq", "saq": "SAQ"}
NPM_SPEC = "bullmq@5"
# saq imports typing_extensions without declaring it (saq 0.26).
PIP_SPECS = ("arq>=0.26,<1", "saq>=0.24,<1", "typing_extensions")
FETCH_TIMEOUT_S = 300
Metrics = dict[str, float]


def cache_dir() -> Path:
    explicit = os.environ.get("BENCH_ANCHORS_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wa-inbox-bench"


class Skipped(Exception):
    """An anchor that cannot run here (its fetch failed, node missing)."""


@dataclass
class Anchor:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return LABELS[self.name]

    def describe(self) -> str:
        main = self.versions.get(self.name, "?")
        rest = ", ".join(f"{k} {v}" for k, v in self.versions.items() if k != self.name)
        return f"{self.label} {main}" + (f" ({rest})" if rest else "")

    def run(
        self,
        url: str,
        n: int,
        concurrency: int,
        payload: int = 435,
        retention: str = "off",
        timeout_s: float | None = None,
    ) -> Metrics:
        """One run against the Redis at `url`: its numeric results (jobs_s, worker_us, ...)."""
        argv = [*self.argv, url, str(n), str(concurrency)]
        argv += [f"payload={payload}", f"retention={retention}"]
        done = subprocess.run(
            argv,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout_s or max(120.0, n / 50),
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise RuntimeError(
                f"{self.name} anchor exited {done.returncode}: {done.stderr.strip()[-1500:]}"
            )
        result = json.loads(lines[-1])
        if result.get("failed") or result.get("left"):
            raise RuntimeError(f"{self.name} anchor: jobs failed or left over: {result}")
        self.versions = {str(k): str(v) for k, v in result.get("versions", {}).items()}
        return {
            k: float(v)
            for k, v in result.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }


# --- fetching -------------------------------------------------------------------------------
def _tail(text: str, lines: int = 4) -> str:
    """The lines that say why (npm's `error code`/`errno`, pip's `ERROR:`), else the last few."""
    all_lines = text.strip().splitlines()
    why = [line for line in all_lines if re.search(r"error (code|errno)|ERROR:", line)]
    return "\n    ".join((why or all_lines)[-lines:])


def _fetch(argv: list[str], what: str) -> None:
    print(f"anchors: fetching {what} (first use) ...", flush=True)
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except subprocess.CalledProcessError as exc:
        raise Skipped(
            f"fetching {what} failed (offline? registry unreachable?): "
            f"`{' '.join(argv)}` exited {exc.returncode}:\n    {_tail(exc.stderr or exc.stdout)}"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise Skipped(f"fetching {what} took over {FETCH_TIMEOUT_S}s (offline?)") from exc
    except OSError as exc:
        raise Skipped(f"fetching {what} failed: {exc}") from exc


def node_anchor() -> Anchor:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise Skipped("BullMQ needs node and npm on PATH")
    dest = cache_dir() / "node"
    modules = dest / "node_modules"
    marker = dest / ".fetched"
    if not (marker.exists() and (modules / "bullmq" / "package.json").exists()):
        shutil.rmtree(dest, ignore_errors=True)  # a half-done fetch starts over
        dest.mkdir(parents=True)
        _fetch(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(dest), NPM_SPEC],
            f"{NPM_SPEC} into {dest}",
        )
        marker.write_text(NPM_SPEC + "\n")
    return Anchor("bullmq", [node, str(HERE / "bullmq_bench.mjs")], {"NODE_PATH": str(modules)})


def python_anchors() -> tuple[Anchor, Anchor]:
    """arq and SAQ share one venv made with this Python (rebuilt if the Python changed)."""
    dest = cache_dir() / "py"
    python = dest / "bin" / "python"
    marker = dest / ".fetched"
    wanted = f"{sys.version.split()[0]} {' '.join(PIP_SPECS)}\n"
    if not (marker.exists() and marker.read_text() == wanted and python.exists()):
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _fetch([sys.executable, "-m", "venv", str(dest)], f"a venv in {dest}")
        _fetch(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", *PIP_SPECS],
            f"{' '.join(PIP_SPECS)} into {dest}",
        )
        marker.write_text(wanted)
    return (
        Anchor("arq", [str(python), str(HERE / "arq_bench.py")]),
        Anchor("saq", [str(python), str(HERE / "saq_bench.py")]),
    )


def parse_names(text: str) -> list[str]:
    names = list(NAMES) if text.strip() in ("all", "") else text.split(",")
    unknown = set(names) - set(NAMES)
    if unknown:
        sys.exit(f"unknown anchor(s) {sorted(unknown)}; choose from {list(NAMES)} or all")
    return names


def prepare(names: list[str]) -> dict[str, Anchor]:
    """The anchors among `names` that can run here, fetched if need be; the others are
    reported as skipped."""
    steps: list[tuple[tuple[str, ...], Callable[[], Sequence[Anchor]]]] = [
        (("bullmq",), lambda: [node_anchor()]),
        (("arq", "saq"), python_anchors),
    ]
    ready: dict[str, Anchor] = {}
    for covered, build in steps:
        wanted = [name for name in covered if name in names]
        if not wanted:
            continue
        try:
            built = build()
        except Skipped as exc:
            skipped = " and ".join(LABELS[name] for name in wanted)
            print(f"anchors: {skipped} skipped: {exc}", file=sys.stderr, flush=True)
            continue
        ready.update((a.name, a) for a in built if a.name in wanted)
    return {name: ready[name] for name in names if name in ready}


# --- the anchors alone ----------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(
        prog="scripts/bench_anchors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--only", default="all", help=f"comma-separated subset of {list(NAMES)}")
    p.add_argument("--n", type=int, default=30_000, help="jobs per run")
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--payload", type=int, default=435, help="bytes of message in each job")
    p.add_argument("--retention", choices=("off", "default"), default="off")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    anchors = prepare(parse_names(args.only))
    for rep in range(args.repeat):
        for name, anchor in anchors.items():
            with RedisServer() as server:
                m = anchor.run(server.url, args.n, args.concurrency, args.payload, args.retention)
            shown = ", ".join(f"{k}={v:.1f}" for k, v in m.items())
            print(f"run {rep + 1}/{args.repeat} {name} [{anchor.describe()}]: {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
