"""Instructions per request of the receiver's own code: a figure other load cannot move.

    .venv/bin/python -m scripts.bench.receiver_instructions [--small 1000] [--large 3000]

Runs the in-process driver (receiver_inproc.py) twice under `valgrind --tool=callgrind`, serving
`--small` and then `--large` requests from the same pool of pre-generated bodies, and divides
the difference in instructions executed by the difference in requests: start-up, body
generation and Redis's own work (another process, not traced) cancel out. What remains is the
receiver's Python (the HTTP protocol's parsing and answer, sign check, parse, encode, group
commit, the Redis client and event loop; `--via asgi` passed on measures the ASGI path).

Why: on a shared 2-core machine wall-clock and even CPU-time figures move by 30 % from one
minute to the next; instruction counts repeat to well under 1 %. Use it to decide whether a
change saves work; use bench_receiver (wrk) for what a user sees. Round sizes under valgrind
differ from a real run (the traced process is ~50x slower, Redis is not), so per-round costs
weigh less here than under wrk. Needs valgrind (apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "scripts.bench.receiver_inproc"


def instructions(requests: int, pool: int, extra: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                DRIVER,
                "--requests",
                str(requests),
                "--reps",
                "1",
                "--pool",
                str(pool),
                *extra,
            ],
            cwd=ROOT,
            # A fixed hash seed: with a random one, dict and set probing differ from run to
            # run by a few hundred instructions per request, as much as a change worth finding.
            env={**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")},
            capture_output=True,
            text=True,
            check=False,
        )
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None or "200:" not in run.stdout:
        sys.exit(f"driver failed ({run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=1, help="measure this many times")
    args, extra = parser.parse_known_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind not found: apt-get install valgrind")
    for _ in range(args.repeat):
        small = instructions(args.small, args.large, extra)
        large = instructions(args.large, args.large, extra)
        per_request = (large - small) / (args.large - args.small)
        print(f"{per_request:,.0f} instructions/request ({small:,} / {large:,})", flush=True)


if __name__ == "__main__":
    main()
