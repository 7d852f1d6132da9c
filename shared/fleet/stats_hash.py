"""A tenant's stats hash (`wa:{T}:stats`, shared/keys.py): its counters, and the field that
keeps it a hash table.

A turn makes a handful of `HINCRBY`s on it (the turn count, its figures, parts_out, replies).
Redis keeps a hash's fields in one listpack while each is at most 64 bytes
(`hash-max-listpack-value`), and there each `HINCRBY` scans every field twice (~4.5k
instructions at the ~30 fields a turn's figures make, more with each new counter); in a hash
table it finds its field by hash (~1k). The claim that makes a tenant's first batch writes
`LAYOUT_FIELD` with a value too long for a listpack (claim.lua), so the hash is a table for
good (docs/benchmarks/worker.md). Its value is no number: readers of the counters skip it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

LAYOUT_FIELD = "layout"
LAYOUT = "hashtable:longer_than_a_listpack_entry_may_be_so_each_counter_is_found_by_hash"
assert len(LAYOUT) > 64, "a listpack takes values up to 64 bytes"


def counters(pairs: Iterable[tuple[bytes | str, Any]]) -> dict[str, int]:
    """The counters of a stats hash's (field, value) pairs (HGETALL's answer `.items()`) by
    name: a value that is not a whole number (the layout field) is left out."""
    out = {}
    for name, value in pairs:
        try:
            out[name.decode() if isinstance(name, bytes) else name] = int(value)
        except ValueError:
            continue
    return out
