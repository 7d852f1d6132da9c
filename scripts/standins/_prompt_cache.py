"""Prompt caching as the Messages API stand-in applies it, after Anthropic's documented rules
(https://platform.claude.com/docs/en/build-with-claude/prompt-caching):

- The prompt is the tools, then the system prompt, then the messages, block by block; a block
  with `cache_control` is a breakpoint, at most 4 a request (more: 400 invalid_request_error).
- A breakpoint's cache entry is the exact prefix up to and including its block, for that
  model (the `cache_control` marks themselves are not part of it; a string `system` or
  `content` is the same as one text block). It lives 5 minutes (`"ttl": "1h"`: an hour) from
  its last use: each hit refreshes it.
- A prefix shorter than the model's minimum is not cached: 1024 tokens on Sonnet and Opus
  models, 2048 on Haiku models, 4096 on Opus 4.5 and 4.6 and Haiku 4.5.
- From each breakpoint the API looks for an entry at 20 block boundaries: its own block and the
  19 before it; the longest prefix found is read (`cache_read_input_tokens`); then every
  breakpoint beyond it whose prefix is long enough is written (`cache_creation_input_tokens`:
  the tokens from the read up to the last breakpoint written); `input_tokens` are the tokens
  after the last read or write.

Tokens come from a deterministic stand-in tokenizer: 4 characters a token, rounded up, at
least 1, block by block (the text of a text block, the compact JSON of any other block, a
tool's definition included), so a test can compute every figure by hand.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

CHARS_PER_TOKEN = 4
MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TTLS_S = {"5m": 300.0, "1h": 3600.0}
# Minimum cacheable prefix by model name (the first that matches), as documented.
MIN_CACHEABLE: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-5", 4096),
    ("claude-opus-4-6", 4096),
    ("claude-haiku-4-5", 4096),
    ("haiku", 2048),
)
DEFAULT_MIN_CACHEABLE = 1024


def min_cacheable_tokens(model: str) -> int:
    for part, minimum in MIN_CACHEABLE:
        if part in model:
            return minimum
    return DEFAULT_MIN_CACHEABLE


def block_tokens(block: Any) -> int:
    """Tokens of one block (its text, or its JSON without the cache mark)."""
    if isinstance(block, str):
        chars = len(block)
    elif isinstance(block, dict) and block.get("type") == "text" and "text" in block:
        chars = len(str(block["text"]))
    else:
        chars = len(orjson.dumps(_unmarked(block)))
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def content_tokens(content: Any) -> int:
    """Tokens of a content value: a string or a list of blocks (an answer's output_tokens)."""
    blocks = content if isinstance(content, list) else [content]
    return sum(block_tokens(block) for block in blocks)


def count_tokens(body: Mapping[str, Any]) -> int:
    """Every input token of a request (what `/v1/messages/count_tokens` answers)."""
    return sum(block_tokens(block) for _, block in _blocks(body))


def breakpoint_problem(body: Mapping[str, Any]) -> str | None:
    """The API's complaint about the request's cache marks, or None."""
    marks = [block["cache_control"] for _, block in _blocks(body) if _mark(block) is not None]
    if len(marks) > MAX_BREAKPOINTS:
        return (
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(marks)}."
        )
    for mark in marks:
        if not isinstance(mark, dict) or mark.get("type") != "ephemeral":
            return "cache_control.type: Input should be 'ephemeral'"
        if mark.get("ttl", "5m") not in TTLS_S:
            return "cache_control.ttl: Input should be '5m' or '1h'"
    return None


@dataclass(frozen=True)
class _Unit:
    """One block of the prompt: the hash of the prefix up to it, the tokens up to it, and its
    cache mark's lifetime (None: not a breakpoint)."""

    key: str
    tokens: int
    ttl_s: float | None


class PromptCache:
    """The stand-in's cache: prefix hash -> (expiry, lifetime). `advance(seconds)` moves its
    clock forward (a test of the 5-minute lifetime need not wait)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._offset = 0.0
        self._entries: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        """Live entries."""
        with self._lock:
            self._expire(self._now())
            return len(self._entries)

    def usage(self, body: Mapping[str, Any]) -> dict[str, int]:
        """Read and write the cache for a request: its `usage` input figures."""
        units = _units(body)
        total = units[-1].tokens if units else 0
        minimum = min_cacheable_tokens(str(body.get("model", "")))
        breakpoints = [i for i, unit in enumerate(units) if unit.ttl_s is not None]
        with self._lock:
            now = self._now()
            self._expire(now)
            read = self._longest_hit(units, breakpoints)
            if read >= 0:
                _, ttl_s = self._entries[units[read].key]
                self._entries[units[read].key] = (now + ttl_s, ttl_s)
            written = -1
            for index in breakpoints:
                unit = units[index]
                if index > read and unit.tokens >= minimum and unit.ttl_s is not None:
                    self._entries[unit.key] = (now + unit.ttl_s, unit.ttl_s)
                    written = index
        read_tokens = units[read].tokens if read >= 0 else 0
        through = max(read_tokens, units[written].tokens if written >= 0 else 0)
        return {
            "input_tokens": total - through,
            "cache_creation_input_tokens": through - read_tokens,
            "cache_read_input_tokens": read_tokens,
        }

    def _longest_hit(self, units: list[_Unit], breakpoints: list[int]) -> int:
        read = -1
        for index in breakpoints:
            for back in range(index, max(-1, index - LOOKBACK_BLOCKS), -1):
                if units[back].key in self._entries:
                    read = max(read, back)
                    break
        return read

    def _now(self) -> float:
        return self._clock() + self._offset

    def _expire(self, now: float) -> None:
        for key in [k for k, (expires, _) in self._entries.items() if expires <= now]:
            del self._entries[key]


def _units(body: Mapping[str, Any]) -> list[_Unit]:
    digest = hashlib.sha256(str(body.get("model", "")).encode())
    units: list[_Unit] = []
    tokens = 0
    for where, block in _blocks(body):
        digest.update(orjson.dumps([where, _unmarked(block)]))
        tokens += block_tokens(block)
        mark = _mark(block)
        ttl_s = None if mark is None else TTLS_S.get(str(mark.get("ttl", "5m")), TTLS_S["5m"])
        units.append(_Unit(digest.copy().hexdigest(), tokens, ttl_s))
    return units


def _blocks(body: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(where, block) in prompt order; `where` tells a message's first block from the rest."""
    for tool in body.get("tools") or []:
        yield "tool", tool
    for block in _as_blocks(body.get("system")):
        yield "system", block
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            role = str(message.get("role"))
            for i, block in enumerate(_as_blocks(message.get("content"))):
                yield (role if i == 0 else f"{role}+"), block


def _as_blocks(value: Any) -> list[Any]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    return list(value) if isinstance(value, list) else [value]


def _mark(block: Any) -> Any:
    return block.get("cache_control") if isinstance(block, dict) else None


def _unmarked(block: Any) -> Any:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block
