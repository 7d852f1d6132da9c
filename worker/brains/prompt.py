"""The Messages API request of a turn, built so that prompt caching pays.

Anthropic caches a request's prefix (tools, then the system prompt, then the messages, in that
order) up to each block marked `cache_control`, for 5 minutes from its last use; a later request
whose prefix matches reads it at a tenth of the input price, writing it costs 1.25 times. The
documented rules followed here (https://platform.claude.com/docs/en/build-with-claude/prompt-caching,
"Cache limitations" and "Structuring your prompt"):

- at most four marked blocks per request;
- a prefix shorter than the model's minimum is never cached (1024 tokens on Sonnet and Opus
  models, 2048 on Haiku models; 4096 on Opus 4.5 and 4.6 and Haiku 4.5), so it is not marked;
- a hit needs the prefix identical byte for byte: the tools in the order given, the tenant's
  system text, every remembered exchange rendered the same way every turn (each message one
  text block; the mark itself is not part of what is compared).

The marks, each only where the prefix up to it is long enough: the last tool (tools are the
same for every tenant), the system prompt (the same for every conversation of a tenant), the
previous turn's user message (the previous turn wrote the cache up to there: read back exactly)
and the current user message (written for the next turn). Lengths are estimated at 3
characters a token, on the generous side (Claude reads English at about 4, JSON and Spanish
denser): a mark on a prefix that turns out too short costs nothing, a missing one costs the
cache.

Once a person's memory is full (`MEMORY_TURNS`), each turn drops the oldest exchange: the
history changes from its start, so such turns read only tools and system prompt from the cache,
and mark no message (a mark there would be written, at 1.25 times the price, and never read).
The current message is marked only if the next turn keeps this turn's start (its memory is not
full yet), the previous one only if this turn kept the previous turn's.

The batch's files (images, PDFs, transcribed voice notes: worker/brains/media.py) follow its text in
the current user message, after the mark, each with its label; the text then leaves them out
(`present(..., files_beside=True)`), so the model reads each label once. The memory keeps the
text blocks of them (a voice note's transcription, a file's label), which later turns render
after that batch's text: the same bytes up to the mark, so the next turn's prefix still ends
where the mark is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from shared.conversation.batch import Batch
from shared.conversation.presentation import Quotes, present, remembered
from shared.settings import Settings, TenantConfig

MAX_BREAKPOINTS = 4
CHARS_PER_TOKEN = 3  # generous on purpose: see the module docstring
EMPTY_TEXT = "[empty message]"  # the API refuses empty text blocks

# Minimum cacheable prefix by model name (the first that matches), from the page cited above.
MIN_CACHEABLE: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-5", 4096),
    ("claude-opus-4-6", 4096),
    ("claude-haiku-4-5", 4096),
    ("haiku", 2048),
)
DEFAULT_MIN_CACHEABLE = 1024  # Sonnet and Opus models

LANGUAGES = {
    "ca": "Catalan",
    "de": "German",
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "it": "Italian",
    "nl": "Dutch",
    "pt": "Portuguese",
}
_LOCALE = re.compile(r"([a-z]{2,3})(?:[-_]([A-Za-z]{2}|[0-9]{3}))?")


def build_request(
    settings: Settings,
    tenant: TenantConfig,
    batch: Batch,
    tools: Sequence[Mapping[str, Any]] = (),
    *,
    cache: bool = True,
    media: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The `messages.create` keyword arguments for this batch: the tenant's model, `max_tokens`
    and system prompt (with its language hint), its remembered exchanges, the batch as the last
    user message, `tools` as given; cache marks unless `cache` is False. `media`: the batch's
    files as content blocks (worker/brains/media.py), after the batch's text in the last user
    message, past its cache mark (memory keeps the text only, so the next turn's prefix ends there).
    Nothing given is changed (the tools are copied before a mark goes on the last one)."""
    model = tenant.model
    tool_list = [dict(tool) for tool in tools]
    system = [_text_block(system_text(tenant))]
    turns = tenant.memory_turns
    # The files come with their labels (worker/brains/media.py): the body leaves them out.
    shown = present(batch, tenant, settings, files_beside=bool(media))
    messages = render_messages(batch, turns, shown.blocks)
    current = messages[-1]["content"]
    if media and len(current) > 1 and current[-1]["text"] == EMPTY_TEXT:
        current.pop()  # a burst of files only has no body: the header, then the files
    if cache:
        _mark(min_cacheable_tokens(model), tool_list, system, messages, turns)
    messages[-1]["content"].extend(dict(block) for block in media)
    request: dict[str, Any] = {
        "model": model,
        "max_tokens": tenant.max_tokens,
        "system": system,
        "messages": messages,
    }
    if tool_list:
        request["tools"] = tool_list
    return request


def system_text(tenant: TenantConfig) -> str:
    """The tenant's system prompt (else `SYSTEM_PROMPT`), then its language hint if it has one."""
    prompt = tenant.system_prompt
    return f"{prompt}\n\n{language_hint(tenant.language)}" if tenant.language else prompt


def language_hint(language: str) -> str:
    """ "Spanish" -> "Answer in Spanish."; a locale, "es-AR" -> "Answer in Spanish (es-AR).";
    a locale of a language not listed -> "Answer in the language of the locale xx-YY."."""
    language = language.strip().rstrip(".")
    locale = _LOCALE.fullmatch(language)
    if locale is None:
        return f"Answer in {language}."
    name = LANGUAGES.get(locale.group(1))
    if name is None:
        return f"Answer in the language of the locale {language}."
    return f"Answer in {name} ({language})." if locale.group(2) else f"Answer in {name}."


