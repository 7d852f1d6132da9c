"""The typing indicator kept up while a turn runs longer than the provider shows it.

Meta drops WhatsApp's typing indicator after 25 s (or when the reply arrives); a turn whose AI
takes longer (a tool loop, a slow model) would leave the person looking at nothing. While the
block runs, the sender's `keep_typing(batch)` is called every `interval` seconds; senders
that do not keep typing (`keeps_typing` False) are left alone. A call under way when the block
ends is waited for, so no typing indicator follows the reply; when the block ends in an error
(a lost lease cancelling the turn) it is cancelled instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from shared.conversation.batch import Batch
from shared.senders.base import Sender

log = logging.getLogger(__name__)


@asynccontextmanager
async def typing_kept_up(sender: Sender, batch: Batch, interval: float) -> AsyncIterator[None]:
    if not sender.keeps_typing:
        yield
        return
    stop = asyncio.Event()
    task = asyncio.create_task(_refresh(sender.keep_typing, batch, interval, stop))
    try:
        yield
    except BaseException:
        task.cancel()
        raise
    stop.set()
    await asyncio.wait([task])


async def _refresh(
    keep_typing: Callable[[Batch], Awaitable[Any]],
    batch: Batch,
    interval: float,
    stop: asyncio.Event,
) -> None:
    while True:
        try:
            await asyncio.wait_for(stop.wait(), interval)
            return
        except TimeoutError:
            pass
        try:
            await keep_typing(batch)
        except Exception as exc:  # best effort: never the turn's failure
            log.info("typing refresh failed tenant=%s batch=%s: %r", batch.tenant, batch.id, exc)
