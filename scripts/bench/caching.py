"""Prompt caching: billed input tokens per turn, with the product's cache marks and without.

    scripts/bench_caching                       # 20 conversations of 10 turns: the table
    scripts/bench_caching --write               # also update docs/benchmarks/caching.md
    scripts/bench_caching --conversations 1     # one conversation alone

One tenant with a 2 000-token system prompt; N conversations of ten turns each, taken in
rounds (turn 1 of every conversation, then turn 2, ...), the way a tenant's traffic
interleaves. Each turn's request is built by the product's own `worker.brains.prompt.build_request`
(the default model and `MEMORY_TURNS`) from the conversation so far, its memory trimmed as
finish.lua trims it, and sent through the real `anthropic` SDK to the Messages API stand-in,
which applies Anthropic's caching rules with its tokenizer of 4 characters a token
(scripts/standins/_prompt_cache.py). The same conversations run twice, each against an empty
cache: with the marks, then with `cache=False`.

Billed input = input_tokens + 1.25 × cache_creation_input_tokens + 0.1 ×
cache_read_input_tokens (Anthropic's multipliers for a 5-minute cache write and a cache read).
Exits 1 if a turn's ratio (with / without, summed over the conversations) is above 0.3.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic

from scripts.standins import MessagesApiStandIn, last_user_text
from shared.conversation.batch import Batch, Message
from shared.settings import Settings
from worker.brains.prompt import build_request

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "benchmarks" / "caching.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
TENANT = "106540352242922"
KEY = "bench"
WRITE, READ = 1.25, 0.1
LIMIT = 0.3
SYSTEM_TOKENS = 2000
DAYS = ("lunes", "martes", "miércoles", "jueves", "viernes", "sábado")


def system_prompt(tokens: int = SYSTEM_TOKENS) -> str:
    """A business's instructions, exactly `tokens` stand-in tokens (4 characters each)."""
    lines = [
        f"{i}. Regla {i} de Turnos SRL: atendé con cortesía, confirmá día, hora y cantidad de"
        f" personas, y ofrecé el turno libre más cercano al pedido ({DAYS[i % 6]})."
        for i in range(1, 200)
    ]
    return "\n".join(lines)[: tokens * 4]


def question(conversation: int, turn: int) -> str:
    day, people = DAYS[(conversation + turn) % 6], 2 + (conversation * 7 + turn) % 5
    return f"Hola, ¿tienen turno el {day} a las {10 + turn}? Somos {people}. (consulta {turn + 1})"


def answer(body: dict[str, Any]) -> str:
    """The model's reply, ~110 tokens, deterministic from the question."""
    asked = last_user_text(body)
    return (
        f"¡Hola! Sobre tu consulta ({asked}): sí, tenemos lugar. Te reservo el turno y te pido"
        " que confirmes el nombre de quien viene y un teléfono de contacto. Si preferís otro"
        " horario, decime cuál y lo busco. ¡Gracias por escribirnos!"
    )


@dataclass
class Turn:
    input: int = 0
    write: int = 0
    read: int = 0

    @property
    def billed(self) -> float:
        return self.input + WRITE * self.write + READ * self.read

    def add(self, usage: Any) -> None:
        self.input += usage.input_tokens
        self.write += usage.cache_creation_input_tokens or 0
        self.read += usage.cache_read_input_tokens or 0


async def run(
    ai: MessagesApiStandIn, settings: Settings, conversations: int, turns: int, cache: bool
) -> list[Turn]:
    """Every conversation's turns, in rounds; the usage summed per turn number."""
    ai.prompt_cache.clear()
    client = anthropic.AsyncAnthropic(base_url=ai.url, api_key=KEY, max_retries=0, timeout=30)
    histories: list[list[dict[str, Any]]] = [[] for _ in range(conversations)]
    totals = [Turn() for _ in range(turns)]
    try:
        for turn in range(turns):
            for c in range(conversations):
                batch = _batch(c, turn, histories[c])
                request = build_request(settings, settings.tenant(TENANT), batch, cache=cache)
                message = await client.messages.create(**request)
                totals[turn].add(message.usage)
                reply = "".join(b.text for b in message.content if b.type == "text")
                kept = [*histories[c], {"user": batch.user_text, "assistant": reply}]
                histories[c] = kept[-settings.memory_turns :] if settings.memory_turns else []
    finally:
        await client.close()
    return totals


