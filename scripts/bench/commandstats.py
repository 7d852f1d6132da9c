"""The product's script calls in `INFO commandstats`: EVALSHA and FCALL together.

Since the scripts run as Redis functions where Redis has them (shared/storage/functions.py)
their calls are FCALL; a revision before, or a cluster, calls EVALSHA. A benchmark counts
both, so it reads any revision alike (here, not in the product: `--at` runs old code).
"""

from __future__ import annotations

from typing import Any


def script_stats(commandstats: dict[str, Any]) -> dict[str, int]:
    """`calls` and `usec` of EVALSHA and FCALL together."""
    total = {"calls": 0, "usec": 0}
    for name in ("cmdstat_evalsha", "cmdstat_fcall"):
        for field in total:
            total[field] += int((commandstats.get(name) or {}).get(field, 0))
    return total