def render_messages(
    batch: Batch, memory_turns: int, current: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The last `memory_turns` exchanges, then the batch as `current` (its presentation's
    header and body, shared/conversation/presentation.py; `batch.user_text` when not given): a user
    turn is its header block (if it has one) and its text block, an answer one text block, the same
    bytes for the same exchange every turn (so the prefix matches the cache; the memory keeps
    a turn's header and body as they were sent)."""
    history = batch.history[-memory_turns:] if memory_turns > 0 else []
    messages: list[dict[str, Any]] = []
    for exchange in history:
        header = exchange.get("header")
        user, answer = remembered(exchange)  # a reply written by hand says so
        # The texts the model read of that batch's files follow its text, as they did then
        # (the files themselves are gone; the cache's look-back finds that turn's mark).
        media = exchange.get("media")
        notes = [n for n in media if isinstance(n, str)] if isinstance(media, list) else []
        head = [header] if isinstance(header, str) else []
        # A burst of files only was sent without a body: remembered the same way.
        said = [user] if user or not notes else []
        messages.append(_message("user", *head, *said, *notes))
        messages.append(_message("assistant", answer))
    # Events that are not messages (reactions, deletions, ...) come first in the body block.
    blocks = list(current or [batch.user_text])
    lines = render_context(batch.context, Quotes(batch) if batch.context else None)
    if lines:
        blocks[-1] = "\n".join(line for line in [*lines, blocks[-1]] if line)
    messages.append(_message("user", *blocks))
    return messages


def render_context(items: Sequence[Mapping[str, Any]], quotes: Quotes | None = None) -> list[str]:
    """One line per event that is not a message since the previous turn (a reaction, an edit or
    deletion of an answered message, a number change, ...), shown before the new messages.
    `quotes` names a reacted message the intake could not: our reply or the customer's earlier
    message, found in the memory by its id."""
    return [f"[{_context_line(item, quotes)}]" for item in items]


def _context_line(item: Mapping[str, Any], quotes: Quotes | None = None) -> str:
    what, raw = str(item.get("what", "")), item.get("raw")
    raw = raw if isinstance(raw, dict) else {}
    target_id = str(item.get("target") or "")
    target = _quoted(item.get("target_text")) or f"(id {target_id or 'unknown'})"
    if what == "reaction":
        emoji = _sub(raw, "reaction", "emoji")
        about = f"the message {target}"
        if not item.get("target_text") and quotes is not None and target_id in quotes.texts:
            about = quotes.texts[target_id]  # e.g. 'your message "..."'
        if not emoji:
            return f"the customer removed their reaction to {about}"
        return f"the customer reacted {emoji} to {about}"
    if what == "revoke_answered":
        return f"the customer deleted their message {target}"
    if what == "edit_answered":
        return f"the customer edited their message {target}; it now reads: {item.get('text', '')}"
    if what in ("customer_changed_number", "user_changed_number"):
        return "the customer changed their phone number; this conversation continues"
    if what == "customer_identity_changed":
        return "the customer's WhatsApp identity changed (a new phone or a reinstall)"
    if what == "call_permission_reply":
        answer = _sub(_sub_obj(raw, "interactive"), "call_permission_reply", "response")
        return f"the customer answered the request to call them: {answer or 'no answer'}"
    if what == "request_welcome":
        return "the customer opened the chat"
    return f"{what}: {item.get('text', '')}"


def _quoted(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) and value else ""


def _sub_obj(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _sub(obj: Mapping[str, Any], key: str, field: str) -> str:
    value = _sub_obj(obj, key).get(field)
    return value if isinstance(value, str) else ""


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix `model` caches, in tokens."""
    for part, minimum in MIN_CACHEABLE:
        if part in model:
            return minimum
    return DEFAULT_MIN_CACHEABLE


def estimate_tokens(block: Mapping[str, Any]) -> int:
    """A generous token estimate of one block: its text, or its JSON for anything else."""
    text = block.get("text") if block.get("type") == "text" else None
    chars = len(text) if isinstance(text, str) else len(orjson.dumps(dict(block)))
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def _mark(
    minimum: int,
    tools: list[dict[str, Any]],
    system: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    memory_turns: int,
) -> None:
    """Put `cache_control` on the breakpoints whose prefix reaches `minimum` (at most four)."""
    candidates: list[tuple[dict[str, Any], int]] = []  # (block, estimated prefix tokens)
    running = sum(estimate_tokens(tool) for tool in tools)
    if tools:
        candidates.append((tools[-1], running))
    running += sum(estimate_tokens(block) for block in system)
    candidates.append((system[-1], running))
    exchanges = (len(messages) - 1) // 2
    marked_messages: set[int] = set()
    if 0 < exchanges < memory_turns:  # memory not full: nothing dropped since the last turn
        marked_messages.add(len(messages) - 3)  # [..., previous user, its answer, this batch]
    if exchanges + 1 < memory_turns:  # the next turn will not drop anything either
        marked_messages.add(len(messages) - 1)
    for index, message in enumerate(messages):
        running += sum(estimate_tokens(block) for block in message["content"])
        if index in marked_messages:
            candidates.append((message["content"][-1], running))
    marked = [block for block, tokens in candidates if tokens >= minimum]
    for block in marked[-MAX_BREAKPOINTS:]:
        block["cache_control"] = {"type": "ephemeral"}


def _message(role: str, *texts: Any) -> dict[str, Any]:
    return {"role": role, "content": [_text_block(text) for text in texts]}


def _text_block(text: Any) -> dict[str, Any]:
    usable = isinstance(text, str) and bool(text.strip())
    return {"type": "text", "text": text if usable else EMPTY_TEXT}
