"""What every inbound parser produces: a `Parsed` of inbox events grouped by tenant.

Partially valid bodies: every item that can be understood becomes an event, and each one that
cannot is recorded as a *problem* (fixed wording, never body content, so it can be logged).
The receiver stores the good items and, when there is any problem, also keeps the whole raw
body on the dead-letter list, so one bad item never holds the others back and nothing that was
skipped is lost (re-driving it later is safe: the good items are deduplicated).

Ids are checked at this door against the shapes their providers document (shared/ids.py): an
id goes into Redis keys and into the URLs the worker calls with a token, so one that is not of
its shape (a quote, a backslash, a brace, a slash, `..`, a megabyte) is a problem like any
malformed item, never a conversation. One body names at most `MAX_TENANTS_PER_BODY` tenants:
every tenant named is registered for good (`wa:tenants`, scanned by every worker's sweep), and
a real body names a handful (one change per business number), so the items of any further
tenant are problems too, kept with the body on the dead-letter list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.events import dedupe_id, encode
from shared.ids import IdCheck


class Invalid(ValueError):
    """One item (or the whole body) is not in the shape the provider documents; says why.

    The text is fixed wording, never content of the body, so it can be logged.
    """


# Meta batches the updates of a business' numbers; a hundred is far above any real body and
# far below the 8 000 tenants one hostile 1.9 MiB body once registered.
MAX_TENANTS_PER_BODY = 100
TOO_MANY_TENANTS = f"more than {MAX_TENANTS_PER_BODY} tenants in one body"

Item = tuple[str, bytes]  # (dedupe id, encoded event): what the ingest script stores


@dataclass(slots=True)
class Parsed:
    """What one webhook body contained, grouped by tenant in body order."""

    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    items: dict[str, list[Item]] = field(default_factory=dict)  # the same events, encoded
    problems: list[str] = field(default_factory=list)
    # Parts of the body that are valid but not for us (other subscriptions, other events).
    ignored_fields: list[str] = field(default_factory=list)

    @classmethod
    def one(cls, tenant: str, event: dict[str, Any], item: Item) -> Parsed:
        """A body of one understood item (the parser's fast path): built without the
        dataclass' keyword `__init__`, which costs more per request than the fields it sets."""
        parsed = cls.__new__(cls)
        parsed.events = {tenant: [event]}
        parsed.items = {tenant: [item]}
        parsed.problems = []
        parsed.ignored_fields = []
        return parsed

    @property
    def count(self) -> int:
        return sum(len(events) for events in self.events.values())

    def add(self, tenant: str, event: dict[str, Any]) -> None:
        """Keep an event; encoding it here means an unstorable one is a problem, not a crash,
        and so is one more tenant than `MAX_TENANTS_PER_BODY`."""
        events = self.events.get(tenant)
        if events is None and len(self.events) >= MAX_TENANTS_PER_BODY:
            raise Invalid(TOO_MANY_TENANTS)
        try:
            data = encode(event)
        except orjson.JSONEncodeError:  # e.g. deeper nesting than orjson writes
            raise Invalid("item cannot be encoded") from None
        if events is None:
            events = self.events[tenant] = []
            self.items[tenant] = []
        events.append(event)
        self.items[tenant].append((dedupe_id(event), data))


def checked_id(value: Any, fits: IdCheck, problem: str) -> str:
    """`value` when it is a string of the shape `fits` accepts (shared/ids.py), else
    Invalid(problem)."""
    if type(value) is not str or not fits(value):
        raise Invalid(problem)
    return value
