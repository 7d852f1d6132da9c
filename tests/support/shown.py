"""What the "each thing shown once" tests (tests/delivery/test_shown_once.py,
tests/chatwoot/test_shown_once.py) check in what Claude was sent for one inbound message."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

SHOWN_ELSEWHERE = "could not be shown here"
ASK = "ask them to send it again or to describe it"
# A label with nothing in it where there is a thing or a reason.
BARE = re.compile(
    r"\[(?:image|audio|video|document|sticker|interactive|button|unsupported|contacts|"
    r"location|order|unknown|attachment|file|edit)\]"
)
LABEL = re.compile(r"\[[^\[\]]+\]")


@dataclass
class Sample:
    """One inbound message and what Claude must get of it."""

    name: str
    message: dict[str, Any]
    said: list[str] = field(default_factory=list)  # each appears exactly once
    blocks: list[str] = field(default_factory=list)  # the content block types it brings
    sentence: bool = False  # told it could not be shown, and what to do


def texts_of(content: list[dict[str, Any]]) -> str:
    return "\n".join(b["text"] for b in content if b["type"] == "text")


def what_is_wrong(sample: Sample, content: list[dict[str, Any]]) -> list[str]:
    """What is wrong with what Claude got for `sample` (nothing: [])."""
    wrong = []
    texts = texts_of(content)
    for said in sample.said:
        if texts.count(said) != 1:
            wrong.append(f"{said!r} appears {texts.count(said)} times")
    labels = LABEL.findall(texts)
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        wrong.append(f"labels twice: {twice}")
    # `[image]` right before the image is its label; anywhere else it stands for nothing.
    labels_of_things = {
        id(block)
        for block, after in itertools.pairwise(content)
        if block["type"] == "text" and after["type"] != "text"
    }
    alone = texts_of([b for b in content if id(b) not in labels_of_things])
    if BARE.search(alone):
        wrong.append(f"a bare label: {BARE.findall(alone)}")
    kinds = [b["type"] for b in content if b["type"] != "text"]
    if kinds != sample.blocks:
        wrong.append(f"blocks {kinds}, expected {sample.blocks}")
    told = ASK in texts and ("could not" in texts or "cannot" in texts)
    if sample.sentence and not told:
        wrong.append("not told it could not be shown, nor what to do")
    if sample.message.get("errors") and SHOWN_ELSEWHERE not in texts:
        wrong.append("the sentence for a message Meta could not deliver is missing")
    return wrong
