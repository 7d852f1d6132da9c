"""Child processes that die with their parent, however the parent dies.

A supervisor that is SIGKILLed (or crashes) cannot stop its children, and children in their
own process groups do not get the terminal's Ctrl-C either: they would live on, holding ports
and a Redis data directory. Linux's `PR_SET_PDEATHSIG` has the kernel send a process a signal
when its parent dies, and it survives `exec`.

`command(argv)` wraps a child's command line in a small trampoline, `python
scripts/dev/lifeline.py PARENT_PID SIGNAL -- argv...`, which arms the signal and then `exec`s
argv (same pid, so the supervisor signals the real program). It runs in the child as a fresh,
single-threaded process: unlike a `preexec_fn`, no Python code runs between fork and exec in a
parent that has threads (asyncio's child watchers, its resolver pool), where it could deadlock.
Elsewhere than Linux there is no such call and `command` returns argv unchanged.

The signal is tied to the parent *thread* that forked the child: start children from a thread
that lives as long as the process (the main thread, or the asyncio loop thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1


def supported() -> bool:
    """Whether children can be tied to this process's life (Linux)."""
    return sys.platform.startswith("linux")


def command(argv: Sequence[str], signum: int = signal.SIGTERM) -> list[str]:
    """`argv` run so that it receives `signum` when this process dies (Linux)."""
    if not supported():
        return list(argv)
    # Run by path: scripts/ is not an installed package, and the child's cwd is the caller's.
    trampoline = [sys.executable, str(Path(__file__).resolve()), str(os.getpid()), str(int(signum))]
    return [*trampoline, "--", *argv]


def main(args: Sequence[str]) -> None:
    """The trampoline: `PARENT_PID SIGNAL -- argv...`; arms the signal, then execs argv."""
    if len(args) < 4 or args[2] != "--":
        sys.exit("usage: python scripts/dev/lifeline.py PARENT_PID SIGNAL -- COMMAND [ARGS...]")
    parent, signum, argv = int(args[0]), int(args[1]), list(args[3:])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:
        sys.exit(1)  # the parent died before the signal was armed: follow it now
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
