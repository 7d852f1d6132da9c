"""Tools the built-in brain offers Claude: the plugins' ones (`AI_TOOLS`) and the hand-over.

A tool is a `Tool`: a name, a description, a JSON schema of its input, and an async handler
`handler(batch, input) -> str | list[content blocks]` whose answer goes back to the model as
the `tool_result`. `AI_TOOLS` lists `package.module:attr` specs, comma-separated; each attr is
a `Tool`, a list of them, or a factory called with the `Settings` that returns either
(shared/plugins.py loads them; a bad one stops the worker at start-up, naming the variable).

A handler runs inside the turn, under the person's lease, bounded by `AI_TOOL_TIMEOUT_S` and
by what is left of the turn's `AI_TURN_TIMEOUT_S`. What it raises, and a timeout, reach the
model as a `tool_result` with `is_error: true`: the model decides what to tell the person; the
turn does not fail. A handler that needs a person raises `HandOverRequested` itself, as the
built-in `hand_over_to_human` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.conversation.batch import Batch
from shared.conversation.errors import HandOverRequested
from shared.plugins import import_object
from shared.settings import ConfigError, Settings

ToolAnswer = str | list[dict[str, Any]]
Handler = Callable[[Batch, dict[str, Any]], Awaitable[ToolAnswer]]

HAND_OVER_TOOL = "hand_over_to_human"


@dataclass(frozen=True)
class Tool:
    """One tool: what the model is told of it, and the handler that answers its calls."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    handler: Handler

    def schema(self) -> dict[str, Any]:
        """The tool's entry in a Messages API request's `tools`."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": dict(self.input_schema),
        }


class Toolbox:
    """The tools of a brain by name, and how one call of the model is answered."""

    def __init__(self, tools: Iterable[Tool], timeout_s: float) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._timeout_s = timeout_s

    def __bool__(self) -> bool:
        return bool(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self._tools.values()]

    async def answer(self, batch: Batch, calls: Sequence[Any], left_s: float) -> list[Any]:
        """The `tool_result` blocks of one assistant message's `tool_use` blocks, in order.

        A hand-over among them wins: it raises `HandOverRequested` before any other runs."""
        for call in calls:
            if call.name == HAND_OVER_TOOL and HAND_OVER_TOOL in self._tools:
                await self._tools[HAND_OVER_TOOL].handler(batch, dict(call.input or {}))
        timeout_s = max(0.0, min(self._timeout_s, left_s))
        # Side by side; a handler raising HandOverRequested is raised once all have ended.
        results = await asyncio.gather(
            *(self._result(batch, c, timeout_s) for c in calls), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return list(results)

    async def _result(self, batch: Batch, call: Any, timeout_s: float) -> dict[str, Any]:
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call.id}
        tool = self._tools.get(call.name)
        if tool is None:
            return {**result, "content": f"no tool named {call.name!r}", "is_error": True}
        bound = asyncio.timeout(timeout_s)
        try:
            async with bound:
                answer = await tool.handler(batch, dict(call.input or {}))
        except TimeoutError as exc:
            late = f"no answer within {timeout_s:g} s" if bound.expired() else repr(exc)
            return {**result, "content": late, "is_error": True}
        except HandOverRequested:
            raise
        except Exception as exc:
            return {**result, "content": f"{type(exc).__name__}: {exc}"[:2000], "is_error": True}
        return {**result, "content": answer if isinstance(answer, str | list) else str(answer)}


def hand_over_tool(settings: Settings) -> Tool:
    """`hand_over_to_human(reason)`: the batch goes to review as `ai_hand_over`, the reason
    as its detail, and the person gets the tenant's `hand_over_text` (else
    `AI_HAND_OVER_TEXT`) first."""

    async def hand_over(batch: Batch, args: dict[str, Any]) -> ToolAnswer:
        reason = str(args.get("reason") or "no reason given")[:1000]
        text = settings.tenant(batch.tenant).hand_over_text
        raise HandOverRequested(reason, text)

    return Tool(
        name=HAND_OVER_TOOL,
        description=(
            "Hand the conversation over to a person of the team. Use it when the customer asks"
            " for a person, when they are upset, or when you cannot help them yourself. The"
            " customer is told that a person will continue; say nothing more after it."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "reason": {
                    "type": "string",
                    "description": "Why a person should take over, for the team (one sentence).",
                }
            },
            "required": ["reason"],
        },
        handler=hand_over,
    )


def load_tools(settings: Settings) -> Toolbox:
    """The tools `AI_TOOLS` names, then the hand-over (unless `AI_HAND_OVER_TOOL` is off)."""
    tools: list[Tool] = []
    for spec in settings.ai_tools:
        tools += _tools_of(spec, settings)
    if settings.ai_hand_over_tool:
        tools.append(hand_over_tool(settings))
    names = [tool.name for tool in tools]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"AI_TOOLS: tool names must be unique, {twice} appear twice")
    return Toolbox(tools, settings.ai_tool_timeout_s)


def _tools_of(spec: str, settings: Settings) -> list[Tool]:
    found: Any = import_object(spec, "AI_TOOLS")
    if callable(found) and not isinstance(found, Tool):
        try:
            found = found(settings)
        except TypeError as exc:
            raise ConfigError(
                f"AI_TOOLS: {spec!r} is not a factory taking the settings: {exc}"
            ) from exc
    items = [found] if isinstance(found, Tool) else found
    items = list(items) if isinstance(items, Iterable) and not isinstance(items, str) else []
    if not items or not all(isinstance(t, Tool) for t in items):
        raise ConfigError(
            f"AI_TOOLS: {spec!r} is neither a Tool nor a list of worker.brains.tools.Tool"
        )
    return items
