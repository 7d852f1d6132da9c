"""What a running turn has done so far, and what a sender sees of it.

`TurnState` is the mutable half of a turn (the `Batch` a brain reads is frozen): the reply,
the parts the provider accepted, the template noted, a send nobody can confirm, the review
journal. A resumed batch starts from what earlier attempts recorded in Redis, so a retried or
resumed turn neither asks the AI again nor re-sends an accepted part.

`Usage` is what the turn's AI calls cost in tokens: a brain reports each answer's `usage` with
`note_usage`, the turn sums and logs them.

`Delivery` is what a sender that declares a `delivery` keyword parameter gets with each call
(worker/senders.py): the state, and the two writes a sender makes about it. This base keeps
them in memory, for a sender called outside a worker's turn (its unit tests); in a worker's
turn they are written on the batch in Redis under the lease first (worker/turn.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from worker.batch import Batch
from worker.review_journal import JOURNAL_FIELD, ReviewJournal
from worker.unknowns import UnknownDelivery


@dataclass
class TurnState:
    # The reply stored by an earlier attempt (never ask the AI twice) and the parts of it the
    # provider already accepted: part index -> provider message id ("" = deliberately skipped).
    reply: str | None = None
    sent_parts: dict[int, str] = field(default_factory=dict)
    # How many parts the reply was split into (0 until the turn splits it).
    parts_total: int = 0
    # The tenant's template went out (or was about to: see `Delivery.note_template`) for this
    # batch, in this attempt or an earlier one: no second template, no more parts.
    template_sent: bool = False
    # Which part the template replaced, and when it was noted (Redis clock): a resumed turn
    # that finds that part unrecorded cannot know whether the template went out.
    template_part: int | None = None
    template_ms: int = 0
    # A send of this turn whose outcome is unknown (it goes on the review item).
    delivery_unknown: UnknownDelivery | None = None
    # The review decided for this batch and how far its hand-over got (read back from Redis
    # on a resumed batch).
    journal: ReviewJournal | None = None
    # The last part, sent but left for the finish to record: (index, provider id).
    unrecorded_part: tuple[int, str] | None = None
    # The tokens this attempt's AI calls used (None: the brain reported none).
    usage: Usage | None = None

    @classmethod
    def resumed(cls, batch: Batch) -> TurnState:
        """What earlier attempts recorded on the batch (nothing, for a fresh one)."""
        fields = batch.fields
        sent_parts = {
            int(name[5:]): value for name, value in fields.items() if name.startswith("part:")
        }
        journal = fields.get(JOURNAL_FIELD)
        template_part = fields.get("template_part")
        return cls(
            reply=fields.get("reply"),
            sent_parts=sent_parts,
            template_sent=fields.get("template") == "1",
            template_part=int(template_part) if template_part else None,
            template_ms=int(fields.get("template_ms") or 0),
            journal=None if journal is None else ReviewJournal.read(journal),
        )


@dataclass
class Usage:
    """The tokens of one turn's AI calls, summed (a tool loop makes several), as the Messages
    API's `usage` counts them: `input_tokens` after the last cache hit or write."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    calls: int = 0

    def add(self, usage: Any) -> None:
        """Add one answer's `usage` (the SDK's `message.usage`, or a dict of the same)."""
        self.calls += 1
        for name in USAGE_FIELDS:
            setattr(self, name, getattr(self, name) + _count(usage, name))


USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
_TURN_USAGE: ContextVar[Usage | None] = ContextVar("turn_usage", default=None)


def note_usage(usage: Any) -> None:
    """A brain reports the `usage` of each Messages API answer (`message.usage`) to the turn
    it runs in; nothing happens outside a turn."""
    current = _TURN_USAGE.get()
    if current is not None:
        current.add(usage)


@contextmanager
def usage_of_turn() -> Iterator[Usage]:
    """What `note_usage` reports inside this block (the turn's brain call) is summed here."""
    usage = Usage()
    token = _TURN_USAGE.set(usage)
    try:
        yield usage
    finally:
        _TURN_USAGE.reset(token)


def _count(usage: Any, name: str) -> int:
    value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)
    return int(value or 0)


class Delivery:
    """A turn as a sender sees it: `state`, and the writes a sender makes about it."""

    def __init__(self, state: TurnState | None = None) -> None:
        self.state = state if state is not None else TurnState()

    async def note_template(self, sending: bool, part: int) -> None:
        """`(True, part)`: the template goes out in place of `part` (called before its
        request, so no retry sends it twice); `(False, part)`: Meta refused it, a retry may
        send it. Sets `state.template_sent`/`template_part`; in a worker's turn it first
        writes the note on the batch, under the lease (raises LeaseLost if the lease is gone).
        """
        self.state.template_sent = sending
        self.state.template_part = part if sending else None

    async def save_journal(self) -> None:
        """Write `state.journal` (the hand-over's steps so far) on the batch, under the lease;
        raises LeaseLost if the lease is gone. Nothing to write outside a worker's turn."""
