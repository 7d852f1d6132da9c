"""Summarise a py-spy `--format raw` profile (collapsed stacks) of a worker process.

    .venv/bin/python -m scripts.bench.worker_profile /tmp/prof-tp1.txt [--top 25]

Prints the share of samples per function, self (the frame on top of the stack) and inclusive
(anywhere on the stack, counted once per sample), and per file, so hot spots can be named.
py-spy leaves idle samples out by default, so shares are of the time the process was busy.
Start-up (imports) and the probe's exit dump are left out unless --all is given.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]+)(?::(?P<line>\d+))?\)$")


def short(frame: str, with_line: bool = False) -> str:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for marker in ("site-packages/", "/work/main/", "python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    suffix = f":{m['line']}" if with_line and m["line"] else ""
    return f"{m['func']} ({path}{suffix})"


NOT_STEADY = ("importlib._bootstrap", "_dump (worker_probe.py")


def summarise(path: Path, top: int, everything: bool = False) -> str:
    self_t: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    files: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames or (not everything and any(x in stack for x in NOT_STEADY)):
            continue
        total += n
        self_t[short(frames[-1], with_line=True)] += n
        files[short(frames[-1]).rsplit("(", 1)[-1].rstrip(")")] += n
        for name in {short(f) for f in frames}:
            incl[name] += n
    out = [f"{total} busy samples in {path}", "", "self (top of stack):"]
    out += [f"  {100 * c / total:5.1f}%  {name}" for name, c in self_t.most_common(top)]
    out += ["", "inclusive:"]
    out += [f"  {100 * c / total:5.1f}%  {name}" for name, c in incl.most_common(top)]
    out += ["", "self, by file:"]
    out += [f"  {100 * c / total:5.1f}%  {name}" for name, c in files.most_common(top)]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--all", action="store_true", help="keep start-up and exit samples")
    args = p.parse_args()
    print(summarise(args.profile, args.top, args.all))


if __name__ == "__main__":
    main()
