"""Markdown in the model's answer turned into WhatsApp's own formatting.

Claude writes Markdown; WhatsApp shows `*bold*`, `_italic_`, `~strike~`, ```monospace```,
`inline code`, "- " and "1. " lists and "> " quotes, and shows anything else (`# heading`,
`**bold**`, `[text](url)`) as the bare symbols. Chatwoot renders Markdown itself, so only
WhatsApp conversations are converted (`for_channel`):

    **bold**, __bold__      ->  *bold*
    *italic*, _italic_      ->  _italic_
    ***both***              ->  *_both_*
    ~~strike~~              ->  ~strike~
    # Heading               ->  *Heading*       (a line of its own, in bold)
    * item, + item          ->  - item          (lists stay lists; "1. item" as it is)
    [text](url)             ->  text (url)      ([url](url) and ![](url): url)
    ```python ... ```       ->  ``` ... ```     (the code inside untouched)
    `code`, URLs            ->  untouched
    ---                     ->  an empty line

The conversion is deterministic, so a resumed turn splits the same reply into the same parts.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_BULLET = re.compile(r"^(\s*)[*+][ \t]+")
_RULE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"\n]*\")?\s*\)")
_URL = re.compile(r"(?:https?|mailto):[^\s<>()]+")
_BOLD_ITALIC = re.compile(r"\*\*\*(?=\S)(.+?)(?<=\S)\*\*\*")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_KEPT = re.compile("\x00([0-9]+)\x00")
_B = "\x01"  # bold, until the italic stars are converted


def for_channel(channel: str, text: str) -> str:
    """The reply as the channel shows it: WhatsApp's formatting for "whatsapp", else as is."""
    return to_whatsapp(text) if channel == "whatsapp" else text


def to_whatsapp(text: str) -> str:
    """Markdown -> WhatsApp formatting (see the module docstring)."""
    out: list[str] = []
    fence: str | None = None
    # Our two markers never come from the model; dropped so they cannot be taken for ours.
    for line in text.replace("\x00", "").replace(_B, "").split("\n"):
        opening = _FENCE.match(line)
        if fence is not None:
            if opening is not None and opening.group(1) == fence:
                fence = None
                out.append("```")
            else:
                out.append(line)
        elif opening is not None:
            fence = opening.group(1)
            out.append("```")
        else:
            out.append(_line(line))
    return "\n".join(out)


def _line(line: str) -> str:
    if _RULE.match(line):
        return ""
    heading = _HEADING.match(line)
    if heading is not None:
        title = _inline(heading.group(1)).replace(_B, "").strip()
        return f"*{title}*" if title else ""
    bullet = _BULLET.match(line)
    if bullet is not None:
        line = f"{bullet.group(1)}- {line[bullet.end() :]}"
    return _inline(line).replace(_B, "*")


def _inline(text: str) -> str:
    """Emphasis converted (bold still as `_B`), code spans and URLs kept as they are."""
    kept: list[str] = []

    def keep(value: str) -> str:
        kept.append(value)
        return f"\x00{len(kept) - 1}\x00"

    text = _CODE_SPAN.sub(lambda m: keep(m.group(0)), text)
    text = _LINK.sub(lambda m: _link(m, keep), text)
    text = _URL.sub(lambda m: keep(m.group(0)), text)
    text = _BOLD_ITALIC.sub(lambda m: f"{_B}_{m.group(1)}_{_B}", text)
    text = _BOLD.sub(lambda m: f"{_B}{m.group(2)}{_B}", text)
    text = _STRIKE.sub(lambda m: f"~{m.group(1)}~", text)
    text = _ITALIC.sub(lambda m: f"_{m.group(1)}_", text)
    return _KEPT.sub(lambda m: kept[int(m.group(1))], text)


def _link(match: re.Match[str], keep: Callable[[str], str]) -> str:
    label, url = match.group(2).strip(), match.group(3)
    if not label or label == url:
        return keep(url)
    if url == f"mailto:{label}":
        return keep(label)
    return f"{label} ({keep(url)})"
