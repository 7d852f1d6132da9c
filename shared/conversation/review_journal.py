"""The review journal: a batch's review, decided once and handed over at most once.

Parking a batch takes several steps that a worker may die between: deciding on review, telling
the provider (Chatwoot: a private note, then status `open`), and the finish that stores the
review item. Without a trace in Redis a resumed turn would start over: run the turn again and
post a second note. So the decision is written on the batch (field `JOURNAL_FIELD`,
token-checked by `journal_review.lua`) before the provider hears anything, and each hand-over
step the sender begins is written there before its request and again once it is answered. A
resumed turn that finds the journal finishes that review, with the same reason, and never
repeats a step that was begun: a step begun and never answered is recorded as unknown. The
finish deletes the batch and the journal with it, in the same script call that stores the
review item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.conversation.unknowns import UnknownDelivery

# A step's value while its request may be in flight: found on a resumed batch, it means the
# worker died waiting for the answer.
SENDING = "sending"

# The batch-hash field holding the journal. Its name predates the rename to "review journal"
# and is kept on purpose: during a rolling deploy a worker of the previous release may resume
# a batch journaled by a new one, and it reads only this name; under another name it would
# run the turn again and could hand the conversation over twice (journal_review.lua writes it).
JOURNAL_FIELD = "handoff"

# Review item fields as workers before the rename wrote them: items they stored keep these
# names, so readers go by `current_names`. Remove once no such item is left.
LEGACY_ITEM_FIELDS = {"handoff": "hand_over", "handoff_steps": "hand_over_steps"}


def current_names(item: dict[str, Any]) -> dict[str, Any]:
    """A review item with any field of an earlier release under its current name."""
    if not any(name in item for name in LEGACY_ITEM_FIELDS):
        return item
    return {LEGACY_ITEM_FIELDS.get(name, name): value for name, value in item.items()}


@dataclass
class ReviewJournal:
    """The review decided for a batch and what its hand-over's steps came to so far."""

    reason: str
    detail: str
    at_ms: int  # when the review was decided (the worker's clock)
    delivery_unknown: UnknownDelivery | None = None
    # step -> SENDING, "done", "unknown: ..." (what the sender's steps came to so far)
    steps: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "reason": self.reason,
                "detail": self.detail,
                "at_ms": self.at_ms,
                "delivery_unknown": self.delivery_unknown.to_json()
                if self.delivery_unknown
                else None,
                "steps": self.steps,
            }
        )

    @classmethod
    def read(cls, raw: str) -> ReviewJournal:
        """The journal a claimed batch carries. One that cannot be read still means a review
        was decided: it is finished as one (reason `review_journal_unreadable`), never by
        running the turn again, which could repeat a send or a hand-over."""
        try:
            return cls.from_json(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls("review_journal_unreadable", raw[:500], 0)

    @classmethod
    def from_json(cls, raw: str | bytes) -> ReviewJournal:
        data: dict[str, Any] = orjson.loads(raw)
        unknown = data.get("delivery_unknown")
        return cls(
            reason=str(data["reason"]),
            detail=str(data.get("detail", "")),
            at_ms=int(data.get("at_ms", 0)),
            delivery_unknown=UnknownDelivery.from_json(unknown) if unknown else None,
            steps={str(k): str(v) for k, v in (data.get("steps") or {}).items()},
        )

    @property
    def unknown_steps(self) -> list[str]:
        """Steps whose outcome nobody can know (their request got no answer)."""
        return [name for name, state in self.steps.items() if state.startswith("unknown")]
