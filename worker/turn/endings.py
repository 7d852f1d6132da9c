"""How a turn ends when it does not end done: a retry with backoff, a wait for the AI (the
fleet's pause, attempts not counted), or a review, with the conversation handed over to a person
where the provider can (Chatwoot, where the bot is then silent in that conversation) and, when
the AI asked for a person, the tenant's hand-over text sent first. A review is journaled on the
batch before the provider hears of it (shared/conversation/review_journal.py): a worker that dies
meanwhile leaves the batch to be resumed by another, which finishes this same review and hands
over at most once. The endings write through the turn's lease (worker/turn/under_lease.py) and
send through its sender (worker/turn/sending.py); they know nothing else of the turn.
"""

from __future__ import annotations

import logging
import time

from shared.chatwoot import CHANNEL as CHATWOOT
from shared.conversation.batch import Batch
from shared.conversation.errors import (
    DELIVERY_UNKNOWN,
    AIUnavailable,
    HandOverRequested,
    LeaseLost,
    NeedsReview,
)
from shared.conversation.review_journal import SENDING, ReviewJournal
from shared.conversation.unknowns import utc
from shared.logs import redact_person
from shared.settings import Settings
from worker.brains.ai_pause import AIPaused
from worker.turn.sending import Sending
from worker.turn.under_lease import UnderLease

log = logging.getLogger("worker.turn.turn")  # one logger for a turn's lines, whichever module
# The review journal's step of the text the AI's hand-over sends (HandOverRequested).
HAND_OVER_TEXT = "hand_over_text"


