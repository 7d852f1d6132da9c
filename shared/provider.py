"""The one provider interface: what WhatsApp, Chatwoot and any later provider implement.

A provider has two halves, each in its own module, because they run in different processes:

- **inbound** (`receiver/<provider>.py`, registered in `receiver/providers.py`, its protocol
  `InboundProvider` in `receiver/provider.py`, beside the receiver): serves one
  webhook path; `verify` authenticates a request (raising a `SignatureError`: 401 missing,
  403 wrong) and `parse` turns its body into inbox events (`receiver.parsing.Parsed`). Both are
  pure: no I/O, so the receiver stores the events and answers.
- **outbound** (`worker/<provider>_sender.py`, registered in `shared/senders/loading.py`): `send`s
one
  reply part, `begin_turn` marks read / shows typing where the provider has it, and
  `hand_over` gives the conversation to a human when its batch is parked for review.

Events carry their `channel`; the worker picks the outbound half of each batch by that
channel, so debounce, locks, leases, retries and review never know which provider a
conversation came from. A third provider (Twilio, say) is one inbound module, one outbound
module and their tests, plus a line in each registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from shared.conversation.batch import Batch
    from shared.conversation.turn_state import Delivery


class OutboundProvider(Protocol):
    """The worker's half of a provider (`send` is the only required method of a sender)."""

    max_part_chars: int

    async def begin_turn(self, batch: Batch) -> None:
        """Before the AI is asked: read receipt / typing indicator (best effort)."""
        ...

    async def send(self, batch: Batch, text: str, part: int) -> str | None:
        """Send part `part` of the reply; the provider's message id (None if it gives none).
        A sender that needs what the turn did so far (the template noted) declares a keyword
        parameter `delivery: Delivery | None = None` (shared/conversation/turn_state.py) and gets
        it.

        Raise `shared.conversation.errors.RetryLater` for what a retry can fix, `NeedsReview` for
        what a
        person must handle, `DeliveryUnknown` when the request may have reached the provider
        without an answer (never retried: it may be a second copy).
        """
        ...

    # True: `hand_over` may be called again for a batch whose earlier hand-over a worker's
    # death interrupted; it then reads `delivery.state.journal.steps` and repeats no step it
    # began (shared/conversation/review_journal.py). Otherwise a hand-over is never called twice
    # for one
    # batch.
    resumes_hand_over: bool

    async def hand_over(
        self, batch: Batch, reason: str, detail: str, *, delivery: Delivery | None = None
    ) -> bool | str:
        """The batch was parked for review: give the conversation to a human. True once the
        provider was told, False where it has no such thing (WhatsApp), a text when the
        outcome is not that simple (it goes on the review item: "unknown: ..." when a step
        got no answer); raise on failure. Before each step that tells someone something,
        mark it in `delivery.state.journal.steps` and `await delivery.save_journal()`."""
        ...
