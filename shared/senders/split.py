"""Splits a reply into parts a provider accepts (WhatsApp: at most 4096 characters each).

Deterministic: a resumed turn splits its stored reply the same way and skips the parts
already sent. Cuts prefer a paragraph break, then a sentence end or line break, then a space;
only a single word longer than the limit is cut mid-word.
"""

from __future__ import annotations

import re

WHATSAPP_MAX_CHARS = 4096

_SENTENCE_END = re.compile(r"[.!?…](?:\s)|\n")


def split_reply(text: str, limit: int = WHATSAPP_MAX_CHARS) -> list[str]:
    if limit < 1:
        raise ValueError("limit must be positive")
    text = text.strip()
    parts: list[str] = []
    while len(text) > limit:
        cut = _cut_point(text, limit)
        head, text = text[:cut].rstrip(), text[cut:].lstrip()
        if head:
            parts.append(head)
    if text:
        parts.append(text)
    return parts


def _cut_point(text: str, limit: int) -> int:
    window = text[: limit + 1]
    paragraph = window.rfind("\n\n")
    if paragraph > limit // 4:
        return paragraph
    sentence = max(
        (m.end() for m in _SENTENCE_END.finditer(window) if m.end() <= limit), default=-1
    )
    if sentence > limit // 4:
        return sentence
    space = window.rfind(" ")
    if space > 0:
        return space
    return limit