def _batch(conversation: int, turn: int, history: list[dict[str, Any]]) -> Batch:
    text = question(conversation, turn)
    return Batch(
        tenant=TENANT,
        person=f"54911555{conversation:05d}",
        id=f"b{conversation}-{turn}",
        token="t",
        attempt=0,
        claimed_ms=0,
        due_ms=0,
        requeued=False,
        messages=[Message(id=f"wamid.{conversation}.{turn}", type="text", text=text, ts=0)],
        history=list(history),
    )


def report(args: argparse.Namespace, model: str, cached: list[Turn], plain: list[Turn]) -> str:
    ratios = [c.billed / p.billed for c, p in zip(cached, plain, strict=True)]
    total = sum(c.billed for c in cached) / sum(p.billed for p in plain)
    lines = [
        f"{args.conversations} conversations × {args.turns} turns, system prompt"
        f" {SYSTEM_TOKENS} tokens, model `{model}`, MEMORY_TURNS {args.memory_turns};"
        f" {datetime.now(UTC):%Y-%m-%d}, Python {platform.python_version()}.",
        "Billed input tokens per turn, summed over the conversations (input + 1.25 × write"
        " + 0.1 × read):",
        "",
        "| turn | without caching | with caching | ratio | read | written | input |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, (c, p, ratio) in enumerate(zip(cached, plain, ratios, strict=True), start=1):
        lines.append(
            f"| {i} | {p.billed:,.0f} | {c.billed:,.0f} | {ratio:.3f} |"
            f" {c.read:,} | {c.write:,} | {c.input:,} |"
        )
    without = sum(p.billed for p in plain)
    with_ = sum(c.billed for c in cached)
    lines += [
        f"| all | {without:,.0f} | {with_:,.0f} | {total:.3f} | | | |",
        "",
        f"without: {[round(p.billed) for p in plain]}",
        f"with:    {[round(c.billed) for c in cached]}",
        f"ratio:   {[round(r, 3) for r in ratios]}",
        "",
        f"Highest turn ratio {max(ratios):.3f} (limit {LIMIT}):"
        f" {'pass' if max(ratios) <= LIMIT else 'FAIL'}.",
    ]
    return "\n".join(lines)


def write_doc(block: str) -> None:
    text = DOC.read_text()
    head, rest = text.split(START, 1)
    DOC.write_text(f"{head}{START}\n{block}\n{END}{rest.split(END, 1)[1]}")


async def main_async(args: argparse.Namespace) -> int:
    settings = Settings().with_overrides(
        system_prompt=system_prompt(), memory_turns=args.memory_turns
    )
    if args.model:
        settings = settings.with_overrides(ai_model=args.model)
    with MessagesApiStandIn(api_keys=KEY, default_reply=answer) as ai:
        cached = await run(ai, settings, args.conversations, args.turns, cache=True)
        plain = await run(ai, settings, args.conversations, args.turns, cache=False)
    block = report(args, settings.ai_model, cached, plain)
    print(block)
    if args.write:
        write_doc(block)
        print(f"wrote {DOC.relative_to(REPO)}")
    worst = max(c.billed / p.billed for c, p in zip(cached, plain, strict=True))
    return 0 if worst <= LIMIT else 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_caching",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--memory-turns", type=int, default=10, help="MEMORY_TURNS")
    parser.add_argument("--model", help="AI_MODEL (default: the product's default)")
    parser.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(REPO)}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(asyncio.run(main_async(parse_args(argv))))


if __name__ == "__main__":
    main()
