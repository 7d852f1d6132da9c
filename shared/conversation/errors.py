"""Exceptions a brain or sender raises to say what should happen to the batch."""

from __future__ import annotations

DELIVERY_UNKNOWN = "delivery_unknown"
AI_HAND_OVER = "ai_hand_over"


class TurnError(Exception):
    """Base of the turn outcomes below. Any other exception counts as retryable."""


class RetryLater(TurnError):
    """A transient failure of this batch: retry with backoff, counted against `MAX_ATTEMPTS`."""


class AIUnavailable(TurnError):
    """The AI provider as a whole failed (overloaded, rate limited, 5xx, a timeout, no
    connection): nothing is wrong with the batch. The fleet pauses its AI calls
    (worker/brains/ai_pause.py) and the batch waits for the AI, its attempts not counted; only
    `REVIEW_AFTER_S` ends the wait. `retry_after_s`: what the provider asked for, if it did."""

    def __init__(self, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s


class NeedsReview(TurnError):
    """Must not be retried automatically: park the batch for a human, with this reason."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class HandOverRequested(NeedsReview):
    """The AI asked for a person (the built-in `hand_over_to_human` tool, worker/brains/tools.py):
    the turn sends `text` to the person, once, then parks the batch for review as
    "ai_hand_over" with the AI's `reason` as its detail. Raised by a brain or a tool handler;
    a review decided before the text goes out, so a resumed turn never sends it again."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(AI_HAND_OVER, reason)
        self.text = text


class DeliveryUnknown(NeedsReview):
    """A send whose request may have reached the provider got no usable answer (a read
    timeout, a connection dropped after the request was written, a 200 without a message id):
    the person may or may not have it. Never retried, since a retry may be a second copy
    (invariant 7); the batch goes to review as "delivery_unknown" (shared/conversation/unknowns.py).

    `what` is "part" (a reply part) or "template" (the tenant's template, `label` its name);
    `at_ms` is when the request was made, if an earlier attempt made it (else the worker
    takes the time it asked the sender)."""

    def __init__(
        self, detail: str, *, what: str = "part", label: str = "", at_ms: int | None = None
    ) -> None:
        super().__init__(DELIVERY_UNKNOWN, detail)
        self.what = what
        self.label = label
        self.at_ms = at_ms


class LeaseLost(Exception):
    """This worker no longer holds the person's lock: stop, change nothing, let the holder go on."""
