"""The writes a turn makes on its batch in Redis, each under the turn's lease.

Every write is a token-checked script call: once another worker may hold the person's lock, it
changes nothing and answers so. `UnderLease` turns that answer into `LeaseLost` (the turn stops
where it is: the batch resumes elsewhere after the lease), except at the finish, where there is
nothing left to stop and a line is logged. While Redis does not answer, a write is tried again
for as long as the turn holds its lease; the renewal loop (worker/fleet/leases.py) cancels the
turn before the lease can end, which also ends the retries. The turn, its endings and its late
failures all write through here, and a sender's writes too (`LeasedDelivery`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.conversation.batch import Batch
from shared.conversation.errors import LeaseLost
from shared.conversation.turn_state import Delivery, TurnState
from shared.fleet import turn_figures
from worker.conversation_store import ConversationStore
from worker.fleet.leases import Leases

log = logging.getLogger("worker.turn.turn")  # one logger for a turn's lines, whichever module
T = TypeVar("T")
# Redis away or slow; an error answer (a script error) would only repeat itself.
REDIS_AWAY = (RedisConnectionError, RedisTimeoutError, OSError)


class UnderLease:
    """One turn's writes on its batch: each checks the turn's token, and each but the finish
    raises `LeaseLost` when the lease is gone. The state changes only after the write."""

    def __init__(
        self, batch: Batch, state: TurnState, store: ConversationStore, leases: Leases
    ) -> None:
        self.batch = batch
        self.state = state
        self._store = store
        self._leases = leases
        self._answers_lost = 0  # tries whose answer never came (Redis away); some may have run

    async def save_reply(self, answer: str) -> str:
        """Store the reply before its first part goes out; the reply the batch holds (an
        earlier attempt's wins) becomes the turn's."""
        batch = self.batch
        reply = await self._write(lambda: self._store.save_reply(batch, answer), "store the reply")
        if reply is None:
            raise LeaseLost
        self.state.reply = reply
        return reply

    async def record_part(self, index: int, provider_id: str, what: str = "a part") -> None:
        """Part `index` was accepted as `provider_id`: a resumed turn never sends it again."""
        batch = self.batch
        recorded = await self._write(
            lambda: self._store.record_part(batch, index, provider_id), f"record {what}"
        )
        _held(recorded)
        self.state.sent_parts[index] = provider_id

    async def note_template(self, sending: bool, part: int) -> None:
        """`Delivery.note_template`: whether the template goes out in place of `part`."""
        batch = self.batch
        noted = await self._write(
            lambda: self._store.mark_template(batch, sending, part), "note a template"
        )
        _held(noted)
        self.state.template_sent = sending
        self.state.template_part = part if sending else None

    async def save_journal(self) -> None:
        """`Delivery.save_journal`: the review journal, as far as the hand-over got."""
        batch, journal = self.batch, self.state.journal
        assert journal is not None
        saved = await self._write(
            lambda: self._store.save_journal(batch, journal), "journal the review"
        )
        _held(saved)

    async def mark_memory(self, updates: list[tuple[str, bytes]]) -> None:
        """Replace the memory's exchanges of the given first reply ids (a late failure)."""
        batch = self.batch
        replaced = await self._write(
            lambda: self._store.mark_memory(batch, updates), "mark the memory"
        )
        _held(replaced >= 0)

    async def silence(self, why: str) -> None:
        """The bot is silent in this conversation from now on (a Chatwoot hand-over: a person
        answers there), until it is pending again or resolved (shared/lua/lib/silence.lua)."""
        await self._write(lambda: self._store.silence(self.batch, why), "silence the bot")

    async def finish_done(self, remember: bytes) -> None:
        """Done: `remember` (JSON) joins the person's memory, the last part is recorded."""
        batch, last, figures = self.batch, self.state.unrecorded_part, self._figures()
        await self._finish(lambda: self._store.finish_done(batch, remember, last, figures))

    async def finish_retry(self, delay_s: float, error: str, count_attempt: bool = True) -> None:
        """Due again after `delay_s`; `count_attempt=False` while the AI fails as a whole."""
        batch, figures = self.batch, self._figures()
        await self._finish(
            lambda: self._store.finish_retry(batch, delay_s, error, count_attempt, figures)
        )

    async def finish_review(
        self,
        reason: str,
        detail: str,
        at_ms: int,
        hand_over: str = "",
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Parked for review, with what the turn's state says of its sends and hand-over."""
        batch, state, figures = self.batch, self.state, self._figures()
        await self._finish(
            lambda: self._store.finish_review(
                batch, reason, detail, at_ms, hand_over, state=state, extra=extra, figures=figures
            )
        )

    def _figures(self) -> tuple[tuple[str, int], ...]:
        """What this attempt adds to the tenant's figures, written with its finish."""
        state = self.state
        return turn_figures.pairs(state.ai_calls_ms, state.sends_ms, state.usage.tokens())

    async def _finish(self, call: Callable[[], Awaitable[bool]]) -> None:
        # From here on the turn only waits for its finish's answer: a renewal that finds the
        # lock released (by this very finish, in the same round) must not stop it.
        self._leases.finishing(self.batch)
        lost_before = self._answers_lost
        if await self._write(call, "finish the turn"):
            self.state.figures_recorded = True
        elif self._answers_lost > lost_before:
            # An earlier try ran, its answer lost (a Redis that froze runs what it read once it
            # continues): while the lease holds nothing else releases a running turn's lock
            # (invariant 3), so the lock this try found released is that finish's doing, but
            # for a lease already lost before it. The turn is finished and its figures written:
            # not added a second time (a lost lease's figures would go uncounted, not twice).
            self.state.figures_recorded = True
            log.info(
                "finish done by an earlier try whose answer was lost tenant=%s batch=%s",
                self.batch.tenant,
                self.batch.id,
            )
        else:
            log.warning(
                "lease lost before finish tenant=%s batch=%s", self.batch.tenant, self.batch.id
            )

    async def _write(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """`call`; while Redis does not answer, again for as long as the turn holds its lease.

        Giving up at the first error would abandon the turn: it would be resumed after the
        lease and re-send the part the provider accepted but Redis had not recorded yet (the
        chaos suite found this at Redis stalls and restarts). The calls are token-checked
        and idempotent, so repeating one that did run, its answer lost, changes nothing.
        """
        delay = 0.05
        while True:
            try:
                return await call()
            except REDIS_AWAY as exc:
                self._answers_lost += 1
                until = self._leases.retry_until(self.batch)
                if asyncio.get_running_loop().time() + delay >= until:
                    raise
                self._log_retry(what, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _log_retry(self, what: str, exc: Exception) -> None:
        log.warning(
            "redis did not %s, retrying within the lease tenant=%s batch=%s: %r",
            *(what, self.batch.tenant, self.batch.id, exc),
        )


def _held(written: bool) -> None:
    """A token-checked write's answer: `LeaseLost` when it says the lock is not ours."""
    if not written:
        raise LeaseLost


class LeasedDelivery(Delivery):
    """The `Delivery` of a worker's turn: each write a sender makes goes to the batch in
    Redis, under the lease, before the state changes."""

    def __init__(self, lease: UnderLease) -> None:
        super().__init__(lease.state)
        self._lease = lease

    async def note_template(self, sending: bool, part: int) -> None:
        await self._lease.note_template(sending, part)

    async def save_journal(self) -> None:
        await self._lease.save_journal()
