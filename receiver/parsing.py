"""What every inbound parser produces: a `Parsed` of inbox events grouped by tenant.

Partially valid bodies: every item that can be understood becomes an event, and each one that
cannot is recorded as a *problem* (fixed wording, never body content, so it can be logged).
The receiver stores the good items and, when there is any problem, also keeps the whole raw
body on the dead-letter list, so one bad item never holds the others back and nothing that was
skipped is lost (re-driving it later is safe: the good items are deduplicated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.events import dedupe_id, encode


class Invalid(ValueError):
    """One item (or the whole body) is not in the shape the provider documents; says why.

    The text is fixed wording, never content of the body, so it can be logged.
    """


Item = tuple[str, bytes]  # (dedupe id, encoded event): what the ingest script stores


@dataclass(slots=True)
class Parsed:
    """What one webhook body contained, grouped by tenant in body order."""

    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    items: dict[str, list[Item]] = field(default_factory=dict)  # the same events, encoded
    problems: list[str] = field(default_factory=list)
    # Parts of the body that are valid but not for us (other subscriptions, other events).
    ignored_fields: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(events) for events in self.events.values())

    def add(self, tenant: str, event: dict[str, Any]) -> None:
        """Keep an event; encoding it here means an unstorable one is a problem, not a crash."""
        try:
            data = encode(event)
        except orjson.JSONEncodeError:  # e.g. deeper nesting than orjson writes
            raise Invalid("item cannot be encoded") from None
        self.events.setdefault(tenant, []).append(event)
        self.items.setdefault(tenant, []).append((dedupe_id(event), data))


def usable_id(value: Any, problem: str = "tenant id missing or unusable in a Redis key") -> str:
    """An id that may go into a Redis key: a non-empty string without hash-tag braces."""
    if not isinstance(value, str) or not value or "{" in value or "}" in value:
        raise Invalid(problem)
    return value
