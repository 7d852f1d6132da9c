"""Markdown in the model's answer -> WhatsApp's formatting (shared/senders/formatting.py); Chatwoot
gets the answer as it is. Each case: what the model wrote, what the person sees."""

from __future__ import annotations

import time

import pytest

from shared.senders.formatting import for_channel, to_whatsapp

CASES = [
    # emphasis
    ("**bold**", "*bold*"),
    ("__bold__", "*bold*"),
    ("*italic*", "_italic_"),
    ("_italic_", "_italic_"),
    ("***both***", "*_both_*"),
    ("~~tachado~~", "~tachado~"),
    ("Hola **Ana**, el *sábado* hay turno.", "Hola *Ana*, el _sábado_ hay turno."),
    ("**bold with *italic* inside**", "*bold with _italic_ inside*"),
    ("**uno** y **dos**", "*uno* y *dos*"),
    ("Ya está *bold* de WhatsApp? no: *x*", "Ya está _bold_ de WhatsApp? no: _x_"),
    # what is not emphasis stays
    ("2 * 3 * 4 = 24", "2 * 3 * 4 = 24"),
    ("a*b*c", "a*b*c"),
    ("** not bold **", "** not bold **"),
    ("precio: 5*", "precio: 5*"),
    ("snake_case_name", "snake_case_name"),
    ("~ aprox ~", "~ aprox ~"),
    # headings: a bold line
    ("# Horarios", "*Horarios*"),
    ("### Sábados ###", "*Sábados*"),
    ("## **Ya en negrita**", "*Ya en negrita*"),
    ("## Turno *tarde*", "*Turno _tarde_*"),
    ("#hashtag", "#hashtag"),
    ("#", "#"),
    # lists kept as lists
    ("- uno\n- dos", "- uno\n- dos"),
    ("* uno\n* dos", "- uno\n- dos"),
    ("+ uno", "- uno"),
    ("  * anidado", "  - anidado"),
    ("* **Lunes**: 9 a 18", "- *Lunes*: 9 a 18"),
    ("1. uno\n2. dos", "1. uno\n2. dos"),
    ("> cita", "> cita"),
    # links
    (
        "[nuestra web](https://turnos.example/reservas)",
        "nuestra web (https://turnos.example/reservas)",
    ),
    ("[https://a.example](https://a.example)", "https://a.example"),
    ("[](https://a.example)", "https://a.example"),
    ("![mapa](https://a.example/m.png)", "mapa (https://a.example/m.png)"),
    ("[escribinos](mailto:hola@a.example)", "escribinos (mailto:hola@a.example)"),
    ("[hola@a.example](mailto:hola@a.example)", "hola@a.example"),
    ('[web](https://a.example "título")', "web (https://a.example)"),
    ("[**Reservar**](https://a.example)", "*Reservar* (https://a.example)"),
    # URLs and code are never touched
    ("https://a.example/__init__/*x*", "https://a.example/__init__/*x*"),
    ("[x](https://a.example/a_b_c__d__)", "x (https://a.example/a_b_c__d__)"),
    ("usá `**kwargs` así", "usá `**kwargs` así"),
    ("```python\nx = a**2  # *no*\n```", "```\nx = a**2  # *no*\n```"),
    ("~~~\n# not a heading\n~~~", "```\n# not a heading\n```"),
    ("```\n**open fence", "```\n**open fence"),
    ("antes\n```\n* x\n```\n* después", "antes\n```\n* x\n```\n- después"),
    # rules, blank lines, plain text
    ("uno\n\n---\n\ndos", "uno\n\n\n\ndos"),
    ("***", ""),
    ("Hola, ¿cómo estás?", "Hola, ¿cómo estás?"),
    ("", ""),
    ("línea 1\nlínea 2\n", "línea 1\nlínea 2\n"),
]


@pytest.mark.parametrize(("markdown", "whatsapp"), CASES)
def test_markdown_becomes_whatsapp_formatting(markdown: str, whatsapp: str) -> None:
    assert to_whatsapp(markdown) == whatsapp


def test_a_whole_answer() -> None:
    answer = (
        "## Turnos del sábado\n"
        "\n"
        "Tenemos **tres** horarios:\n"
        "* 10:00\n"
        "* 12:30 (_último de la mañana_)\n"
        "* 16:00 ~~15:00~~\n"
        "\n"
        "Reservá en [la web](https://turnos.example/r?d=sab&x=1_2)."
    )
    assert to_whatsapp(answer) == (
        "*Turnos del sábado*\n"
        "\n"
        "Tenemos *tres* horarios:\n"
        "- 10:00\n"
        "- 12:30 (_último de la mañana_)\n"
        "- 16:00 ~15:00~\n"
        "\n"
        "Reservá en la web (https://turnos.example/r?d=sab&x=1_2)."
    )


