"""Loading the built-in brain's tools from AI_TOOLS: what a request offers Claude, and bad
specs that stop the worker naming the variable (in-process; no AI call)."""

from __future__ import annotations

import pytest

from shared.conversation.batch import Batch, Message
from shared.settings import ConfigError, Settings
from worker.brains.anthropic_brain import AnthropicBrain
from worker.brains.tools import HAND_OVER_TOOL, load_tools

TOOLS = "tests.delivery.ai_tools"


def _batch() -> Batch:
    return Batch("t", "p", "b1", "tok", 0, 0, 0, False, [Message("m1", "text", "hola", 0)])


def _names(settings: Settings) -> list[str]:
    return [schema["name"] for schema in load_tools(settings).schemas()]


def test_the_hand_over_tool_is_offered_unless_turned_off() -> None:
    assert _names(Settings()) == [HAND_OVER_TOOL]
    assert _names(Settings.from_env({"AI_HAND_OVER_TOOL": "false"})) == []
    brain = AnthropicBrain(Settings.from_env({"AI_HAND_OVER_TOOL": "false"}))
    assert "tools" not in brain.request(_batch()), "no tools: no `tools` in the request"
    (schema,) = AnthropicBrain(Settings()).request(_batch())["tools"]
    assert schema["name"] == HAND_OVER_TOOL
    assert schema["input_schema"]["required"] == ["reason"]


def test_a_tool_a_list_and_a_factory_are_registered_in_order() -> None:
    settings = Settings.from_env({"AI_TOOLS": f"{TOOLS}:ONE_TOOL, {TOOLS}:tools"})
    assert _names(settings) == [
        "one",
        "check_calendar",
        "broken_lookup",
        "slow_lookup",
        HAND_OVER_TOOL,
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "AI_TOOLS must be"),
        (f"{TOOLS}:Missing", f"AI_TOOLS='{TOOLS}:Missing' cannot be loaded"),
        ("no_such_module_xyz:tools", "cannot be loaded"),
        (f"{TOOLS}:NOT_A_TOOL", "is neither a Tool nor a list"),
        (f"{TOOLS}:SAME_NAME_TWICE", "tool names must be unique, ['one'] appear twice"),
        (f"{TOOLS}:record_key", "is neither a Tool nor a list"),  # a factory of something else
    ],
)
def test_bad_tools_are_config_errors_naming_ai_tools(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_tools(Settings.from_env({"AI_TOOLS": spec}))
    assert message in str(caught.value)
