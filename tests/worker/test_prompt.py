"""The Messages API request of a turn (worker/brains/prompt.py): the tenant's AI settings, the
history rendered the same way every turn, and cache marks only where a prefix can be cached, at most
four. Pure functions: no Redis, no stand-in (tests/standins/test_prompt_cache.py checks the
arithmetic of the cache itself, tests/delivery/test_caching.py both together)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import orjson
import pytest

from shared.conversation.batch import Batch, Message
from shared.conversation.presentation import exchange
from shared.settings import Settings
from tests.worker.support import batch_of
from worker.brains.prompt import (
    CHARS_PER_TOKEN,
    EMPTY_TEXT,
    MAX_BREAKPOINTS,
    build_request,
    language_hint,
    min_cacheable_tokens,
)

TENANT = "106540352242922"
# 4 000 characters: about 1 333 tokens by the estimate, over Sonnet's 1 024 and under Haiku's
# 2 048.
LONG_PROMPT = "Sos el asistente de Turnos SRL. " * 125
SHORT_PROMPT = "Sos el asistente."
TOOL = {"name": "agenda", "description": "Free slots of a day.", "input_schema": {"type": "object"}}


def settings(**tenant: Any) -> Settings:
    base = Settings().with_overrides(ai_model="claude-sonnet-5-5", system_prompt=SHORT_PROMPT)
    return base.with_overrides(tenants={TENANT: tenant}) if tenant else base


def batch(text: str = "hola", exchanges: int = 0, tenant: str = TENANT) -> Batch:
    history = [{"user": f"pregunta {i}", "assistant": f"respuesta {i}"} for i in range(exchanges)]
    return batch_of(
        [Message(id="wamid.1", type="text", text=text, ts=0)], tenant=tenant, history=history
    )


def request(s: Settings, b: Batch, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return build_request(s, s.tenant(b.tenant), b, tools or [])


def marks(body: dict[str, Any]) -> list[str]:
    """Where the cache marks are: "tools[i]", "system[i]", "messages[i]"."""
    found = [f"tools[{i}]" for i, t in enumerate(body.get("tools", [])) if "cache_control" in t]
    found += [f"system[{i}]" for i, b in enumerate(body["system"]) if "cache_control" in b]
    for i, message in enumerate(body["messages"]):
        found += [f"messages[{i}]" for b in message["content"] if "cache_control" in b]
    return found


def unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def test_a_short_prompt_and_history_carry_no_cache_mark() -> None:
    """The default prompt is a dozen tokens, far under any minimum: a mark would cache nothing."""
    body = request(settings(), batch(exchanges=2))
    assert marks(body) == []
    assert body["system"] == [{"type": "text", "text": SHORT_PROMPT}]
    assert body["model"] == "claude-sonnet-5-5" and body["max_tokens"] == 1024
    assert "tools" not in body


def test_every_message_is_one_text_block_history_first() -> None:
    """The batch is its presentation (shared/conversation/presentation.py): a header block, then its
    messages; a remembered exchange with a header renders it the same way."""
    header = "Date and time: Thursday 1 January 1970, 00:00 (UTC)"
    b = batch("una consulta\n¿hay turno?", exchanges=2)
    b = replace(b, history=[{**b.history[0], "header": "Date and time: …"}, b.history[1]])
    body = request(settings(), b)
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Date and time: …"},
                {"type": "text", "text": "pregunta 0"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "respuesta 0"}]},
        {"role": "user", "content": [{"type": "text", "text": "pregunta 1"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "respuesta 1"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": header},
                {"type": "text", "text": "una consulta\n¿hay turno?"},
            ],
        },
    ]


def test_a_long_system_prompt_is_marked_and_so_are_the_previous_and_this_user_message() -> None:
    body = request(settings(system_prompt=LONG_PROMPT), batch(exchanges=3))
    # messages: u0 a0 u1 a1 u2 a2 | this batch: the previous turn wrote up to u2, read back.
    assert marks(body) == ["system[0]", "messages[4]", "messages[6]"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}


def test_the_first_turn_marks_the_system_prompt_and_the_batch() -> None:
    body = request(settings(system_prompt=LONG_PROMPT), batch())
    assert marks(body) == ["system[0]", "messages[0]"]


def test_tools_come_first_their_last_one_marked_when_long_enough_and_never_changed() -> None:
    tools = [dict(TOOL, name=f"tool_{i}", description="x" * 1200) for i in range(3)]
    given = orjson.dumps(tools)
    body = request(settings(system_prompt=LONG_PROMPT), batch(exchanges=1), tools)
    assert [t["name"] for t in body["tools"]] == ["tool_0", "tool_1", "tool_2"]
    assert marks(body) == ["tools[2]", "system[0]", "messages[0]", "messages[2]"]
    assert len(marks(body)) == MAX_BREAKPOINTS
    assert orjson.dumps(tools) == given, "the caller's tool definitions are copied, not marked"


def test_short_tools_are_not_marked_but_count_towards_the_system_prefix() -> None:
    """A tool of 1 019 estimated tokens (its JSON: 3 057 characters) is under the minimum on
    its own; with the 6 of the system prompt the prefix reaches 1 025."""
    tools = [dict(TOOL, name="tool_0", description="x" * 2990)]
    assert marks(request(settings(), batch(), tools)) == ["system[0]", "messages[0]"]
    short = [dict(TOOL, name="tool_0", description="x" * 30)]
    assert marks(request(settings(), batch(), short)) == []


def test_history_alone_reaches_the_minimum_after_enough_turns() -> None:
    """A short prompt, long exchanges: the marks start at the first message whose prefix is
    long enough by the estimate, never before it."""
    pair = {"user": "u" * 600, "assistant": "a" * 900}  # 500 estimated tokens a pair
    s = settings()
    for exchanges, expected in [
        (0, []),
        (1, []),  # prefix to this batch: ~4 + 500 + 2 tokens
        (2, ["messages[4]"]),  # ~1 006 + 200 for u1 → only this batch's prefix is long enough
        (3, ["messages[4]", "messages[6]"]),
    ]:
        b = replace(batch("x" * 600 if exchanges == 2 else "hola"), history=[pair] * exchanges)
        assert marks(request(s, b)) == expected, exchanges


def test_the_prefix_is_the_same_bytes_turn_after_turn() -> None:
    """What turn n sent, up to its last message, is byte for byte the start of turn n+1 (the
    marks aside), and turn n+1 marks exactly the block turn n wrote to the cache."""
    s = settings(system_prompt=LONG_PROMPT)
    tools = [TOOL]
    previous: dict[str, Any] | None = None
    history: list[dict[str, Any]] = []
    for turn in range(6):
        b = replace(batch(f"mensaje {turn}"), history=list(history))
        body = request(s, b, tools)
        if previous is not None:
            n = len(previous["messages"])
            for key in ("tools", "system"):
                assert orjson.dumps(unmarked(body[key])) == orjson.dumps(unmarked(previous[key]))
            assert orjson.dumps(unmarked(body["messages"][:n])) == orjson.dumps(
                unmarked(previous["messages"])
            )
            assert f"messages[{n - 1}]" in marks(body), "turn n's write is read back exactly"
        assert f"messages[{len(body['messages']) - 1}]" in marks(body)
        # What the worker remembers of the turn (worker/turn/turn.py), through JSON as in Redis.
        history.append(orjson.loads(orjson.dumps(exchange(b, s, f"respuesta {turn}", []))))
        previous = body


@pytest.mark.parametrize(
    ("exchanges", "expected"),
    [
        (0, ["system[0]", "messages[0]"]),
        (1, ["system[0]", "messages[0]", "messages[2]"]),
        # The next turn drops the first exchange: this one is not written for it.
        (2, ["system[0]", "messages[2]"]),
        # Memory full: this turn dropped one, the next drops one: only the prompt is read.
        (3, ["system[0]"]),
        (7, ["system[0]"]),
    ],
)
def test_no_message_is_marked_whose_prefix_the_next_turn_would_not_share(
    exchanges: int, expected: list[str]
) -> None:
    """memory_turns = 3: once the memory is full every turn drops the oldest exchange, and a
    mark on the history would be written each turn (1.25 times the price) and never read."""
    s = settings(system_prompt=LONG_PROMPT, memory_turns=3)
    assert marks(request(s, batch(exchanges=exchanges))) == expected


@pytest.mark.parametrize("seed", range(40))
def test_never_more_than_four_marks_and_never_on_a_short_prefix(seed: int) -> None:
    rng = random.Random(seed)
    tools = [dict(TOOL, name=f"t{i}", description="d" * rng.randint(0, 2000)) for i in range(3)]
    s = settings(system_prompt="p" * rng.randint(1, 5000), model=rng.choice(["sonnet", "haiku"]))
    b = batch("m" * rng.randint(0, 3000), exchanges=rng.randint(0, 12))
    body = request(s, b, tools[: rng.randint(0, 3)])
    assert len(marks(body)) <= MAX_BREAKPOINTS
    minimum = min_cacheable_tokens(body["model"])
    prefix = 0
    blocks = [*body.get("tools", []), *body["system"]]
    blocks += [block for message in body["messages"] for block in message["content"]]
    for block in blocks:
        text = block.get("text")
        chars = len(text) if isinstance(text, str) else len(orjson.dumps(unmarked(block)))
        prefix += max(1, -(-chars // CHARS_PER_TOKEN))
        if "cache_control" in block:
            assert prefix >= minimum, (seed, prefix, minimum)


@pytest.mark.parametrize(
    ("model", "minimum"),
    [
        ("claude-sonnet-5-5", 1024),
        ("claude-opus-4-8", 1024),
        ("claude-sonnet-4-5-20250929", 1024),
        ("claude-haiku-5-5", 2048),
        ("claude-haiku-4-5", 4096),
        ("claude-opus-4-5-20251101", 4096),
        ("claude-opus-4-6", 4096),
    ],
)
def test_minimum_cacheable_length_by_model(model: str, minimum: int) -> None:
    assert min_cacheable_tokens(model) == minimum


def test_a_prompt_long_enough_for_sonnet_is_not_marked_on_haiku() -> None:
    assert marks(request(settings(system_prompt=LONG_PROMPT), batch())) != []
    haiku = settings(system_prompt=LONG_PROMPT, model="claude-haiku-5-5")
    assert marks(request(haiku, batch())) == []


def test_caching_off_marks_nothing() -> None:
    s = settings(system_prompt=LONG_PROMPT)
    body = build_request(s, s.tenant(TENANT), batch(exchanges=3), [TOOL], cache=False)
    assert marks(body) == []


def test_the_tenants_ai_settings_win_over_the_global_ones() -> None:
    s = settings(
        model="claude-opus-4-8",
        max_tokens=300,
        system_prompt="Sé breve.",
        memory_turns=2,
        language="es-AR",
    )
    body = request(s, batch(exchanges=5))
    assert (body["model"], body["max_tokens"]) == ("claude-opus-4-8", 300)
    assert body["system"][0]["text"] == "Sé breve.\n\nAnswer in Spanish (es-AR)."
    texts = [m["content"][-1]["text"] for m in body["messages"]]  # the last: after the header
    assert texts == ["pregunta 3", "respuesta 3", "pregunta 4", "respuesta 4", "hola"]
    other = request(s, batch(exchanges=5, tenant="333"))
    assert (other["model"], other["max_tokens"]) == ("claude-sonnet-5-5", 1024)
    assert other["system"][0]["text"] == SHORT_PROMPT and len(other["messages"]) == 11


def test_memory_turns_zero_sends_no_history_and_the_language_goes_after_the_global_prompt() -> None:
    body = request(settings(memory_turns=0, language="Portuguese"), batch(exchanges=4))
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert body["system"][0]["text"] == f"{SHORT_PROMPT}\n\nAnswer in Portuguese."


def test_an_empty_text_becomes_a_placeholder_the_api_accepts() -> None:
    """The API refuses empty text blocks (400): a burst of stickers must not fail the turn."""
    b = replace(batch(""), history=[{"user": "  ", "assistant": None}])
    texts = [m["content"][-1]["text"] for m in request(settings(), b)["messages"]]
    assert texts == [EMPTY_TEXT, EMPTY_TEXT, EMPTY_TEXT]


@pytest.mark.parametrize(
    ("language", "hint"),
    [
        ("Spanish", "Answer in Spanish."),
        ("Spanish.", "Answer in Spanish."),
        ("rioplatense Spanish, with vos", "Answer in rioplatense Spanish, with vos."),
        ("es", "Answer in Spanish."),
        ("es-AR", "Answer in Spanish (es-AR)."),
        ("pt_BR", "Answer in Portuguese (pt_BR)."),
        ("es-419", "Answer in Spanish (es-419)."),
        ("gn-PY", "Answer in the language of the locale gn-PY."),
        (" en ", "Answer in English."),
    ],
)
def test_language_hints(language: str, hint: str) -> None:
    assert language_hint(language) == hint
