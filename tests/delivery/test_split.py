"""split_reply: parts a provider accepts, cut where a reader would cut, nothing lost, and the
same parts every time (a resumed turn skips the parts already sent by their index)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.senders.split import WHATSAPP_MAX_CHARS, split_reply

# Text with the characters cuts care about, dense enough that every rule gets exercised.
PIECES = [*"ab .!?…\n\t", "\n\n", "ñ", "😀", "\u00a0", "\u2028", "word", ". "]
replies = st.lists(st.sampled_from(PIECES), max_size=150).map("".join)


def assert_nothing_lost(text: str, parts: list[str]) -> None:
    """The parts appear in the text in order, and only whitespace lies between them."""
    position = 0
    for part in parts:
        found = text.find(part, position)
        assert found >= 0, f"part {part!r} is not in the text after position {position}"
        assert text[position:found].strip() == "", f"lost {text[position:found]!r}"
        position = found + len(part)
    assert text[position:].strip() == "", f"lost the tail {text[position:]!r}"


@given(text=replies, limit=st.integers(min_value=1, max_value=60))
@example(text="a" * 10, limit=3)
@example(text="a. " * 40, limit=7)
@settings(max_examples=400, deadline=None)
def test_parts_fit_the_limit_lose_nothing_and_are_deterministic(text: str, limit: int) -> None:
    parts = split_reply(text, limit)
    assert all(0 < len(p) <= limit for p in parts), parts
    assert all(p == p.strip() for p in parts), "no part starts or ends with whitespace"
    assert_nothing_lost(text, parts)
    assert split_reply(text, limit) == parts


def test_short_and_empty_replies() -> None:
    assert split_reply("  hola  ") == ["hola"]
    assert split_reply(" \n ") == []
    assert split_reply("x" * WHATSAPP_MAX_CHARS) == ["x" * WHATSAPP_MAX_CHARS]
    with pytest.raises(ValueError):
        split_reply("hola", 0)


def test_cuts_prefer_paragraphs_then_sentences_then_spaces() -> None:
    first = "Primer párrafo. Con dos frases."
    second = "Segundo párrafo, algo más largo que el primero."
    assert split_reply(f"{first}\n\n{second}", 60) == [first, second]
    # No paragraph break in reach: the last sentence end that fits.
    assert split_reply("Uno dos tres. Cuatro cinco seis. Siete ocho nueve.", 40) == [
        "Uno dos tres. Cuatro cinco seis.",
        "Siete ocho nueve.",
    ]
    # No sentence end either: the last space that fits; a word is cut only when it is longer.
    assert split_reply("uno dos tres cuatro", 9) == ["uno dos", "tres", "cuatro"]
    assert split_reply("abcdefghij kl", 4) == ["abcd", "efgh", "ij", "kl"]


def test_a_reply_over_4096_characters_is_cut_at_paragraphs_and_sentences() -> None:
    paragraphs = [
        " ".join(f"Frase {p}.{i} sobre turnos." for i in range(n)) for p, n in [(1, 120), (2, 230)]
    ]
    reply = "\n\n".join(paragraphs)
    assert 4096 < len(paragraphs[1]) < 2 * 4096 < len(reply)
    parts = split_reply(reply)
    assert len(parts) == 3 and all(len(p) <= WHATSAPP_MAX_CHARS for p in parts)
    assert parts[0] == paragraphs[0]
    assert parts[1].endswith(".") and f"{parts[1]} {parts[2]}" == paragraphs[1]
