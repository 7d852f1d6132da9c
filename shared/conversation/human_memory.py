"""How the AI sees what people of the business said in a Chatwoot conversation while the bot
was silent (an agent assigned, an agent wrote, the bot handed it over).

The intake keeps those lines in the memory as one entry (shared/lua/lib/silence.lua):
`{"human": true, "lines": [{"by": "customer" | "agent", "name", "text", "id", "ts"}, ...],
"ids": [...]}`. Here each such entry gets the fields every remembered exchange has, so the
prompt (worker/brains/prompt.py), the quotes (shared/conversation/presentation.py) and custom
brains read it like any other: `header` says what this part of the conversation was, `user` is the
transcript, one line per message, each agent's line marked as a person of the business and not the
bot, and `assistant` says the bot did not answer. The same lines always give the same text (the
prompt cache compares bytes).
"""

from __future__ import annotations

from typing import Any

HEADER = "While a person of the business talked with the customer here (you were silent):"
SILENT_ANSWER = "[You did not answer: a person of the business was handling the conversation.]"


def is_human_entry(entry: Any) -> bool:
    return isinstance(entry, dict) and bool(entry.get("human"))


def with_transcript(entry: dict[str, Any]) -> dict[str, Any]:
    """A memory entry as an exchange: a human entry gains `header`, `user` and `assistant`
    (and `ids` as a list); any other entry is returned as it is."""
    if not is_human_entry(entry):
        return entry
    lines = entry.get("lines")
    ids = entry.get("ids")
    return {
        **entry,
        "header": HEADER,
        "user": "\n".join(line_of(x) for x in lines if isinstance(x, dict))
        if isinstance(lines, list)
        else "",
        "assistant": SILENT_ANSWER,
        "ids": [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else [],
    }


def line_of(line: dict[str, Any]) -> str:
    """`The customer: ...` or `Laura, a person of the business (not you): ...`."""
    text = line.get("text") if isinstance(line.get("text"), str) else ""
    name = line.get("name") if isinstance(line.get("name"), str) else ""
    if line.get("by") == "agent":
        who = (
            f"{name}, a person of the business (not you)"
            if name
            else ("A person of the business (not you)")
        )
    else:
        who = f"The customer ({name})" if name else "The customer"
    return f"{who}: {text or '[empty message]'}"
