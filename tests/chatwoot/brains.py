"""A brain for `BRAIN=tests.chatwoot.brains:TwoPartBrain`: a reply too long for one part.

It runs in the test's process (in-process workers), so `CALLS` counts its calls directly.
"""

from __future__ import annotations

from shared.conversation.batch import Batch
from shared.settings import Settings

CALLS: list[str] = []
PART_CHARS = 3000  # two of them exceed one 4096-character part


def parts_of(batch_text: str) -> tuple[str, str]:
    return ("A" * PART_CHARS + f" {batch_text}.", "B" * PART_CHARS + ".")


class TwoPartBrain:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def reply(self, batch: Batch) -> str | None:
        CALLS.append(batch.id)
        return "\n\n".join(parts_of(batch.user_text))


MARKDOWN = "## Horarios\n**Sábado**: 10 a 13, más en [la web](https://turnos.example)"


class MarkdownBrain:
    """Answers in Markdown, as Claude does: Chatwoot renders it, so it goes out unchanged."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def reply(self, batch: Batch) -> str | None:
        return MARKDOWN
