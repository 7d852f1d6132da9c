"""Two revisions' worker throughput, run by run in alternation, with their medians side by side.

    .venv/bin/python -m scripts.bench.alternate A B [--pairs 10] [--n 60000] [--anchors bullmq]

On these shared 2-core machines one revision's turns/s moves by ±15 % from one minute to the
next (docs/benchmarks/worker.md), more than most changes move it. Alternating A, B, A, B, ...
puts what the machine does meanwhile on both alike; the medians, the ranges and how many pairs
each revision won are what to compare, never one run. Each run is
`scripts/bench_worker --only throughput --repeat 1 --at REV` (1 and 2 worker processes, and
the anchors asked for, in the same run); its table is read back by the measurement names.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence

from scripts.bench.revision import ROOT

# The measurements compared, by their row in bench_worker's table; "higher" when more is better.
MEASURES: dict[str, tuple[str, bool]] = {
    "turns/s, 1 process": ("2. throughput, 1 process", True),
    "worker µs a turn": ("2. worker CPU per turn", False),
    "Redis µs a turn": ("2. Redis CPU per turn", False),
    "turns/s, 2 processes": ("2. throughput, 2 processes", True),
    "BullMQ jobs/s": ("2. anchor: BullMQ, 1 process, no-op jobs", True),
    "÷ BullMQ": ("2. throughput, 1 process ÷ BullMQ", True),
}
_ROW = re.compile(r"^\| (?P<name>[^|]+?) \| (?P<runs>[^|]+?) \|", re.MULTILINE)


def read_run(report: str) -> dict[str, float]:
    """The compared measurements of one bench_worker report (a run of `--repeat 1`); those
    it does not have (an anchor not asked for) are left out."""
    rows = {m["name"]: m["runs"] for m in _ROW.finditer(report)}
    got: dict[str, float] = {}
    for label, (row, _) in MEASURES.items():
        text = rows.get(row)
        if text is None:
            continue
        try:
            got[label] = float(text.replace(",", ""))
        except ValueError:
            raise ValueError(f"{row!r}: {text!r} is not one run's number") from None
    return got


def summary(revs: Sequence[str], runs: Mapping[str, Sequence[Mapping[str, float]]]) -> str:
    """A markdown table: each measurement's median and range per revision, and how many of the
    pairs the second revision won (runs[rev][i] is pair i's run of rev)."""
    a, b = revs
    lines = [f"| measured | {a} | {b} | pairs {b} won |", "| --- | --- | --- | ---: |"]
    pairs = min(len(runs[a]), len(runs[b]))
    for label, (_, higher) in MEASURES.items():
        cells = []
        for rev in revs:
            values = [run[label] for run in runs[rev] if label in run]
            if not values:
                break
            median = statistics.median(values)
            cells.append(f"{median:,.2f} ({min(values):,.2f}-{max(values):,.2f})")
        if len(cells) < 2:
            continue
        won = sum(
            1
            for i in range(pairs)
            if label in runs[a][i]
            and label in runs[b][i]
            and (runs[b][i][label] > runs[a][i][label]) == higher
            and runs[b][i][label] != runs[a][i][label]
        )
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {won} of {pairs} |")
    return "\n".join(lines)


def _one_run(rev: str, n: int, anchors: str) -> dict[str, float]:
    command = [str(ROOT / "scripts" / "bench_worker"), "--only", "throughput"]
    command += ["--repeat", "1", "--n", str(n), "--at", rev]
    if anchors:
        command += ["--anchors", anchors]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_worker --at {rev} failed:\n{done.stdout}{done.stderr}")
    return read_run(done.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revs", nargs=2, metavar="REV", help="the two git revisions")
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--n", type=int, default=60_000, help="conversations a run")
    p.add_argument("--anchors", default="bullmq", help='bench_worker --anchors ("" for none)')
    args = p.parse_args()
    runs: dict[str, list[dict[str, float]]] = {rev: [] for rev in args.revs}
    for pair in range(1, args.pairs + 1):
        for rev in args.revs:
            got = _one_run(rev, args.n, args.anchors)
            runs[rev].append(got)
            shown = " · ".join(f"{k} {v:,.2f}" for k, v in got.items())
            print(f"pair {pair} {rev}: {shown}", file=sys.stderr, flush=True)
    print(summary(args.revs, runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
