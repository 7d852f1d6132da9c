"""What an error of the Messages API means for the turn: `classify(exc)`.

    try:
        message = await client.messages.create(**request)
    except anthropic.APIError as exc:
        raise classify(exc) from exc

- The provider failing as a whole (429 rate limit, 529 overloaded, any other 5xx, 408, a
  timeout, no connection) is `AIUnavailable`, with the `retry-after` it asked for: the fleet
  pauses its AI calls and the batch waits, its attempts not counted (worker/brains/ai_pause.py).
- A request the API refuses is `NeedsReview`: "ai_auth" for a key it does not take (401, 403),
  "ai_rejected" otherwise (400, 404 model, 413, ...); retrying would get the same answer.
- What is left (409, an answer the SDK could not read) is `RetryLater`: a failure of this
  batch, counted against `MAX_ATTEMPTS`.

Every call of the Messages API a brain makes (one, or each round of a tool loop) maps its
errors here, so they all mean the same.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

import anthropic

from shared.conversation.errors import AIUnavailable, NeedsReview, RetryLater

# Statuses that say the provider, not the request, failed: wait for it.
UNAVAILABLE_STATUS = frozenset({408, 429})
# Longest retry-after taken as given (the fleet's AI pause honours one, worker/brains/ai_pause.py).
MAX_RETRY_AFTER_S = 3600.0


def classify(exc: Exception) -> Exception:
    """The turn outcome of an exception the anthropic SDK raised; any other exception is
    given back as it is (the turn counts it as a failed attempt)."""
    if isinstance(exc, anthropic.APIConnectionError):  # timeouts included
        return AIUnavailable(f"Anthropic unreachable: {exc!r}")
    if isinstance(exc, anthropic.APIStatusError):
        status, detail = exc.status_code, f"Anthropic {exc.status_code}: {exc.message}"
        if status in UNAVAILABLE_STATUS or status >= 500:
            return AIUnavailable(detail, retry_after(exc.response.headers))
        if status == 409:
            return RetryLater(detail)
        reason = "ai_auth" if status in (401, 403) else "ai_rejected"
        return NeedsReview(reason, detail)
    if isinstance(exc, anthropic.APIError):
        return RetryLater(f"Anthropic: {exc!r}")
    return exc


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the provider asked us to wait: `retry-after-ms`, else `retry-after` (seconds,
    or an HTTP date); None when it did not say (or said something unreadable)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            parsed = email.utils.parsedate_tz(value) if scale == 1.0 else None
            if parsed is None:
                continue
            seconds = email.utils.mktime_tz(parsed) - (time.time() if now is None else now)
        if seconds != seconds:  # NaN
            continue
        return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)
    return None
