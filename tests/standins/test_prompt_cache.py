"""The Messages API stand-in's prompt cache, through the real SDK: every figure computed by
hand from the stand-in's tokenizer (4 characters a token, block by block) and Anthropic's
documented rules (scripts/standins/_prompt_cache.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from scripts.standins import MessagesApiStandIn
from tests.standins.support import sdk_client

SONNET, HAIKU = "claude-sonnet-5-5", "claude-haiku-5-5"
MARK = {"type": "ephemeral"}
SYSTEM = "s" * 4400  # 1 100 tokens: over Sonnet's minimum (1 024), under Haiku's (2 048)


@pytest.fixture
async def client(ai: MessagesApiStandIn) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with sdk_client(ai) as c:
        yield c


def text(value: str, marked: bool = False, ttl: str | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": value}
    if marked:
        block["cache_control"] = dict(MARK, ttl=ttl) if ttl else dict(MARK)
    return block


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(value: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [text(value)]}


async def usage(
    client: anthropic.AsyncAnthropic,
    system: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    model: str = SONNET,
    **extra: Any,
) -> tuple[int, int, int]:
    """(cache_read, cache_write, input) of one call."""
    message = await client.messages.create(
        model=model, max_tokens=64, system=system, messages=messages, **extra
    )
    u = message.usage
    return (u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0, u.input_tokens)


async def test_a_marked_system_prompt_is_written_then_read(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    question = [user(text("hola"))]  # 1 token
    assert await usage(client, [text(SYSTEM, marked=True)], question) == (0, 1100, 1)
    assert await usage(client, [text(SYSTEM, marked=True)], question) == (1100, 0, 1)
    assert len(ai.prompt_cache) == 1


async def test_a_prefix_under_the_minimum_is_not_cached(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    short = [text("s" * 4000, marked=True)]  # 1 000 tokens < 1 024
    question = [user(text("hola"))]
    for _ in range(2):
        assert await usage(client, short, question) == (0, 0, 1001)
    for _ in range(2):  # 1 100 tokens: enough on Sonnet, not on Haiku
        assert await usage(client, [text(SYSTEM, marked=True)], question, HAIKU) == (0, 0, 1101)
    assert len(ai.prompt_cache) == 0


async def test_a_conversation_reads_each_turn_what_the_previous_turn_wrote(
    client: anthropic.AsyncAnthropic,
) -> None:
    """The marks worker/brains/prompt.py places: system, the previous user message, this one."""
    system = [text(SYSTEM, marked=True)]
    u1, a1, u2 = "u" * 40, "a" * 80, "v" * 40  # 10, 20, 10 tokens
    first = [user(text(u1, marked=True))]
    assert await usage(client, system, first) == (0, 1110, 0)
    second = [user(text(u1, marked=True)), assistant(a1), user(text(u2, marked=True))]
    assert await usage(client, system, second) == (1110, 30, 0)
    # Unmarked blocks after the last mark are plain input.
    third = [*second, assistant(a1), user(text("w" * 400))]
    assert await usage(client, system, third) == (1140, 0, 120)


async def test_the_marks_are_not_part_of_the_prefix_and_a_later_mark_finds_an_earlier_entry(
    client: anthropic.AsyncAnthropic,
) -> None:
    """Up to 20 blocks back from a mark, an entry is found; the mark moved, the text the same."""
    await usage(client, [text(SYSTEM, marked=True)], [user(text("hola"))])
    assert await usage(client, [text(SYSTEM)], [user(text("hola", marked=True))]) == (1100, 1, 0)


@pytest.mark.parametrize(("blocks", "read"), [(19, 1100), (20, 0)])
async def test_a_mark_looks_back_20_blocks(
    client: anthropic.AsyncAnthropic, blocks: int, read: int
) -> None:
    """The entry is the system prompt, block 0; a mark on block n looks for entries at blocks
    n … n-19: block 19 finds it, block 20 does not (then all of it is written again)."""
    await usage(client, [text(SYSTEM, marked=True)], [user(text("hola"))])
    words = [text(f"w{i:02d}") for i in range(blocks)]  # 1 token each
    words[-1] = text(words[-1]["text"], marked=True)
    got = await usage(client, [text(SYSTEM)], [user(*words)])
    assert got == (read, 1100 + blocks - read, 0)


async def test_one_changed_character_misses(client: anthropic.AsyncAnthropic) -> None:
    question = [user(text("hola"))]
    await usage(client, [text(SYSTEM, marked=True)], question)
    changed = [text(SYSTEM[:-1] + "t", marked=True)]
    assert await usage(client, changed, question) == (0, 1100, 1)
    assert await usage(client, [text(SYSTEM, marked=True)], question, "claude-opus-4-8") == (
        0,
        1100,
        1,
    ), "an entry belongs to its model"


async def test_entries_live_five_minutes_from_their_last_use(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    question = [user(text("hola"))]
    system = [text(SYSTEM, marked=True)]
    await usage(client, system, question)
    ai.prompt_cache.advance(290)
    assert await usage(client, system, question) == (1100, 0, 1)  # a hit renews the entry
    ai.prompt_cache.advance(290)
    assert await usage(client, system, question) == (1100, 0, 1)
    ai.prompt_cache.advance(301)
    assert await usage(client, system, question) == (0, 1100, 1)  # expired: written again


async def test_an_hour_long_entry(ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic) -> None:
    system = [text(SYSTEM, marked=True, ttl="1h")]
    question = [user(text("hola"))]
    await usage(client, system, question)
    ai.prompt_cache.advance(3000)
    assert await usage(client, system, question) == (1100, 0, 1)


async def test_tools_come_first_in_the_prefix(client: anthropic.AsyncAnthropic) -> None:
    tool = {"name": "agenda", "description": "d" * 4200, "input_schema": {"type": "object"}}
    tools = [dict(tool, cache_control=MARK)]
    chars = len('{"name":"agenda","description":"","input_schema":{"type":"object"}}') + 4200
    tool_tokens = -(-chars // 4)  # its JSON, the mark left out
    question = [user(text("hola"))]
    got = await usage(client, [text("breve")], question, tools=tools)
    assert got == (0, tool_tokens, 2 + 1)
    other_system = [text("otro")]  # same tools, another tenant's prompt: the tools are read
    assert await usage(client, other_system, question, tools=tools) == (tool_tokens, 0, 1 + 1)


async def test_more_than_four_marks_are_refused(
    ai: MessagesApiStandIn, client: anthropic.AsyncAnthropic
) -> None:
    """As the API: 400 invalid_request_error, naming the count."""
    blocks = [text(f"b{i}", marked=True) for i in range(4)]
    with pytest.raises(anthropic.BadRequestError) as refused:
        await usage(client, [text(SYSTEM, marked=True)], [user(*blocks)])
    assert "A maximum of 4 blocks with cache_control may be provided. Found 5." in str(
        refused.value
    )
    assert await usage(client, [text(SYSTEM, marked=True)], [user(*blocks[:3])]) == (0, 1103, 0)


async def test_a_string_system_or_content_is_one_text_block(
    client: anthropic.AsyncAnthropic,
) -> None:
    await usage(client, [text(SYSTEM, marked=True)], [user(text("hola"))])
    message = await client.messages.create(
        model=SONNET,
        max_tokens=64,
        system=SYSTEM,
        messages=[{"role": "user", "content": [text("hola", marked=True)]}],
    )
    assert message.usage.cache_read_input_tokens == 1100


async def test_count_tokens_uses_the_same_tokenizer(client: anthropic.AsyncAnthropic) -> None:
    counted = await client.messages.count_tokens(
        model=SONNET, system=[text(SYSTEM)], messages=[user(text("hola")), assistant("a" * 9)]
    )
    assert counted.input_tokens == 1100 + 1 + 3
