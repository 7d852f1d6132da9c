"""The Claude brain (`BRAIN=anthropic`): one Messages API call per batch.

One `AsyncAnthropic` client per process; `ANTHROPIC_BASE_URL` is honoured by the SDK itself.
The whole batch is one user turn (every message in order, as shared/conversation/presentation.py
shows it, then its images, PDFs and transcribed voice notes, each with its label, fetched first
by worker/brains/media.py: each thing said once), after the person's recent exchanges from
memory; the request (the tenant's model, prompt and memory length, and the prompt-cache
marks) is built by worker/brains/prompt.py. Each call's latency and token usage is reported
to the turn (`record_ai_call`), which logs them and adds them to the tenant's figures.

The SDK's own retries are off: the worker retries the whole turn, under the lease. What an error
means is decided in worker/brains/ai_errors.py: an outage of the API waits for it without using up
the batch's attempts, an error that retrying cannot fix (bad request, authentication) goes to review
with the reason.

Each answer's `stop_reason` is read, in a loop bounded by `AI_TURN_TIMEOUT_S`:
- `end_turn`, `stop_sequence`: the answer's text is the reply.
- `max_tokens`: asked again with the limit doubled, up to `MAX_CONTINUATIONS` times (the
  answer is generated again rather than continued from a prefilled assistant message, which
  Claude 4.6 models reject); still cut, the reply ends at its last complete sentence (a
  warning says so), or the batch goes to review as `max_tokens` when no sentence is complete.
- `refusal`: nothing is sent; review as `refusal`.
- `tool_use`: the tools (worker/brains/tools.py) answer, and the model is asked again with their
  results, at most `AI_MAX_TOOL_ROUNDS` times (one more: review as `ai_tool_rounds`).
- `pause_turn` (a server tool's long turn): its content goes back as is and the model goes on;
  it counts as a tool round.
The reply is the text of the answer that ended the loop: what the model wrote before calling
a tool ("let me check") is not sent.
An empty reply is never silence after the typing indicator: the tenant's `fallback_text` (else
`AI_FALLBACK_TEXT`) is sent, or the batch goes to review as `empty_answer`. A turn past its
deadline goes to review as `ai_deadline`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anthropic
from anthropic.types import Message

from shared.conversation.batch import Batch
from shared.conversation.errors import NeedsReview, RetryLater
from shared.conversation.turn_state import record_ai_call, record_media
from shared.settings import Settings
from worker.brains.ai_errors import classify
from worker.brains.media import MediaLoader
from worker.brains.prompt import build_request
from worker.brains.tools import load_tools

log = logging.getLogger(__name__)
# Review reasons of the stop-reason loop.
REFUSAL = "refusal"
EMPTY_ANSWER = "empty_answer"
CUT_ANSWER = "max_tokens"
TOOL_ROUNDS = "ai_tool_rounds"
DEADLINE = "ai_deadline"
MAX_CONTINUATIONS = 2  # a cut answer is asked again with 2x, then 4x the tokens
MIN_CALL_S = 0.5  # a call with less of the turn's time left would only time out
# A sentence ends at . ! ? … (closing quotes or brackets may follow) before a space or the
# end, or at a line break (a list item, a paragraph); only if it has a letter since the last
# end, so a list's "1." is no sentence.
_SENTENCE_END = re.compile(r"[.!?…](?:[\"'»”’)\]]*)(?=\s|$)|\n")
_LETTER = re.compile(r"[^\W\d_]")


class AnthropicBrain:
    def __init__(self, settings: Settings, client: anthropic.AsyncAnthropic | None = None) -> None:
        self._settings = settings
        self._client = client or anthropic.AsyncAnthropic(
            api_key=settings.anthropic_api_key or None,
            max_retries=0,
            timeout=settings.ai_timeout_s,
        )
        self._tools = load_tools(settings)
        self._media = MediaLoader(settings)

    async def aclose(self) -> None:
        await self._client.close()
        await self._media.aclose()

    def request(
        self,
        batch: Batch,
        tools: Sequence[Mapping[str, Any]] | None = None,
        media: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """The Messages API request for this batch (also what tests assert on): the tenant's
        model, prompt and memory, the tools first (default: this brain's), cache marks where
        they pay, the batch's `media` blocks after its text (worker/brains/prompt.py)."""
        if tools is None:
            tools = self._tools.schemas() if self._tools else ()
        tenant = self._settings.tenant(batch.tenant)
        return build_request(self._settings, tenant, batch, tools, media=media)

    async def reply(self, batch: Batch) -> str | None:
        """The reply to send: the stop-reason loop (module docstring), from `request(batch)`
        with the batch's files fetched first (worker/brains/media.py), within the turn's
        deadline."""
        s = self._settings
        deadline = asyncio.get_running_loop().time() + s.ai_turn_timeout_s
        media = await self._media.blocks(batch, deadline)
        record_media(media)
        request = self.request(batch, media=media)
        cut, rounds = 0, 0
        while True:
            message = await self._ask(request, deadline)
            stop = message.stop_reason
            if stop == "refusal":
                raise NeedsReview(REFUSAL, "the model declined to answer (stop_reason refusal)")
            if stop == "max_tokens" and cut < MAX_CONTINUATIONS:
                cut += 1
                request = {**request, "max_tokens": request["max_tokens"] * 2}
                log.info(
                    "answer cut at max_tokens, asking again with max_tokens=%d batch=%s",
                    request["max_tokens"],
                    batch.id,
                )
                continue
            if stop not in ("tool_use", "pause_turn"):
                text = _text_of(message)
                if stop in ("max_tokens", "model_context_window_exceeded"):
                    text = _complete_sentences(batch, message, text, stop)
                return self._final(batch, text)
            rounds += 1
            if rounds > s.ai_max_tool_rounds:
                raise NeedsReview(
                    TOOL_ROUNDS,
                    f"still calling tools after AI_MAX_TOOL_ROUNDS={s.ai_max_tool_rounds}",
                )
            request["messages"].append({"role": "assistant", "content": _content_of(message)})
            if stop == "pause_turn":
                continue  # the same answer goes on from its content
            calls = [block for block in message.content if block.type == "tool_use"]
            left_s = deadline - asyncio.get_running_loop().time()
            results = await self._tools.answer(batch, calls, left_s)
            request["messages"].append({"role": "user", "content": results})

    def _final(self, batch: Batch, text: str) -> str:
        """The reply, or the fallback text for an empty one (else review `empty_answer`)."""
        text = text.strip()
        if text:
            return text
        fallback = self._settings.tenant(batch.tenant).fallback_text
        if not fallback:
            raise NeedsReview(EMPTY_ANSWER, "the model's answer had no text")
        log.warning(
            "empty answer, sending the fallback text tenant=%s batch=%s", batch.tenant, batch.id
        )
        return fallback

    async def _ask(self, request: dict[str, Any], deadline: float) -> Message:
        """One Messages API call, within what is left of the turn's deadline."""
        left_s = deadline - asyncio.get_running_loop().time()
        if left_s < MIN_CALL_S:
            raise NeedsReview(DEADLINE, self._past_deadline())
        try:
            return await self._create(request, min(self._settings.ai_timeout_s, left_s))
        except RetryLater as exc:
            if asyncio.get_running_loop().time() >= deadline:
                raise NeedsReview(DEADLINE, self._past_deadline()) from exc
            raise

    def _past_deadline(self) -> str:
        return (
            f"the AI turn took longer than AI_TURN_TIMEOUT_S={self._settings.ai_turn_timeout_s:g}"
        )

    async def _create(self, request: dict[str, Any], timeout_s: float) -> Message:
        started, usage = time.perf_counter(), None
        try:
            message: Message = await self._client.messages.create(**request, timeout=timeout_s)
            usage = message.usage
        except anthropic.APIError as exc:
            raise classify(exc) from exc
        finally:
            # every call of the turn counts: its latency and tokens (conversation/turn_state.py)
            record_ai_call(time.perf_counter() - started, usage)
        return message


def _text_of(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def _content_of(message: Message) -> list[dict[str, Any]]:
    """The answer's content as the next request sends it back. The API refuses empty text
    blocks, and a last one ending in whitespace (a paused turn's content goes back last)."""
    blocks = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
    if blocks and blocks[-1]["type"] == "text":
        blocks[-1]["text"] = blocks[-1]["text"].rstrip()
    return [b for b in blocks if b["type"] != "text" or b["text"]]


def _complete_sentences(batch: Batch, message: Message, text: str, stop: str) -> str:
    """A cut answer up to its last complete sentence; review `max_tokens` if none is, or if
    it was cut inside a tool call (its text is only what came before the call)."""
    if any(block.type == "tool_use" for block in message.content):
        raise NeedsReview(CUT_ANSWER, f"cut ({stop}) inside a tool call")
    end = 0
    for match in _SENTENCE_END.finditer(text.rstrip()):
        if _LETTER.search(text, end, match.end()):
            end = match.end()
    kept = text[:end].rstrip()
    if not kept:
        raise NeedsReview(CUT_ANSWER, f"cut ({stop}) before its first sentence ended")
    log.warning(
        "answer still cut (%s): sending it up to its last complete sentence, %d of %d"
        " characters tenant=%s batch=%s",
        stop,
        len(kept),
        len(text),
        batch.tenant,
        batch.id,
    )
    return kept