def test_a_single_star_is_markdowns_italic_so_the_reply_is_converted_once() -> None:
    """The model's `*x*` means italic (Markdown), so a text already in WhatsApp's style would
    lose its bold if converted again: the turn converts the stored reply once, just before
    splitting it, and stores it unconverted."""
    assert to_whatsapp(to_whatsapp("**a** _b_ ~~c~~")) == "_a_ _b_ ~c~"


def test_our_markers_in_the_answer_cannot_corrupt_it() -> None:
    assert to_whatsapp("a\x00 0\x00 b \x01**c**") == "a 0 b *c*"


def test_only_whatsapp_conversations_are_converted() -> None:
    text = "# Hola\n**Ana**"
    assert for_channel("whatsapp", text) == "*Hola*\n*Ana*"
    assert for_channel("chatwoot", text) == text
    assert for_channel("other", text) == text


# Issue 21: the AI's answer is converted, and patterns that searched the rest of the line from
# each opening were quadratic ("***a " x 3 276 took 0.93 s; 100 KB of it, over a minute). Each
# shape: 100 KB that opens much and closes little, and what the person sees of it.
SIZE = 100_000
SECONDS = 3.0  # linear takes well under 0.5 s here, even on a loaded machine


def repeat(unit: str) -> str:
    return unit * (SIZE // len(unit))


ADVERSARIAL = {
    # openings whose closings follow a blank: nothing closes, kept as written
    "bold": (repeat("**a "), repeat("**a ")),
    "underscore bold": (repeat("__a "), repeat("__a ")),
    "strike": (repeat("~~a "), repeat("~~a ")),
    "italic": (repeat("*a "), repeat("*a ")),
    "italic inside words": (repeat("a*b "), repeat("a*b ")),
    # the three stars of issue 21: two of them pair as bold across each blank
    "bold italic": (repeat("***a "), "**a " * (SIZE // 5)),
    # labels never closed, or closed without a link after them: kept as written
    "open brackets": (repeat("["), repeat("[")),
    "open images": (repeat("!["), repeat("![")),
    "labels without a url": (repeat("[a]("), repeat("[a](")),
    "one label end for every opening": ("[" * (SIZE // 2) + "](" + " " * (SIZE // 2), None),
    # backtick runs no run as long closes: kept as written
    "code runs": (repeat("``a`"), repeat("``a`")),
    "a long opening run": ("x" + "`" * (SIZE // 2) + "a" + "`a" * (SIZE // 4), None),
    # a heading's title ends before its closing blanks, however many
    "heading blanks": ("# a" + " " * SIZE + "x", "*a" + " " * SIZE + "x*"),
    "many lines": (repeat("***a \n"), repeat("***a \n")),
    "rule": ("-" + " -" * (SIZE // 2) + " x", None),
}


@pytest.mark.parametrize("text,expected", ADVERSARIAL.values(), ids=list(ADVERSARIAL))
def test_hostile_answers_are_converted_in_linear_time(text: str, expected: str | None) -> None:
    started = time.perf_counter()
    converted = to_whatsapp(text)
    elapsed = time.perf_counter() - started
    assert elapsed < SECONDS, f"{elapsed:.2f} s for {len(text)} characters"
    if expected is None:  # nothing converted: the text as written
        expected = text
    assert converted == expected


def test_a_text_without_marks_is_returned_as_it_is_and_the_rules_agree() -> None:
    """`to_whatsapp` returns a text that holds no character any rule acts on without running
    the rules: for such texts, and for texts with one such character among them, the answer is
    what the rules give (random texts over plain letters, blanks, newlines and every mark)."""
    import random

    from shared.senders import formatting

    plain = [*"ab Z9.,!?¿áé\t\n", "  ", "\n"]
    marks = [*"`~-*_#+[]():\x00\x01>=", "```py", "~~~", "---", "# ", "https://x.y", "[a](b)"]
    rng = random.Random(24)
    for n in range(4000):
        pieces = plain if n % 2 else [*plain, rng.choice(marks)]
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        assert to_whatsapp(text) == formatting._converted(text), repr(text)
    assert to_whatsapp("Claro, te ayudo.\nHasta mañana!") == "Claro, te ayudo.\nHasta mañana!"
