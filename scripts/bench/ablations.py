"""The receiver with other writer tunables, to measure one against the committed defaults.

    scripts/bench_receiver --app scripts.bench.ablations:create_app --app-env VARIANT=rounds1

`VARIANT` is a `+`-separated list; each piece changes one `receiver.store.WriterTuning` field:

- `rounds1`, `rounds2`, `rounds3`: at most that many group-commit rounds in flight at once
  (`rounds_in_flight`; the default is 2);
- `nextfirst`: send the next group-commit round before the answered requests respond
  (`answer_first=False`, the order before it was added).

Each variant keeps the receiver's contract (signature checked, 200 only after Redis
confirmed), so the benchmark's probe and inbox check still apply.
"""

from __future__ import annotations

import os
from typing import Any

from receiver.app import ReceiverApp
from receiver.app import create_app as create_receiver
from receiver.store import WriterTuning

PIECES: dict[str, dict[str, Any]] = {
    **{f"rounds{n}": {"rounds_in_flight": n} for n in (1, 2, 3)},
    "nextfirst": {"answer_first": False},
}


def create_app() -> ReceiverApp:
    """The receiver with `VARIANT`'s tuning (`uvicorn scripts.bench.ablations:create_app
    --factory`)."""
    variant = set(os.environ.get("VARIANT", "").split("+")) - {""}
    unknown = variant - PIECES.keys()
    if unknown:
        raise SystemExit(f"ablations: unknown VARIANT piece(s) {sorted(unknown)}")
    changes: dict[str, Any] = {}
    for piece in sorted(variant):
        changes.update(PIECES[piece])
    return create_receiver(tuning=WriterTuning(**changes))
