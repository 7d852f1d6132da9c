"""The review journal: a batch's review, decided once and handed over at most once.

Parking a batch takes several steps that a worker may die between: deciding on review, telling
the provider (Chatwoot: a private note, then status `open`), and the finish that stores the
review item. Without a trace in Redis a resumed turn would start over: run the turn again and
post a second note. So the decision is written on the batch (field `handoff`, token-checked by
`mark_handoff.lua`) before the provider hears anything, and each hand-off step the sender
begins is written there before its request and again once it is answered. A resumed turn that
finds the journal finishes that review, with the same reason, and never repeats a step that
was begun: a step begun and never answered is recorded as unknown. The finish deletes the
batch and the journal with it, in the same script call that stores the review item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from worker.unknowns import UnknownDelivery

# A step's value while its request may be in flight: found on a resumed batch, it means the
# worker died waiting for the answer.
SENDING = "sending"


@dataclass
class HandOff:
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
    def read(cls, raw: str) -> HandOff:
        """The journal a claimed batch carries. One that cannot be read still means a review
        was decided: it is finished as one (reason `review_journal_unreadable`), never by
        running the turn again, which could repeat a send or a hand-off."""
        try:
            return cls.from_json(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls("review_journal_unreadable", raw[:500], 0)

    @classmethod
    def from_json(cls, raw: str | bytes) -> HandOff:
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
