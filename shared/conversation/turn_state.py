"""What a running turn has done so far, and what a sender sees of it.

`TurnState` is the mutable half of a turn (the `Batch` a brain reads is frozen): the reply,
the parts the provider accepted, the template noted, a send nobody can confirm, the review
journal. A resumed batch starts from what earlier attempts recorded in Redis, so a retried or
resumed turn neither asks the AI again nor re-sends an accepted part.

`Usage` is what the turn's AI calls cost in tokens: a brain reports each answer's `usage` with
`note_usage`, the turn sums and logs them.

`Delivery` is what a sender gets with each `send` and `hand_over` (shared/senders/base.py):
the state, and the two writes a sender makes about it. This base keeps them in memory, for a
sender called outside a worker's turn (its unit tests, a reply by hand); in a worker's turn
they are written on the batch in Redis under the lease first (worker/turn/under_lease.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from shared.conversation.batch import Batch
from shared.conversation.review_journal import JOURNAL_FIELD, ReviewJournal
from shared.conversation.unknowns import UnknownDelivery


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
        """Add one answer's `usage` (the SDK's `message.usage`, or a dict of the same); a
        missing or None field counts 0."""
        self.calls += 1
        for name in USAGE_FIELDS:
            setattr(self, name, getattr(self, name) + _count(usage, name))

    def tokens(self) -> dict[str, int]:
        """The four token counts by their API names (without `calls`)."""
        # USAGE_FIELDS spelled out: every turn's finish asks.
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
        }


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
    # This attempt's figures, added to the tenant's stats when the turn ends
    # (shared/fleet/turn_figures.py) and logged: the AI's token usage, each AI call's and each
    # send's latency.
    usage: Usage = field(default_factory=Usage)
    # What the AI read of the batch's files as text (transcribed voice notes, captions, "could
    # not be downloaded"): the memory keeps it beside the batch's text
    # (shared/conversation/presentation.py).
    media_notes: list[str] = field(default_factory=list)
    ai_calls_ms: list[float] = field(default_factory=list)
    sends_ms: list[float] = field(default_factory=list)
    # Whether the figures went to Redis with the turn's finish (else the turn adds them).
    figures_recorded: bool = False

    @classmethod
    def resumed(cls, batch: Batch) -> TurnState:
        """What earlier attempts recorded on the batch (nothing, for a fresh one)."""
        fields = batch.fields
        # One search of all the names at once first: no earlier attempt recorded a part of
        # nearly any batch, and a `startswith` per name was a measurable share of a turn.
        sent_parts = (
            {int(name[5:]): value for name, value in fields.items() if name.startswith("part:")}
            if "part:" in "\n".join(fields)
            else {}
        )
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


USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
# The running turn's state in its task: set by `running`, and by the worker's turn itself
# (worker/turn/turn.py, without a `with` block's calls).
CURRENT: ContextVar[TurnState | None] = ContextVar("turn_state", default=None)


class running:  # a class used as a function: `with running(state):`
    """Make `state` the current turn's for the code run inside (the turn's task only). A
    class, not a generator: it runs once per turn, on the hot path."""

    def __init__(self, state: TurnState) -> None:
        self._state = state
        self._token: Token[TurnState | None] | None = None

    def __enter__(self) -> None:
        self._token = CURRENT.set(self._state)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        CURRENT.reset(self._token)


def current() -> TurnState | None:
    """The state of the turn this code runs in (the brain's call included), else None."""
    return CURRENT.get()


def record_ai_call(seconds: float, usage: Any = None) -> None:
    """For a brain: one AI call of the running turn took `seconds` and used `usage` (the SDK's
    `message.usage`, a mapping with its names, or None when the call failed). The turn logs
    the tokens and adds them to the tenant's figures when it ends; outside a turn this does
    nothing. A brain that never calls it has its whole `reply()` counted as one AI call,
    without tokens."""
    state = CURRENT.get()
    if state is None:
        return
    state.ai_calls_ms.append(seconds * 1000)
    if usage is not None:
        state.usage.add(usage)


def record_media(blocks: Sequence[Mapping[str, Any]]) -> None:
    """For a brain: the content blocks it made of the batch's files (worker/brains/media.py). Their
    text blocks (a voice note's transcription, a file's label, why a file could not be shown)
    go into the memory with the exchange, so later turns know what the files said; the files
    themselves are not kept. Outside a turn this does nothing."""
    state = CURRENT.get()
    if state is None:
        return
    state.media_notes = [
        block["text"]
        for block in blocks
        if block.get("type") == "text" and isinstance(block.get("text"), str)
    ]


def _count(usage: Any, name: str) -> int:
    value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)
    return value if isinstance(value, int) and value > 0 else 0


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
