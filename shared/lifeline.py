"""Child processes that die with their parent, however the parent dies.

A supervisor that is SIGKILLed (or crashes) cannot stop its children, and children in their
own process groups do not get the terminal's Ctrl-C either: they would live on, holding ports
and a Redis data directory. Linux's `PR_SET_PDEATHSIG`, armed between fork and exec, has the
kernel send the child a signal when its parent dies; it survives `exec`, so a child started as
`sh -c 'exec …'` keeps it. Elsewhere there is no such call and `die_with_parent` returns None.

The signal is tied to the parent *thread* that forked the child: start children from a thread
that lives as long as the process (the main thread, or the asyncio loop thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # the C library this process already loaded
    function: Callable[..., int] = libc.prctl
    return function


_PRCTL = _prctl()


def supported() -> bool:
    """Whether children can be tied to this process's life (Linux)."""
    return _PRCTL is not None


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess/asyncio that sends the child `signum` when this process
    dies; None where the platform has no such mechanism."""
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:
        # Runs in the child, between fork and exec: no imports, no locks.
        if prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(1)  # the parent died before the signal was armed: follow it now

    return arm
