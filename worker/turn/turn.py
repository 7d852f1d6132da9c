"""One turn: a claimed batch answered, retried or parked for review, under its lease.

`Turn.run` is the batch's whole life, read in order: a late delivery failure or a review an
earlier attempt began ends as such; a batch too old for a reply goes to review; otherwise the
brain is asked (unless an earlier attempt stored a reply), the reply stored before its first
part goes out, each part the provider accepted recorded, and the batch finished done (the
exchange remembered). A turn that fails ends as retry (with backoff, until `MAX_ATTEMPTS`) or
review; while the AI fails as a whole it waits instead, its attempts not counted
(worker/brains/ai_pause.py).

Beside it: worker/turn/under_lease.py (every write, token-checked: a turn whose lease was lost
changes nothing, and the renewal loop, worker/fleet/leases.py, cancels it before another
worker may take the batch over), worker/turn/sending.py (the parts sent and recorded),
worker/turn/endings.py (retry, wait, review and the hand-overs) and
worker/turn/late_failures.py. A review is journaled on the batch before the provider hears of
it (shared/conversation/review_journal.py), so a resumed batch finishes that same review and
hands the conversation over at most once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import orjson

from shared.conversation import turn_state
from shared.conversation.batch import Batch
from shared.conversation.errors import HandOverRequested, LeaseLost, NeedsReview
from shared.conversation.presentation import exchange
from shared.conversation.turn_state import TurnState
from shared.fleet import turn_figures
from shared.senders.base import Sender
from shared.settings import Settings
from worker.brains.ai_pause import Admission, AIPause, AIPaused
from worker.brains.loading import Brain
from worker.conversation_store import ConversationStore
from worker.fleet.leases import Leases
from worker.turn.endings import TurnEndings, log_review, settle_hand_over_text, turn_fields
from worker.turn.late_failures import LateFailure
from worker.turn.sending import Sending
from worker.turn.typing_indicator import typing_kept_up
from worker.turn.under_lease import UnderLease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnTools:
    """What every turn of a worker uses, set up once at start-up."""

    settings: Settings
    store: ConversationStore
    brain: Brain
    senders: Mapping[str, Sender]  # channel -> its sender
    leases: Leases
    ai_pause: AIPause  # the fleet's pause of AI calls while the AI fails as a whole


class Turn:
    """One claimed batch's turn: `run` is its whole life, in order. Its writes go through
    `UnderLease`, its sends through `Sending`, its endings other than done to `TurnEndings`."""

    def __init__(self, batch: Batch, tools: TurnTools) -> None:
        self.batch = batch
        self.state = TurnState.resumed(batch)
        self.settings = tools.settings
        self._tools = tools
        self._lease = UnderLease(batch, self.state, tools.store, tools.leases)
        self._sending = Sending(batch, tools.senders.get(batch.channel), self._lease)
        self._ended_otherwise: TurnEndings | None = None

    @property
    def _endings(self) -> TurnEndings:
        """Made when a turn first needs it: most end done, without it."""
        if self._ended_otherwise is None:
            self._ended_otherwise = TurnEndings(self.settings, self._lease, self._sending)
        return self._ended_otherwise

    async def run(self) -> None:
        """The turn; its figures go with its finish, or after it when it had none."""
        # `turn_state.running`, spelled out: the three calls of a `with` block on every turn.
        entered = turn_state.CURRENT.set(self.state)
        try:
            await self._run()
        finally:
            turn_state.CURRENT.reset(entered)
        if not self.state.figures_recorded:
            await self._record_figures()

    async def _run(self) -> None:
        """A late failure, or a review an earlier attempt began, ends as such; a batch too
        old for a reply goes to review; any other is answered."""
        if "late_jobs" in self.batch.fields:
            # Not an answer to the person: Meta reported a sent part undelivered (the intake
            # made this batch of it: shared/lua/lib/outbound.lua).
            endings = self._endings
            await LateFailure(self.settings, self._lease, self._sending, endings).run()
        elif self.state.journal is not None:
            await self._finish_begun_review()
        elif age_ms := self._too_old_ms():
            log_review(self.batch, "too_old")
            await self._endings.review("too_old", f"oldest message {age_ms / 1000:.0f}s old")
        else:
            await self._answer()

    async def _finish_begun_review(self) -> None:
        """An earlier attempt decided on review and its worker stopped before the finish:
        finish that review. Running the turn again could send what is not to be sent (a part
        whose outcome is unknown) or hand the conversation over a second time."""
        batch, journal = self.batch, self.state.journal
        assert journal is not None
        log.info(
            "finishing the review an earlier attempt began tenant=%s batch=%s reason=%s",
            *(batch.tenant, batch.id, journal.reason),
            extra=turn_fields(batch, "review"),
        )
        self.state.delivery_unknown = journal.delivery_unknown
        settle_hand_over_text(journal)
        await self._endings.review(journal.reason, journal.detail)

    def _too_old_ms(self) -> float:
        """The batch's age when a person must answer it instead (late is worse than never,
        invariant 6); 0 when the AI may."""
        batch = self.batch
        if batch.requeued:
            return 0
        oldest_ts = batch.oldest_ts
        age_ms = batch.claimed_ms - oldest_ts * 1000
        return age_ms if oldest_ts and age_ms > self.settings.review_after_s * 1000 else 0

    async def _answer(self) -> None:
        """Reply and finish done, or end as the reply's failure says."""
        batch = self.batch
        try:
            reply = await self._reply()
        except AIPaused as exc:
            await self._endings.wait_for_ai(exc)
        except HandOverRequested as exc:
            log_review(batch, exc.reason)
            await self._endings.ai_hand_over(exc)
        except NeedsReview as exc:
            log_review(batch, exc.reason)
            await self._endings.review(exc.reason, exc.detail)
        except LeaseLost:
            log.warning("lease lost mid-turn tenant=%s batch=%s", batch.tenant, batch.id)
        except Exception as exc:
            await self._endings.failed(exc)
        else:
            await self._lease.finish_done(self._remembered(reply))
            if log.isEnabledFor(logging.DEBUG):  # its fields (a hash of the person) cost too
                log.debug("turn done batch=%s", batch.id, extra=turn_fields(batch, "done"))

    async def _reply(self) -> str | None:
        """Ask the brain (unless an earlier attempt stored a reply) and send what is not sent.

        The reply is stored on the batch before the first part goes out, and each part the
        provider accepted is recorded with its id, so a resumed or retried turn neither asks
        the AI again nor re-sends an accepted part.
        """
        batch, sender = self.batch, self._sending.sender
        if sender is None:
            raise NeedsReview("no_sender", f"no sender configured for channel {batch.channel!r}")
        reply = self.state.reply
        if reply is None and not sender.can_send_text(batch):
            # The window is known to be closed: only the tenant's template can go out (or the
            # batch goes to review), so no AI answer is bought and no typing promises one.
            await self._sending.send_parts([""])
            return None
        if reply is None:
            reply = await self._new_reply(sender)
            if reply is None:
                return None
        await self._sending.send_parts(sender.reply_parts(reply, formatted_for=batch.channel))
        return reply

    async def _new_reply(self, sender: Sender) -> str | None:
        """The brain's answer, stored on the batch (None: the brain has none). The read
        receipt and the typing indicator show meanwhile, where the provider has them."""
        batch, pause = self.batch, self._tools.ai_pause
        admission = await pause.gate()  # while the AI is paused the batch waits: AIPaused
        # The probe of a paused AI shows them only once the AI answered.
        if admission.probe:
            return await self._asked(sender, admission)
        await sender.begin_turn(batch)
        if not sender.keeps_typing:  # no block to keep it up in (an async `with` per turn)
            return await self._asked(sender, admission)
        async with typing_kept_up(sender, batch, self.settings.typing_refresh_s):
            return await self._asked(sender, admission)

    async def _asked(self, sender: Sender, admission: Admission) -> str | None:
        """The brain's answer asked for and stored (None: the brain has none)."""
        answer = await self._tools.ai_pause.ask(admission, self._ask_brain)
        if admission.probe:
            await sender.begin_turn(self.batch)
        if not answer:
            return None
        return await self._lease.save_reply(answer)

    async def _ask_brain(self) -> str | None:
        """The brain's answer. Its AI calls' latency and tokens are in the turn's state
        (`record_ai_call`); a brain that reports none counts as one call, timed here. The
        tokens are logged, one line a turn."""
        batch, state = self.batch, self.state
        welcome = self.settings.tenant(batch.tenant).welcome_text
        if welcome and batch.only_welcome:  # the person opened the chat: no AI call
            return welcome
        calls, asked = len(state.ai_calls_ms), time.perf_counter()
        try:
            return await self._tools.brain.reply(batch)
        finally:
            if len(state.ai_calls_ms) == calls:  # the brain reported no call itself
                state.ai_calls_ms.append((time.perf_counter() - asked) * 1000)
            if state.usage.calls:
                self._log_usage()

    def _log_usage(self) -> None:
        batch, usage = self.batch, self.state.usage
        if usage.calls:
            log.info(
                "ai usage tenant=%s batch=%s calls=%d input=%d output=%d"
                " cache_read=%d cache_write=%d",
                *(batch.tenant, batch.id, usage.calls, usage.input_tokens),
                *(usage.output_tokens, usage.cache_read_input_tokens),
                usage.cache_creation_input_tokens,
                extra={**turn_fields(batch, "ai"), **asdict(usage)},
            )

    def _remembered(self, reply: str | None) -> bytes:
        """The exchange the person's memory keeps of this turn (JSON); b"" for none."""
        state = self.state
        # A reply replaced by a template never reached the person: not part of the chat.
        if not reply or state.template_sent:
            return b""
        sent = [*state.sent_parts.values(), *(state.unrecorded_part or ("", ""))[1:]]
        return orjson.dumps(exchange(self.batch, self.settings, reply, sent, state.media_notes))

    async def _record_figures(self) -> None:
        """Add the AI calls, sends and tokens of an attempt that did not finish (its lease was
        lost) to the tenant's figures (shared/fleet/turn_figures.py); best effort."""
        state = self.state
        increments = turn_figures.pairs(state.ai_calls_ms, state.sends_ms, state.usage.tokens())
        if not increments:
            return
        try:
            await self._tools.store.add_figures(self.batch.tenant, increments)
        except Exception as exc:
            log.info("turn figures not recorded tenant=%s: %r", self.batch.tenant, exc)