class TurnEndings:
    """The endings of one turn other than done: each writes under the turn's lease, and the
    hand-overs send through the turn's sender."""

    def __init__(self, settings: Settings, lease: UnderLease, sending: Sending) -> None:
        self._settings = settings
        self._lease = lease
        self._sending = sending
        self.batch = lease.batch
        self.state = lease.state

    async def failed(self, exc: Exception) -> None:
        """A retry with backoff, or a review once the batch failed `MAX_ATTEMPTS` times."""
        batch, s = self.batch, self._settings
        attempts = batch.attempt + 1
        error = f"{type(exc).__name__}: {exc}"
        if attempts >= s.max_attempts:
            log.warning(
                "batch failed %d times, to review tenant=%s batch=%s: %s",
                attempts,
                batch.tenant,
                batch.id,
                error,
                extra=turn_fields(batch, "review"),
            )
            await self.review("max_attempts", error)
        else:
            delay = s.retry_base_s * 2 ** (attempts - 1)
            log.warning(
                "turn failed (attempt %d), retry in %.1fs tenant=%s batch=%s: %s",
                attempts,
                delay,
                batch.tenant,
                batch.id,
                error,
                extra=turn_fields(batch, "retry"),
            )
            await self._lease.finish_retry(delay, error)

    async def wait_for_ai(self, paused: AIPaused) -> None:
        """Put the batch back until the AI pause ends: a retry whose attempt is not counted."""
        batch = self.batch
        # One line per failed AI call; a batch the pause kept from calling logs at DEBUG.
        level = logging.INFO if isinstance(paused.__cause__, AIUnavailable) else logging.DEBUG
        log.log(
            level,
            "batch waits %.1fs for the AI tenant=%s batch=%s: %s",
            *(paused.wait_s, batch.tenant, batch.id, paused.detail),
            extra=turn_fields(batch, "wait"),
        )
        await self._lease.finish_retry(paused.wait_s, paused.detail, count_attempt=False)

    async def ai_hand_over(self, request: HandOverRequested) -> None:
        """The AI asked for a person: the review is journaled, its text sent (each part
        recorded), then the batch parked. A worker dying after the journal leaves the batch
        to be finished as this review: the text is never sent again."""
        journal = ReviewJournal(request.reason, request.detail, int(time.time() * 1000))
        journal.steps[HAND_OVER_TEXT] = SENDING
        self.state.journal = journal
        try:
            await self._lease.save_journal()
            journal.steps[HAND_OVER_TEXT] = await self._send_hand_over_text(request.text)
            await self._lease.save_journal()
        except LeaseLost:
            log.warning("lease lost in a hand-over batch=%s", self.batch.id)
            return
        await self.review(request.reason, request.detail, resumed=False)

    async def _send_hand_over_text(self, text: str) -> str:
        """Send `text` as a reply; what came of it ("done", "failed: ...", "unknown: ...")."""
        assert self._sending.sender is not None  # checked before the brain was asked
        try:
            await self._sending.send_parts(self._sending.sender.reply_parts(text), record_last=True)
        except LeaseLost:
            raise
        except NeedsReview as exc:  # a send nobody can confirm is counted once, as the part
            return "see delivery_unknown" if self.state.delivery_unknown else f"failed: {exc}"[:500]
        except Exception as exc:
            return f"failed: {type(exc).__name__}: {exc}"[:500]
        return "done"

    async def review(self, reason: str, detail: str, *, resumed: bool | None = None) -> None:
        """Park the batch for review, after handing the conversation to a person where the
        provider can (Chatwoot). The decision is journaled on the batch first, still under
        the lease (shared/conversation/review_journal.py): a worker that dies meanwhile leaves
        the batch to be resumed by another, which finishes this same review and hands over at
        most once."""
        batch, state = self.batch, self.state
        if resumed is None:
            resumed = state.journal is not None
        try:
            if state.journal is None:
                now_ms = int(time.time() * 1000)
                state.journal = ReviewJournal(reason, detail, now_ms, state.delivery_unknown)
                await self._lease.save_journal()
            outcome = await self._hand_over(state.journal, reason, detail, resumed)
            if outcome and batch.channel == CHATWOOT:
                # A person answers in Chatwoot now: the customer's next messages go to the
                # memory, not to the AI, until the conversation is back with the bot. A
                # hand-over Chatwoot refused (or whose outcome is unknown) may have left the
                # conversation pending: then "pending" on a later message does not mean a
                # person gave it back (shared/lua/lib/silence.lua `held_silent`).
                why = "hand_over" if outcome == "done" else "hand_over_unconfirmed"
                await self._lease.silence(why)
        except LeaseLost:
            log.warning("lease lost during the review tenant=%s batch=%s", batch.tenant, batch.id)
            return
        await self._lease.finish_review(reason, detail, batch.claimed_ms, outcome)

    async def _hand_over(
        self, journal: ReviewJournal, reason: str, detail: str, resumed: bool
    ) -> str:
        """What the review item says of the hand-over: "done", "failed: <error>", "unknown:
        <why>" (best effort: the item is stored either way), or "" where the provider has none
        (WhatsApp). `resumed`: an earlier attempt's worker died after journaling the review.
        Raises LeaseLost if the journal cannot be written any more."""
        batch, sender = self.batch, self._sending.sender
        if sender is None or not sender.hands_over:
            return ""
        if resumed and not sender.resumes_hand_over:
            # It may have told the provider already; at most once, so not again.
            outcome = (
                "unknown: a worker stopped during the hand-over begun at "
                f"{utc(journal.at_ms)}; it is not repeated"
            )
            journal.steps["hand_over"] = outcome  # counted with the other unknowns
            return outcome
        try:
            told = await sender.hand_over(batch, reason, detail, delivery=self._sending.delivery)
        except LeaseLost:
            raise
        except Exception as exc:
            log.warning(
                "hand-over failed tenant=%s batch=%s: %r",
                batch.tenant,
                batch.id,
                exc,
                extra=turn_fields(batch, "review"),
            )
            return f"failed: {type(exc).__name__}: {exc}"[:500]
        if isinstance(told, str):
            return told[:500]
        return "done" if told else ""


def settle_hand_over_text(journal: ReviewJournal) -> None:
    """A resumed hand-over whose text was being sent: it is unknown, never sent again."""
    if journal.steps.get(HAND_OVER_TEXT) == SENDING:
        journal.steps[HAND_OVER_TEXT] = (
            "unknown: the worker sending it stopped before the provider answered; not sent again"
        )


def log_review(batch: Batch, reason: str) -> None:
    """The line of a batch going to review (a failed-too-often batch logs its own error)."""
    # A send nobody can confirm is what a person must act on: above INFO.
    log.log(
        logging.WARNING if reason == DELIVERY_UNKNOWN else logging.INFO,
        "batch to review tenant=%s batch=%s reason=%s",
        batch.tenant,
        batch.id,
        reason,
        extra=turn_fields(batch, "review"),
    )


def turn_fields(batch: Batch, outcome: str) -> dict[str, str]:
    """Structured log fields of a turn; the person only redacted."""
    return {
        "tenant": batch.tenant,
        "person": redact_person(batch.person),
        "batch": batch.id,
        "outcome": outcome,
    }
