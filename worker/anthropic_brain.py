"""The Claude brain (`BRAIN=anthropic`): one Messages API call per batch.

One `AsyncAnthropic` client per process; `ANTHROPIC_BASE_URL` is honoured by the SDK itself.
The whole batch is one user turn (every message's text in order, non-text described by the
receiver, e.g. "[image: caption]"), after the person's recent exchanges from memory. The system
prompt (tenant's own, else `SYSTEM_PROMPT`) is marked for prompt caching, since it is the same
for every turn of a tenant.

The SDK's own retries are off: the worker's backoff retries the whole turn, under the lease, and
an error that retrying cannot fix (bad request, authentication) goes to review with the reason.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic

from shared.settings import Settings
from worker.batch import Batch
from worker.errors import NeedsReview, RetryLater
from worker.turn_state import record_ai_call

RETRYABLE_STATUS = frozenset({408, 409, 429})


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
        started, message = time.perf_counter(), None
        try:
            message = await self._client.messages.create(**self.request(batch))
        except anthropic.APIConnectionError as exc:  # includes timeouts
            raise RetryLater(f"Anthropic unreachable: {exc!r}") from exc
        except anthropic.APIStatusError as exc:
            if exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500:
                raise RetryLater(f"Anthropic {exc.status_code}: {exc.message}") from exc
            reason = "ai_auth" if exc.status_code in (401, 403) else "ai_rejected"
            raise NeedsReview(reason, f"Anthropic {exc.status_code}: {exc.message}") from exc
        finally:  # one AI call of the turn and its tokens, for the tenant's figures
            record_ai_call(time.perf_counter() - started, message.usage if message else None)
        text = "".join(block.text for block in message.content if block.type == "text").strip()
        return text or None
