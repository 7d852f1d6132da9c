"""The leases of this process's running turns: one renewal loop keeps them all alive.

Every running turn holds its person's lock for `LEASE_S`; the loop extends all of them every
`LEASE_RENEW_S`, in one script call per tenant. A turn whose lease cannot be proven any more
(the renewal says it was lost, or Redis does not answer until the lease is about to end) is
cancelled a margin before another worker may take the batch over, so two turns of one person
never overlap (invariant 3, docs/invariants.md). A lease is never released while its turn
runs, not even at shutdown: the turn ends it with its finish, or it expires.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from shared.conversation.batch import Batch
from shared.settings import Settings
from worker.conversation_store import ConversationStore

log = logging.getLogger(__name__)


@dataclass
class RunningTurn:
    batch: Batch
    lease_deadline: float  # loop time after which the lease may have ended in Redis
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    # Its finish is on its way: the finish, token-checked, decides; a renewal does not stop it.
    finishing: bool = False


class Leases:
    """The running turns by (tenant, person), each with the loop time its lease may end."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._turns: dict[tuple[str, str], RunningTurn] = {}

    def __len__(self) -> int:
        return len(self._turns)

    def add(self, batch: Batch, loop_now: float) -> RunningTurn:
        """A turn just claimed: its lease runs `LEASE_S` from the claim."""
        turn = RunningTurn(batch, lease_deadline=loop_now + self._settings.lease_s)
        self._turns[(batch.tenant, batch.person)] = turn
        return turn

    def remove(self, batch: Batch) -> None:
        """The turn of `batch` ended. Only its own entry goes: once its finish released the
        person's lock, the person's next batch may already run here while this turn's task
        ends, and that turn's lease must stay renewed."""
        key = (batch.tenant, batch.person)
        turn = self._turns.get(key)
        if turn is not None and turn.batch is batch:
            del self._turns[key]

    def finishing(self, batch: Batch) -> None:
        """The turn of `batch` sends its finish, its last write: from now on a renewal that
        finds its lock gone (released by that finish in the same round, or lost: then the
        finish changes nothing and says so) leaves it be. The lease's deadline still stops
        it, while Redis does not answer."""
        turn = self._turns.get((batch.tenant, batch.person))
        if turn is not None and turn.batch is batch:
            turn.finishing = True

    def tasks(self) -> list[asyncio.Task[None]]:
        return [t.task for t in self._turns.values() if t.task]

    @property
    def margin_s(self) -> float:
        """How long before its lease can end in Redis a turn is stopped."""
        return min(1.0, self._settings.lease_s * 0.1)

    def retry_until(self, batch: Batch) -> float:
        """The loop time until which a Redis call of this batch's turn may be retried: the
        turn is cancelled then (0 when the batch has no running turn)."""
        turn = self._turns.get((batch.tenant, batch.person))
        return turn.lease_deadline - self.margin_s if turn else 0.0

    async def renew_forever(self, store: ConversationStore) -> None:
        """The renewal loop; runs until cancelled."""
        while True:
            await asyncio.sleep(self._next_renewal_in())
            if self._turns:
                await self._renew(store)
            self._stop_ending()

    async def _renew(self, store: ConversationStore) -> None:
        started = asyncio.get_running_loop().time()
        by_tenant: dict[str, list[RunningTurn]] = {}
        for turn in self._turns.values():
            by_tenant.setdefault(turn.batch.tenant, []).append(turn)
        try:
            results = await asyncio.gather(
                *(
                    store.renew(t, [(x.batch.person, x.batch.token) for x in group])
                    for t, group in by_tenant.items()
                )
            )
        except (RedisError, OSError) as exc:
            log.warning("lease renewal failed: %s", exc)
            return
        for group, oks in zip(by_tenant.values(), results, strict=True):
            for turn, ok in zip(group, oks, strict=True):
                if ok:
                    turn.lease_deadline = started + self._settings.lease_s
                elif turn.finishing:
                    continue  # its finish's own answer says whether the lease held
                elif turn.task and not turn.task.done():
                    log.error(
                        "lease lost tenant=%s batch=%s: stopping the turn",
                        turn.batch.tenant,
                        turn.batch.id,
                    )
                    turn.task.cancel()

    def _stop_ending(self) -> None:
        """Cancel the turns whose lease may end within the margin, unrenewed."""
        now = asyncio.get_running_loop().time()
        for turn in list(self._turns.values()):
            if now >= turn.lease_deadline - self.margin_s and turn.task and not turn.task.done():
                log.error(
                    "lease about to end unrenewed tenant=%s batch=%s: stopping it",
                    turn.batch.tenant,
                    turn.batch.id,
                )
                turn.task.cancel()

    def _next_renewal_in(self) -> float:
        delay = self._settings.lease_renew_s
        if self._turns:
            soonest = min(t.lease_deadline for t in self._turns.values())
            delay = min(delay, soonest - self.margin_s - asyncio.get_running_loop().time())
        return max(0.05, delay)
