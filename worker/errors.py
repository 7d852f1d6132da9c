"""Exceptions a brain or sender raises to say what should happen to the batch."""

from __future__ import annotations


class TurnError(Exception):
    """Base of the turn outcomes below. Any other exception counts as retryable."""


class RetryLater(TurnError):
    """A transient failure (overload, rate limit, timeout): retry with backoff."""


class NeedsReview(TurnError):
    """Must not be retried automatically: park the batch for a human, with this reason."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class LeaseLost(Exception):
    """This worker no longer holds the person's lock: stop, change nothing, let the holder go on."""
