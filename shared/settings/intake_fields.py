"""Settings of the webhook intake's bounds: what a request may cost the receiver before it is
refused, and how much of what cannot be parsed is kept (docs/operating.md#security).

A group of its own (composed into `Settings` like those of shared/settings/fields.py), so the
receiver's limits are read in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.settings.spec import setting


@dataclass(frozen=True)
class IntakeSettings:
    max_body_bytes: int = setting(
        "MAX_BODY_BYTES", 4 * 1024 * 1024, "larger webhook bodies get 413", above=0
    )
    headers_timeout_s: float = setting(
        "HEADERS_TIMEOUT_S",
        10.0,
        "a connection whose request headers are not complete this long after it opened (or"
        " after the request's first byte) is closed (receiver/header_deadline.py)",
        above=0,
    )
    body_read_timeout_s: float = setting(
        "BODY_READ_TIMEOUT_S",
        10.0,
        "a webhook body not fully received this long after its headers gets 408 and its"
        " connection is closed (a client trickling a body holds no memory for long)",
        above=0,
    )
    deadletter_max: int = setting(
        "DEADLETTER_MAX",
        1000,
        "the dead-letter list keeps at most this many bodies, the newest (older ones dropped)",
        above=0,
    )
    deadletter_max_bytes: int = setting(
        "DEADLETTER_MAX_BYTES",
        64 * 1024 * 1024,
        "...in at most this much Redis memory (`MEMORY USAGE`; the newest body stays whatever"
        " its size)",
        above=0,
    )
    deadletter_ttl_s: float = setting(
        "DEADLETTER_TTL_S",
        7 * 24 * 3600.0,
        "the dead-letter list is deleted this long after its last body was added",
        above=0,
    )
