"""`scripts/chaos --duration S [--scenario NAME]`: long chaos runs that print their figures.

Each scenario starts its own stack (Redis with AOF, stand-ins, receiver, workers), runs the
workload with its fault for `--duration` seconds, drains, checks every invariant and prints
the figures and any violation. Exit status 0 only if no scenario found a violation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from scripts.chaos_harness.scenarios import SCENARIOS, Report, run_scenario


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/chaos", description="Run the product under injected faults and check it."
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic each")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="scenario to run (repeatable; default: all, one after the other)",
    )
    parser.add_argument("--people", type=int, default=60, help="people writing (default 60)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--run-dir", type=Path, help="keep logs and Redis data here")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a worker setting over the scenario's (repeatable), e.g. --set LEASE_S=120",
    )
    args = parser.parse_args(argv)
    try:
        args.worker_env = dict(_setting(s) for s in args.set)
    except ValueError as exc:
        parser.error(str(exc))
    if args.duration <= 0 or args.people < 1 or args.workers < 1:
        parser.error("--duration, --people and --workers must be positive")
    return args


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier() or name.upper() != name:
        raise ValueError(f"--set wants NAME=VALUE with a setting's name, got {text!r}")
    return name, value


async def run_all(args: argparse.Namespace) -> list[Report]:
    reports = []
    for name in args.scenario or list(SCENARIOS):
        started = time.monotonic()
        run_dir = args.run_dir / name if args.run_dir else None
        report = await run_scenario(
            name,
            duration_s=args.duration,
            people=args.people,
            workers=args.workers,
            seed=args.seed,
            run_dir=run_dir,
            drain_timeout_s=max(30.0, args.duration),
            worker_env=args.worker_env,
        )
        print(report.summary())
        print(f"  ({time.monotonic() - started:.0f}s in all; logs and data in {report.run_dir})")
        if args.json:
            print(json.dumps({"scenario": name, **report.figures}, default=str))
        if report.violations:
            print(report.logs[-8000:])
        print(flush=True)
        reports.append(report)
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    # SIGTERM ends the run like Ctrl-C: the stack's processes are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reports = asyncio.run(run_all(args))
    total = sum(len(r.violations) for r in reports)
    print(f"{len(reports)} scenario(s), violations: {total}")
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
