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
from bisect import bisect_left
from collections.abc import Callable, Iterator

# Every pattern here is linear in the line's length: the AI's answer reaches this module, and
# a pattern that searches from each of n openings to the end of the line costs n² (issue 21:
# "***a " repeated over 16 KB took a second). What a regex would search for from every
# opening is found once per line instead (`_pairs`, `_code_spans`, `_links`, `_heading`).
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING_START = re.compile(r" {0,3}#{1,6}[ \t]+")
_BULLET = re.compile(r"^(\s*)[*+][ \t]+")
_RULE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
# What follows a link's label: `](url)`, `](<url>)`, `](url "title")`.
_LINK_TAIL = re.compile(r"\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"\n]*\")?\s*\)")
_URL = re.compile(r"(?:https?|mailto):[^\s<>()]+")
_KEPT = re.compile("\x00([0-9]+)\x00")
_B = "\x01"  # bold, until the italic stars are converted
_BLANK = " \t"
_INLINE_MARKS = "`[:*_~"  # a line without any of these has nothing `_inline` converts
# A character some rule acts on: a fence (` ~), a rule (- * _), a heading (#), a bullet (* +),
# a link ([), emphasis, and the two markers dropped. A text without any is its own conversion
# (a URL is kept as it is either way: its ':' need not send a text through the rules).
_ANY_MARK = re.compile(r"[`~\-*_#+\[\x00\x01]")

Keep = Callable[[str], str]
Edge = Callable[[str, int, str], bool]  # (line, where the delimiter starts, the delimiter)


def for_channel(channel: str, text: str) -> str:
    """The reply as the channel shows it: WhatsApp's formatting for "whatsapp", else as is."""
    return to_whatsapp(text) if channel == "whatsapp" else text


def to_whatsapp(text: str) -> str:
    """Markdown -> WhatsApp formatting (see the module docstring)."""
    if _ANY_MARK.search(text) is None:
        # Plain text, as most short replies are: one search instead of the rules' matches on
        # every line (~19k instructions of a worker's turn for "ok", docs/benchmarks/worker.md).
        return text
    return _converted(text)


def _converted(text: str) -> str:
    """`to_whatsapp` rule by rule, line by line."""
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
    title = _heading(line)
    if title is not None:
        title = _inline(title).replace(_B, "").strip()
        return f"*{title}*" if title else ""
    bullet = _BULLET.match(line)
    if bullet is not None:
        line = f"{bullet.group(1)}- {line[bullet.end() :]}"
    return _inline(line).replace(_B, "*")


def _heading(line: str) -> str | None:
    r"""The title of a `# Heading` line (closing `#`s and blanks dropped), None for other lines.

    As `^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$` would, whose lazy title tried the
    closing at every character: quadratic on a long run of blanks."""
    start = _HEADING_START.match(line)
    if start is None:
        return None
    title = line[start.end() :].rstrip(_BLANK)
    unclosed = title.rstrip("#")
    if unclosed != title and unclosed.endswith(tuple(_BLANK)):
        return unclosed.rstrip(_BLANK)
    return title


def _inline(text: str) -> str:
    r"""Emphasis converted (bold still as `_B`), code spans and URLs kept as they are.

    `text` is one line (no "\n"): the scanners below rely on it, as `.` did in the patterns."""
    if not any(mark in text for mark in _INLINE_MARKS):
        return text  # plain text, most lines
    kept: list[str] = []

    def keep(value: str) -> str:
        kept.append(value)
        return f"\x00{len(kept) - 1}\x00"

    text = _replace(text, _code_spans(text), keep)
    text = _links(text, keep)
    text = _URL.sub(lambda m: keep(m.group(0)), text)
    text = _emphasis(text, ("***",), _opens, _closes, lambda inner: f"{_B}_{inner}_{_B}")
    text = _emphasis(text, ("**", "__"), _opens, _closes, lambda inner: f"{_B}{inner}{_B}")
    text = _emphasis(text, ("~~",), _opens, _closes, lambda inner: f"~{inner}~")
    text = _emphasis(text, ("*",), _opens_italic, _closes_italic, lambda inner: f"_{inner}_")
    return _KEPT.sub(lambda m: kept[int(m.group(1))], text)


def _replace(text: str, spans: Iterator[tuple[int, int]], by: Callable[[str], str]) -> str:
    """`text` with each span (start, end: in order, apart) replaced by `by(its text)`."""
    out: list[str] = []
    done = 0
    for start, end in spans:
        out += [text[done:start], by(text[start:end])]
        done = end
    out.append(text[done:])
    return "".join(out)


