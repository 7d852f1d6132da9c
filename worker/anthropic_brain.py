"""The Claude brain (`BRAIN=anthropic`): one Messages API call per batch.

One `AsyncAnthropic` client per process; `ANTHROPIC_BASE_URL` is honoured by the SDK itself.
The whole batch is one user turn (every message's text in order, non-text described by the
receiver, e.g. "[image: caption]"), after the person's recent exchanges from memory. The system
prompt (tenant's own, else `SYSTEM_PROMPT`) is marked for prompt caching, since it is the same
for every turn of a tenant.

The SDK's own retries are off: the worker retries the whole turn, under the lease. What an error
means is decided in worker/ai_errors.py: an outage of the API waits for it without using up the
batch's attempts, an error that retrying cannot fix (bad request, authentication) goes to review
with the reason.
"""

from __future__ import annotations

from typing import Any

import anthropic

from shared.settings import Settings
from worker.ai_errors import classify
from worker.batch import Batch


class AnthropicBrain:
    def __init__(self, settings: Settings, client: anthropic.AsyncAnthropic | None = None) -> None:
        self._settings = settings
        self._client = client or anthropic.AsyncAnthropic(
            api_key=settings.anthropic_api_key or None,
            max_retries=0,
            timeout=settings.ai_timeout_s,
        )

    async def aclose(self) -> None:
        await self._client.close()

    def request(self, batch: Batch) -> dict[str, Any]:
        """The Messages API request for this batch (also what tests assert on)."""
        prompt = self._settings.tenant(batch.tenant).system_prompt or self._settings.system_prompt
        messages: list[dict[str, Any]] = []
        for exchange in batch.history:
            messages.append({"role": "user", "content": exchange["user"]})
            messages.append({"role": "assistant", "content": exchange["assistant"]})
        messages.append({"role": "user", "content": batch.user_text})
        return {
            "model": self._settings.ai_model,
            "max_tokens": self._settings.ai_max_tokens,
            "system": [{"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}}],
            "messages": messages,
        }

    async def reply(self, batch: Batch) -> str | None:
        try:
            message = await self._client.messages.create(**self.request(batch))
        except anthropic.APIError as exc:
            raise classify(exc) from exc
        text = "".join(block.text for block in message.content if block.type == "text").strip()
        return text or None
