"""`Sender`: the base class of every sender, the worker's half of a provider.

A sender sends one part of a reply (`send`, the one method a subclass must write). What else a
provider can do is an optional capability: a method here whose default is what a sender
without it gets (no typing indicator, text always allowed, no hand-over, no template), and, for
the three the turn must not even try without, a class attribute that switches it on
(`keeps_typing`, `hands_over`, `sends_templates`). The WhatsApp, Chatwoot and outbox senders
subclass it; a plug-in's object that does not (`SENDER=package.module:attr`) is adapted to it
where it is loaded (shared/senders/loading.py), so the worker's turns and the ops page's
replies by hand only ever see this class.

`send`, `hand_over` and `send_template` always get the turn's `Delivery`
(shared/conversation/turn_state.py): what the turn has done so far (`delivery.state`: the
template noted, the review journal, a send nobody can confirm) and the writes a sender makes
about it (`note_template`, `save_journal`), persisted under the lease in a worker's turn.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from shared.conversation.batch import Batch
from shared.conversation.turn_state import Delivery
from shared.senders.formatting import for_channel
from shared.senders.split import WHATSAPP_MAX_CHARS, split_reply


class Sender(ABC):
    """Sends a conversation's replies through one provider; see the module docstring."""

    # The longest part the provider takes: a reply is split to fit (`reply_parts`).
    max_part_chars: int = WHATSAPP_MAX_CHARS
    # True: `keep_typing` is called every TYPING_REFRESH_S while the AI works.
    keeps_typing: bool = False
    # True: `hand_over` is called when a batch is parked for review.
    hands_over: bool = False
    # True: `hand_over` may be called again for a batch whose earlier hand-over a worker's
    # death interrupted; it then reads `delivery.state.journal.steps` and repeats no step it
    # began (shared/conversation/review_journal.py). Otherwise a hand-over is called at most
    # once per batch.
    resumes_hand_over: bool = False
    # True: `send_template` sends the tenant's template alone (a late 131047).
    sends_templates: bool = False

    @abstractmethod
    async def send(self, batch: Batch, text: str, part: int, *, delivery: Delivery) -> str | None:
        """Send part number `part` of the reply; the provider's message id (None if it gives
        none; delivery statuses are tracked by that id).

        Raise `shared.conversation.errors.RetryLater` for what a retry can fix, `NeedsReview`
        for what a person must handle, `DeliveryUnknown` when the request may have reached the
        provider without an answer (never retried: it may be a second copy); anything else is
        retried, then reviewed after MAX_ATTEMPTS.
        """

    def can_send_text(self, batch: Batch) -> bool:
        """False when no free text can reach the person (WhatsApp's closed window): no AI is
        asked and `send(batch, "", 0)` sends the provider's fallback (a template) or raises
        `NeedsReview`."""
        return True

    async def begin_turn(self, batch: Batch) -> None:
        """Before the AI is asked: read receipt / typing indicator (best effort)."""
        return None  # none by default

    async def keep_typing(self, batch: Batch) -> None:
        """While the AI works, every TYPING_REFRESH_S (when `keeps_typing`): show typing again
        (best effort)."""
        return None  # none by default

    async def hand_over(
        self, batch: Batch, reason: str, detail: str, *, delivery: Delivery
    ) -> bool | str:
        """The batch was parked for review (called when `hands_over`): give the conversation
        to a person. True once the provider was told, False where it has no such thing, a text
        when the outcome is not that simple (it goes on the review item: "unknown: ..." when a
        step got no answer); raise on failure. Before each step that tells someone something,
        mark it in `delivery.state.journal.steps` and `await delivery.save_journal()`."""
        return False

    async def send_template(self, batch: Batch, part: int, *, delivery: Delivery) -> str:
        """The tenant's template alone, in place of part `part` (called when
        `sends_templates`): the provider's message id."""
        raise NotImplementedError(f"{type(self).__name__} sends no template")

    async def aclose(self) -> None:
        """Close the sender's clients (the worker stops, the ops page shuts down)."""
        return None  # none by default

    def reply_parts(self, text: str, *, formatted_for: str | None = None) -> list[str]:
        """The parts `text` goes out in, each at most `max_part_chars` long. `formatted_for`:
        the channel whose formatting the model's Markdown is turned into
        (shared/senders/formatting.py); without it the text goes out as written (a reply by
        hand, the tenant's hand-over text). Deterministic: a resumed turn gets the same parts."""
        if formatted_for is not None:
            text = for_channel(formatted_for, text)
        return split_reply(text, self.max_part_chars)