def _code_spans(text: str) -> Iterator[tuple[int, int]]:
    r"""Each code span, as `(`+)(.+?)\1` finds them: the longest opening run of backticks that a
    run at least as long closes further on (after one character at least), the nearest such
    closing. `run[p]` (backticks from p on) and `most[p]` (the longest run from p on) answer
    "is there a closing" at once, where the pattern searched the rest of the line per try."""
    if "`" not in text:
        return
    n = len(text)
    run, most = [0] * (n + 2), [0] * (n + 2)
    for p in range(n - 1, -1, -1):
        run[p] = run[p + 1] + 1 if text[p] == "`" else 0
        most[p] = max(run[p], most[p + 1])
    at = text.find("`")
    while at >= 0:
        k = min(run[at], most[at + 2])
        while k > 0 and most[at + k + 1] < k:
            k -= 1
        if k == 0:  # no backtick after the next character: no span starts here
            at = text.find("`", at + 1)
            continue
        close = at + k + 1
        while run[close] < k:
            close += 1
        yield at, close + k
        at = text.find("`", close + k)


def _links(text: str, keep: Keep) -> str:
    r"""Each `[label](url)` and `![label](url)` as `_link` writes it.

    A label runs to the next `]`, which every `[` before it shares: that `]`'s tail is matched
    once for all of them (`!?\[[^\]\n]*\]...` searched from each `[` to the `]`)."""
    out: list[str] = []
    done = 0
    at = text.find("[")
    while at >= 0:
        close = text.find("]", at + 1)
        if close < 0:
            break
        tail = _LINK_TAIL.match(text, close)
        if tail is None:
            at = text.find("[", close + 1)
            continue
        start = at - 1 if at - 1 >= done and text[at - 1] == "!" else at
        out += [text[done:start], _link(text[at + 1 : close], tail.group(1), keep)]
        done = tail.end()
        at = text.find("[", done)
    out.append(text[done:])
    return "".join(out)


def _link(label: str, url: str, keep: Keep) -> str:
    label = label.strip()
    if not label or label == url:
        return keep(url)
    if url == f"mailto:{label}":
        return keep(label)
    return f"{label} ({keep(url)})"


def _emphasis(
    text: str,
    delimiters: tuple[str, ...],
    opens: Edge,
    closes: Edge,
    wrap: Callable[[str], str],
) -> str:
    """Each `delimiter inner delimiter` in `text` replaced by `wrap(inner)`."""
    if not any(d in text for d in delimiters):
        return text  # most lines: nothing to look for
    spans = _pairs(text, delimiters, opens, closes)
    out: list[str] = []
    done = 0
    for start, end, delimiter in spans:
        inner = text[start + len(delimiter) : end - len(delimiter)]
        out += [text[done:start], wrap(inner)]
        done = end
    out.append(text[done:])
    return "".join(out)


def _pairs(
    text: str, delimiters: tuple[str, ...], opens: Edge, closes: Edge
) -> Iterator[tuple[int, int, str]]:
    r"""(start, end, delimiter) of each pair in `text`, leftmost first and not overlapping, as
    `re.sub` finds `(d1|d2)(?=...)(.+?)(?<=...)\1`: an opening, then the nearest closing of the
    same delimiter one character or more after it. The closings are listed once and each
    opening finds its own by bisection; the pattern searched the rest of the line from each
    opening, quadratic when most of them have no closing."""
    closings = {
        d: [at for at in _occurrences(text, d) if at > 0 and closes(text, at, d)]
        for d in delimiters
    }
    if not any(closings.values()):
        return
    starts = sorted({at for d in delimiters for at in _occurrences(text, d)})
    done = 0
    for at in starts:
        if at < done:
            continue
        for d in delimiters:
            if not (text.startswith(d, at) and opens(text, at, d)):
                continue
            found = bisect_left(closings[d], at + len(d) + 1)
            if found < len(closings[d]):
                done = closings[d][found] + len(d)
                yield at, done, d
                break


def _occurrences(text: str, part: str) -> Iterator[int]:
    """Where `part` starts in `text`, overlapping ones included."""
    at = text.find(part)
    while at >= 0:
        yield at
        at = text.find(part, at + 1)


# The edges of `**bold**`, `__bold__`, `***both***`, `~~strike~~`: no blank inside either one.
def _opens(text: str, at: int, d: str) -> bool:
    after = at + len(d)
    return after < len(text) and not text[after].isspace()


def _closes(text: str, at: int, d: str) -> bool:
    return not text[at - 1].isspace()


# `*italic*`: the stars touch the text inside and no word or other star outside.
def _opens_italic(text: str, at: int, d: str) -> bool:
    after = at + 1
    return (
        (at == 0 or not _word_or_star(text[at - 1]))
        and after < len(text)
        and not (text[after].isspace() or text[after] == "*")
    )


def _closes_italic(text: str, at: int, d: str) -> bool:
    before, after = text[at - 1], at + 1
    return not (before.isspace() or before == "*") and (
        after == len(text) or not _word_or_star(text[after])
    )


def _word_or_star(ch: str) -> bool:
    r"""What the pattern's `[\w*]` matches (`\w` is `str.isalnum()` and `_` for str patterns)."""
    return ch.isalnum() or ch in "_*"
