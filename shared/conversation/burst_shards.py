"""Which of a tenant's hashes of bursts holds a person's (shared/lua/lib/burst.lua): each
waiting person's "first_ms,last_ms" is a field of one of BURST_SHARDS hashes,
`TenantKeys.burst_shard(burst_shard_of(person))`, about 10 people each at 10 000 waiting
conversations (a listpack up to 128: 128 000 waiting)."""

from __future__ import annotations

import hashlib
import re

BURST_SHARDS = 1000  # a phone number's last three digits
_LAST_DIGITS = re.compile(r"[0-9]{3}")


def burst_shard_of(person: str) -> str:
    """The shard as the scripts find it (lib/burst.lua `burst_shard`): a person ending in three
    ASCII digits (a phone number) by those, any other person by its SHA-1 (three digits too)."""
    tail = person[-3:]
    if _LAST_DIGITS.fullmatch(tail):
        return tail
    return f"{int(hashlib.sha1(person.encode()).hexdigest()[:8], 16) % BURST_SHARDS:03d}"
