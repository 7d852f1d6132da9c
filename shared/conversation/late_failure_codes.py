"""Late delivery failures: what is kept for them and how each is named.

Meta accepts a send (200, a wamid) and may report later, in a `failed` status webhook, that it
could not deliver it. The intake (shared/lua/claim.lua, through shared/lua/lib/outbound.lua)
queues each such failure on the person's `late` hash; the worker handles it under the person's
lock, like a batch (worker/turn/late_failures.py): for 131047 the tenant's template, once per batch;
for every code a review item with the batch's messages, the failed part's text and the error;
the person's memory marks the reply as not delivered.

The Lua reads the constants below as `{{NAME}}` (shared/storage/lua_source.py).
"""

from __future__ import annotations

# How many answered batches a conversation keeps (messages and reply, newest first) for a
# failure that arrives after the batch is gone, and how long after the last reply: Meta reports
# a failure within seconds to minutes of the send, and 6 hours covers a slow or retried webhook.
# Longer costs memory: about 835 B per answered conversation while kept (docs/deploying.md).
SENT_KEEP = 3
SENT_TTL_S = 6 * 3600
# How long queued failures, and the note that a batch's template went out, live after the last
# change: as long as an outbound record, so a status for any of its parts still finds the note.
LATE_TTL_S = 7 * 24 * 3600

WINDOW_CLOSED = 131047
# Meta's code in a `failed` status -> the review reason. Any other code: DELIVERY_FAILED.
REASONS = {
    WINDOW_CLOSED: "window_closed",  # the 24-hour window had closed: only a template may go
    131026: "undeliverable",  # not a WhatsApp user, an old app, or cannot receive it
    131049: "marketing_limited",  # held back "to maintain healthy ecosystem engagement"
    131050: "marketing_opted_out",  # the person stopped marketing messages from the business
    130472: "meta_experiment",  # the person's number is part of one of Meta's experiments
}
DELIVERY_FAILED = "delivery_failed"


def reason_for(code: int | None) -> str:
    """The review reason of a late failure with Meta's error `code` (None: no code given)."""
    return REASONS.get(code, DELIVERY_FAILED) if code is not None else DELIVERY_FAILED


def memory_mark(code: int | None, part: int, parts: int) -> str:
    """What the memory's reply starts with once Meta reported it undelivered, so the next turn's
    AI knows the customer never saw it: "[not delivered: 131026] " or, for one part of several,
    "[part 2 of 3 not delivered: 131026] "."""
    what = f"part {part + 1} of {parts} not delivered" if parts > 1 else "not delivered"
    return f"[{what}: {code if code is not None else 'unknown error'}] "
