"""Brains turn a batch into a reply. Chosen by `BRAIN`: `echo`, or `package.module:attr`.

A brain is any object with `async def reply(self, batch: Batch) -> str | None` (None: no
reply). It runs inside the turn, under the person's lease, so it may take its time and call
tools; raise `shared.conversation.errors.NeedsReview` for what a human must see, `RetryLater` (or
any other exception) for what a retry can fix (counted against `MAX_ATTEMPTS`), `AIUnavailable` when
the AI provider fails as a whole (the fleet pauses, the batch waits uncounted:
worker/brains/ai_pause.py).
`attr` may be the brain itself, or a class/factory that takes the `Settings` and returns one.
"""

from __future__ import annotations

from typing import Protocol

from shared.conversation.batch import Batch
from shared.plugins import load_object
from shared.settings import Settings


class Brain(Protocol):
    async def reply(self, batch: Batch) -> str | None: ...


class EchoBrain:
    """Offline brain: answers with what it received, so batching is visible."""

    async def reply(self, batch: Batch) -> str | None:
        lines = " / ".join(batch.texts)
        n = len(batch.messages)
        return f"Got {n} message{'s' if n != 1 else ''}: {lines}"


def load_brain(settings: Settings) -> Brain:
    name = settings.brain
    if name == "echo":
        return EchoBrain()
    if name == "anthropic":
        from worker.brains.anthropic_brain import AnthropicBrain

        return AnthropicBrain(settings)
    brain: Brain = load_object(name, "BRAIN", settings, "reply")
    return brain
