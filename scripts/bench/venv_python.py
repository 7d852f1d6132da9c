"""Re-run a script under the project's virtualenv (.venv) when it was started with another Python.

The benchmark entry points (`scripts/bench_receiver`, `bench_worker`, `bench_fleet`) put
scripts/bench on sys.path and call `ensure(__file__)` before importing anything the venv
provides, so `scripts/bench_x` works from any shell. Standard library only: it runs before
the venv is active.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"


def ensure(script: str) -> None:
    """Return if this is the venv's Python; otherwise exec the venv's Python on `script`."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        sys.exit(f"no virtualenv at {VENV}: run scripts/bootstrap first")
    os.execv(str(python), [str(python), str(Path(script).resolve()), *sys.argv[1:]])
