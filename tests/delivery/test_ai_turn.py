"""The AI side of a turn, through a real worker, the anthropic SDK and the Graph API stand-in:
the typing indicator kept up while the AI is slow, Markdown turned into WhatsApp's formatting,
the tenant's AI settings from TENANTS_FILE, and prompt caching with its usage logged."""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.conversation.turn_state import USAGE_FIELDS
from shared.keys import Keys
from tests.delivery.support import TENANT, InProcessWorkers, ai_requests, said
from tests.worker.support import push_message, stats, wait_for

PERSON = "5491155550061"
LONG_PROMPT = "Sos el asistente de Turnos SRL: respondé breve y con amabilidad. " * 70


async def _turn_done(redis: Redis, prefix: str, count: int = 1) -> None:
    async def done() -> bool:
        return (await stats(redis, prefix)).get("turns", 0) >= count

    await wait_for(done, f"{count} turn(s) done")


async def test_a_slow_ai_keeps_the_typing_indicator_up_until_the_reply_and_not_after(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Meta drops the indicator after 25 s: it is sent again every TYPING_REFRESH_S (0.4 s
    here) while the AI takes 2.4 s, and never once the reply went out."""
    await workers.start(TYPING_REFRESH_S=0.4)
    ai.hang_next(1, 2.4)
    await push_message(redis, prefix, PERSON, "wamid.k1", "hola")
    (reply,) = await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=15)
    await _turn_done(redis, prefix)
    await asyncio.sleep(1.0)  # more than two refresh intervals: a refresher left running shows

    receipts = graph.read_receipts()
    assert {(r.message_id, r.typing_indicator) for r in receipts} == {("wamid.k1", "text")}
    # 1 at the start + one per 0.4 s of a 2.4 s wait (6); generous for a loaded machine.
    assert 3 <= len(receipts) <= 10, [r.time for r in receipts]
    assert all(r.time < reply.time for r in receipts), "no typing indicator after the reply"
    gaps = [b.time - a.time for a, b in itertools.pairwise(receipts)]
    assert max(gaps) < 1.5, gaps


async def test_a_quick_turn_shows_the_typing_indicator_once(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    await workers.start(TYPING_REFRESH_S=0.5)
    await push_message(redis, prefix, PERSON, "wamid.k2", "hola")
    await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=10)
    await _turn_done(redis, prefix)
    await asyncio.sleep(1.2)
    assert len(graph.read_receipts()) == 1


async def test_markdown_reaches_whatsapp_in_its_formatting_and_memory_keeps_the_answer(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    answer = "## Horarios\n* **Sábado**: 10 a 13\n* Más en [la web](https://turnos.example)"
    ai.queue_reply(answer, "Listo.")
    await workers.start()
    await push_message(redis, prefix, PERSON, "wamid.k3", "¿horarios?")
    (reply,) = await graph.await_for(lambda: graph.sent_texts(to=PERSON), timeout=10)
    assert reply.body == "*Horarios*\n- *Sábado*: 10 a 13\n- Más en la web (https://turnos.example)"

    await push_message(redis, prefix, PERSON, "wamid.k4", "gracias")
    await graph.await_for(lambda: len(graph.sent_texts(to=PERSON)) == 2, timeout=10)
    second = ai_requests(ai)[1].body["messages"]
    assert said(second) == [("user", "¿horarios?"), ("assistant", answer), ("user", "gracias")]


async def test_the_tenants_ai_settings_shape_its_requests(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    tmp_path: Path,
) -> None:
    tenants = tmp_path / "ai-tenants.toml"
    tenants.write_text(
        f'[tenants."{TENANT}"]\n'
        'model = "claude-opus-4-8"\nmax_tokens = 300\nmemory_turns = 1\nlanguage = "es-AR"\n'
        'system_prompt = "Sé breve."\n'
    )
    await workers.start(TENANTS_FILE=tenants)
    for n, line in enumerate(["uno", "dos", "tres"]):
        await push_message(redis, prefix, PERSON, f"wamid.k5.{n}", line)
        await graph.await_for(lambda n=n: len(graph.sent_texts(to=PERSON)) == n + 1, timeout=10)

    bodies = [r.body for r in ai_requests(ai)]
    assert {(b["model"], b["max_tokens"]) for b in bodies} == {("claude-opus-4-8", 300)}
    system = "Sé breve.\n\nAnswer in Spanish (es-AR)."
    assert bodies[0]["system"] == [{"type": "text", "text": system}]
    # memory_turns = 1: the third turn sees the second exchange only, and memory keeps one.
    assert said(bodies[2]["messages"]) == [
        ("user", "dos"),
        ("assistant", "stand-in reply to: dos"),
        ("user", "tres"),
    ]
    await _turn_done(redis, prefix, 3)
    assert await redis.llen(Keys(prefix).tenant(TENANT).memory(PERSON)) == 1


async def test_a_long_prompt_is_cached_and_each_turn_logs_its_tokens(
    redis: Redis,
    prefix: str,
    workers: InProcessWorkers,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 4 550-character prompt (1 138 stand-in tokens): the first turn writes it and the
    batch, the second reads all of that back and writes its own exchange. No tools, so the
    prompt is the whole stable prefix (a tool's definition would come first)."""
    caplog.set_level(logging.INFO, logger="worker.turn.turn")
    tenants = tmp_path / "cached-tenants.toml"
    tenants.write_text(f'[tenants."{TENANT}"]\nsystem_prompt = "{LONG_PROMPT}"\n')
    await workers.start(TENANTS_FILE=tenants, AI_HAND_OVER_TOOL="false")
    for n, line in enumerate(["hola", "¿hay turno el sábado?"]):
        await push_message(redis, prefix, PERSON, f"wamid.k6.{n}", line)
        await _turn_done(redis, prefix, n + 1)

    usages = [r.response["usage"] for r in ai_requests(ai)]
    prompt_tokens = -(-len(LONG_PROMPT) // 4)
    # The first batch: its header block (date and time, shared/conversation/presentation.py) and
    # "hola".
    header = ai_requests(ai)[0].body["messages"][-1]["content"][0]["text"]
    first_turn = prompt_tokens + -(-len(header) // 4) + 1
    assert usages[0]["cache_read_input_tokens"] == 0
    assert usages[0]["cache_creation_input_tokens"] == first_turn
    # Remembered, it renders the same bytes: the second turn reads all of it back.
    assert usages[1]["cache_read_input_tokens"] == first_turn
    assert usages[1]["cache_creation_input_tokens"] > 0

    lines = [r for r in caplog.records if r.getMessage().startswith("ai usage")]
    assert len(lines) == 2
    for line, usage in zip(lines, usages, strict=True):
        assert line.levelno == logging.INFO and getattr(line, "outcome", None) == "ai"
        for name in USAGE_FIELDS:
            assert getattr(line, name) == usage[name], name
        assert "hola" not in line.getMessage() and "sábado" not in line.getMessage()
