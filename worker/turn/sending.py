"""What a turn sends through its channel's sender: the parts of a reply, each timed and
recorded under the lease once the provider accepted it, each given the turn's `Delivery`
(shared/senders/base.py).

A part already recorded (by an earlier attempt) is not sent again; a send nobody can confirm
(`DeliveryUnknown`) is never retried, it goes to review with what is known of it
(shared/conversation/unknowns.py). The turn, its endings (the AI's hand-over text) and its late
failures (the tenant's template) all send through here.
"""

from __future__ import annotations

import time

from shared.conversation.batch import Batch
from shared.conversation.errors import DeliveryUnknown, NeedsReview
from shared.conversation.turn_state import Delivery, TurnState
from shared.conversation.unknowns import UnknownDelivery
from shared.senders.base import Sender
from worker.turn.under_lease import LeasedDelivery, UnderLease


class Sending:
    """One turn's sends through `sender`, the sender of its batch's channel (None: none is
    configured, and the turn goes to review before anything is sent)."""

    def __init__(self, batch: Batch, sender: Sender | None, lease: UnderLease) -> None:
        self.batch = batch
        self.sender = sender
        self.state: TurnState = lease.state
        self._lease = lease
        # What the sender is given with each call: the turn's state, written under the lease.
        # Held here, not by the lease it writes through: a lease holding it back made each
        # turn a reference cycle, so a finished turn's batch, messages and state waited for
        # the cycle collector instead of going at once (its collections were ~15 % of the
        # worker's CPU; docs/benchmarks/worker.md).
        self.delivery: Delivery = LeasedDelivery(lease)

    async def send_parts(self, parts: list[str], record_last: bool = False) -> None:
        """Send the parts not sent yet, recording each but the last (the finish does that,
        unless `record_last`)."""
        state = self.state
        state.parts_total = len(parts)
        for index in range(len(parts)):
            if index in state.sent_parts:
                continue
            provider_id = await self._send(parts, index)
            if index == len(parts) - 1 and not record_last:
                # The finish records the last part in the same script call (one call fewer
                # per turn; a crash in between re-sends it, exactly as before recording).
                state.unrecorded_part = (index, provider_id)
                break
            await self._lease.record_part(index, provider_id)

    async def _send(self, parts: list[str], index: int) -> str:
        """Part `index` sent; its provider id. Its latency is kept for the turn's figures
        whatever the outcome. A send nobody can confirm is not retried (it may be a second
        copy) nor counted as sent: a person is told, through a review."""
        assert self.sender is not None  # checked before anything is sent
        asked_ms = int(time.time() * 1000)
        # One coroutine, not a timed one inside another: every part of every reply comes here.
        started = time.perf_counter()
        try:
            try:
                sent = await self.sender.send(
                    self.batch, parts[index], index, delivery=self.delivery
                )
            finally:
                self.state.sends_ms.append((time.perf_counter() - started) * 1000)
        except DeliveryUnknown as exc:
            unknown = UnknownDelivery(
                what=exc.what,
                part=index,
                parts_total=len(parts),
                at_ms=exc.at_ms or asked_ms,
                error=exc.detail,
                text=exc.label if exc.what == "template" else parts[index],
            )
            self.state.delivery_unknown = unknown
            raise NeedsReview(exc.reason, unknown.sentence()) from exc
        return sent or ""
