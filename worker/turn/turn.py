"""One turn: a claimed batch answered, retried or parked for review, under its lease.

The turn asks the brain (unless an earlier attempt stored a reply), stores the reply before
the first part goes out, records each part the provider accepted, and finishes: done (the
exchange remembered), retry (with backoff, until `MAX_ATTEMPTS`) or review; while the AI fails
as a whole it waits instead, its attempts not counted (worker/brains/ai_pause.py). Every Redis call
is token-checked: a turn whose lease was lost changes nothing, and the renewal loop
(worker/fleet/leases.py) cancels it before another worker may take the batch over. A review is
journaled on the batch before the provider hears of it (shared/conversation/review_journal.py), so a
resumed batch finishes that same review and hands the conversation over at most once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.conversation import turn_state
from shared.conversation.batch import Batch
from shared.conversation.errors import (
    DeliveryUnknown,
    HandOverRequested,
    LeaseLost,
    NeedsReview,
)
from shared.conversation.presentation import exchange
from shared.conversation.turn_state import Delivery, TurnState
from shared.conversation.unknowns import UnknownDelivery
from shared.fleet import turn_figures
from shared.senders.formatting import for_channel
from shared.senders.loading import Sender, takes_delivery
from shared.senders.split import WHATSAPP_MAX_CHARS, split_reply
from shared.settings import Settings
from worker.brains.ai_pause import AIPause, AIPaused
from worker.brains.loading import Brain
from worker.conversation_store import ConversationStore
from worker.fleet.leases import Leases
from worker.turn.endings import TurnEndings, log_review, settle_hand_over_text, turn_fields
from worker.turn.late_failures import LateFailure
from worker.turn.typing_indicator import typing_kept_up

log = logging.getLogger(__name__)
T = TypeVar("T")
# The review journal's step of the text the AI's hand-over sends (HandOverRequested).
HAND_OVER_TEXT = "hand_over_text"


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
    def __init__(self, batch: Batch, tools: TurnTools) -> None:
        self.batch = batch
        self.state = TurnState.resumed(batch)
        self._tools = tools
        self.store = tools.store
        self.sender = tools.senders.get(batch.channel)
        self._delivery = LeasedDelivery(self)
        self._endings = TurnEndings(self)

    async def run(self) -> None:
        with turn_state.running(self.state):
            await self._run()
        await self._record_figures()

    async def _record_figures(self) -> None:
        """Add this attempt's AI calls, sends and tokens to the tenant's figures: one round
        of HINCRBYs (shared/fleet/turn_figures.py); best effort, after the finish."""
        state = self.state
        increments = turn_figures.increments(
            state.ai_calls_ms, state.sends_ms, state.usage.tokens()
        )
        if not increments:
            return
        try:
            await self.store.add_figures(self.batch.tenant, increments)
        except Exception as exc:
            log.info("turn figures not recorded tenant=%s: %r", self.batch.tenant, exc)

    async def _run(self) -> None:
        batch, state = self.batch, self.state
        if "late_jobs" in batch.fields:
            # Not an answer to the person: Meta reported a sent part undelivered (the intake
            # made this batch of it: shared/lua/lib/outbound.lua).
            await LateFailure(self).run()
            return
        if state.journal is not None:
            # An earlier attempt decided on review and its worker stopped before the finish:
            # finish that review. Running the turn again could send what is not to be sent
            # (a part whose outcome is unknown) or hand the conversation over a second time.
            log.info(
                "finishing the review an earlier attempt began tenant=%s batch=%s reason=%s",
                batch.tenant,
                batch.id,
                state.journal.reason,
                extra=turn_fields(batch, "review"),
            )
            state.delivery_unknown = state.journal.delivery_unknown
            settle_hand_over_text(state.journal)
            await self._endings.review(state.journal.reason, state.journal.detail)
            return
        # Late is worse than never (invariant 6): a person answers a batch this old.
        age_ms = batch.claimed_ms - batch.oldest_ts * 1000
        if not batch.requeued and batch.oldest_ts and age_ms > self.settings.review_after_s * 1000:
            log_review(batch, "too_old")
            await self._endings.review("too_old", f"oldest message {age_ms / 1000:.0f}s old")
            return
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
            remember = b""
            # A reply replaced by a template never reached the person: not part of the chat.
            if reply and not state.template_sent:
                sent = [*state.sent_parts.values(), *(state.unrecorded_part or ("", ""))[1:]]
                remember = orjson.dumps(
                    exchange(batch, self.settings, reply, sent, state.media_notes)
                )
            last = state.unrecorded_part
            await self.finish(lambda: self.store.finish_done(batch, remember, last))
            log.debug("turn done batch=%s", batch.id, extra=turn_fields(batch, "done"))

    @property
    def settings(self) -> Settings:
        return self._tools.settings

    async def _reply(self) -> str | None:
        """Ask the brain (unless an earlier attempt stored a reply) and send what is not sent.

        The reply is stored on the batch before the first part goes out, and each part the
        provider accepted is recorded with its id, so a resumed or retried turn neither asks
        the AI again nor re-sends an accepted part.
        """
        batch, sender = self.batch, self.sender
        if sender is None:
            raise NeedsReview("no_sender", f"no sender configured for channel {batch.channel!r}")
        reply = self.state.reply
        can_send_text = getattr(sender, "can_send_text", None)
        if reply is None and can_send_text is not None and not can_send_text(batch):
            # The window is known to be closed: only the tenant's template can go out (or the
            # batch goes to review), so no AI answer is bought and no typing promises one.
            await self.send_parts(sender, [""])
            return None
        if reply is None:
            pause = self._tools.ai_pause
            admission = await pause.gate()  # while the AI is paused the batch waits: AIPaused
            begin = getattr(sender, "begin_turn", None)
            # Read receipt + typing indicator, where the provider has it; the probe of a
            # paused AI shows them only once the AI answered.
            if begin is not None and not admission.probe:
                await begin(batch)
            typing = (
                contextlib.nullcontext()
                if admission.probe
                else typing_kept_up(sender, batch, self.settings.typing_refresh_s)
            )
            async with typing:
                answer = await pause.ask(admission, self._ask_brain)
                if begin is not None and admission.probe:
                    await begin(batch)
                if not answer:
                    return None
                reply = await self._while_leased(
                    lambda: self.store.save_reply(batch, answer), "store the reply"
                )
            if reply is None:
                raise LeaseLost
            self.state.reply = reply
        limit = getattr(sender, "max_part_chars", WHATSAPP_MAX_CHARS)
        await self.send_parts(sender, split_reply(for_channel(batch.channel, reply), limit))
        return reply

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
            usage = state.usage
            if usage.calls:
                log.info(
                    "ai usage tenant=%s batch=%s calls=%d input=%d output=%d"
                    " cache_read=%d cache_write=%d",
                    *(batch.tenant, batch.id, usage.calls, usage.input_tokens),
                    *(usage.output_tokens, usage.cache_read_input_tokens),
                    usage.cache_creation_input_tokens,
                    extra={**turn_fields(batch, "ai"), **asdict(usage)},
                )

    async def send_parts(self, sender: Sender, parts: list[str], record_last: bool = False) -> None:
        """Send the parts not sent yet, recording each but the last (the finish does that,
        unless `record_last`)."""
        batch, state = self.batch, self.state
        state.parts_total = len(parts)
        for index, part in enumerate(parts):
            if index in state.sent_parts:
                continue
            asked_ms = int(time.time() * 1000)
            try:
                provider_id = await self._timed_send(sender, part, index)
            except DeliveryUnknown as exc:
                # Not retried (it may be a second copy), not counted as sent: a person is told.
                state.delivery_unknown = UnknownDelivery(
                    what=exc.what,
                    part=index,
                    parts_total=len(parts),
                    at_ms=exc.at_ms or asked_ms,
                    error=exc.detail,
                    text=exc.label if exc.what == "template" else part,
                )
                raise NeedsReview(exc.reason, state.delivery_unknown.sentence()) from exc
            if index == len(parts) - 1 and not record_last:
                # The finish records the last part in the same script call (one call fewer
                # per turn; a crash in between re-sends it, exactly as before recording).
                state.unrecorded_part = (index, provider_id)
                break
            recorded = await self._while_leased(
                functools.partial(self.store.record_part, batch, index, provider_id),
                "record a part",
            )
            if not recorded:
                raise LeaseLost
            state.sent_parts[index] = provider_id

    async def _timed_send(self, sender: Sender, part: str, index: int) -> str:
        """`sender.send`, its latency kept for the turn's figures whatever the outcome."""
        started = time.perf_counter()
        try:
            return await self.call_sender(sender.send, self.batch, part, index) or ""
        finally:
            self.state.sends_ms.append((time.perf_counter() - started) * 1000)

    async def call_sender(self, method: Callable[..., Awaitable[T]], *args: Any) -> T:
        """A sender's method, given the turn's `Delivery` if it declares that parameter."""
        if takes_delivery(method):
            return await method(*args, delivery=self._delivery)
        return await method(*args)

    async def note_template(self, sending: bool, part: int) -> None:
        """`Delivery.note_template`: persist, under the lease, whether the template went out."""
        batch = self.batch
        noted = await self._while_leased(
            lambda: self.store.mark_template(batch, sending, part), "note a template"
        )
        if not noted:
            raise LeaseLost
        self.state.template_sent = sending
        self.state.template_part = part if sending else None

    async def save_journal(self) -> None:
        """`Delivery.save_journal`: write the review journal on the batch, under the lease."""
        batch, journal = self.batch, self.state.journal
        assert journal is not None
        saved = await self._while_leased(
            lambda: self.store.save_journal(batch, journal), "journal the review"
        )
        if not saved:
            raise LeaseLost

    async def silence(self, why: str) -> None:
        """The bot is silent in this conversation from now on (a Chatwoot hand-over: a person
        answers there), until it is pending again or resolved (shared/lua/lib/silence.lua)."""
        await self._while_leased(lambda: self.store.silence(self.batch, why), "silence the bot")

    async def finish(self, call: Callable[[], Awaitable[bool]]) -> None:
        if not await self._while_leased(call, "finish the turn"):
            log.warning(
                "lease lost before finish tenant=%s batch=%s", self.batch.tenant, self.batch.id
            )

    async def leased(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """One Redis call of the turn's helpers (worker/turn/late_failures.py), as
        `_while_leased`."""
        return await self._while_leased(call, what)

    async def _while_leased(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """One of the turn's Redis calls; while Redis does not answer, try again for as long as
        the turn holds its lease.

        Giving up at the first error would abandon the turn: it would be resumed after the
        lease and re-send the part the provider accepted but Redis had not recorded yet (the
        chaos suite found this at Redis stalls and restarts). The calls are token-checked
        and idempotent, so repeating one that did run, its answer lost, changes nothing. The
        renewal loop cancels the turn before its lease can end, which also ends the retries.
        """
        batch = self.batch
        delay = 0.05
        while True:
            try:
                return await call()
            # Redis away or slow; an error answer (a script error) would only repeat itself.
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                until = self._tools.leases.retry_until(batch)
                if asyncio.get_running_loop().time() + delay >= until:
                    raise
                log.warning(
                    "redis did not %s, retrying within the lease tenant=%s batch=%s: %r",
                    what,
                    batch.tenant,
                    batch.id,
                    exc,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)


class LeasedDelivery(Delivery):
    """The `Delivery` of a worker's turn: each write goes to the batch in Redis, under the
    lease, before the state changes."""

    def __init__(self, turn: Turn) -> None:
        super().__init__(turn.state)
        self._turn = turn

    async def note_template(self, sending: bool, part: int) -> None:
        await self._turn.note_template(sending, part)

    async def save_journal(self) -> None:
        await self._turn.save_journal()
