"""Reads the Lua in `shared/lua/`: each script's header, and the one chunk Redis runs.

A script opens with a header of comment lines naming its contract, one entry a line:

    -- KEYS[1] inbox         what the key is (its type)
    -- KEYS[2..] seen        a key repeated to the end of KEYS, one per item
    -- ARGV[1] dedupe_ttl_s  what the argument is
    -- ARGV[3..] turns[person, token]  a group of arguments repeated to the end of ARGV
    -- Returns ...
    -- uses: lib/keys.lua (conv_key, LOCK), lib/clock.lua (now_ms)

Names are the names a call gives its values by (shared/storage/scripts.py), in the order
listed here and nowhere else; a KEYS or ARGV name that is a `TenantKeys` property is taken
from the tenant's keys. `uses:` (one line or several; `-- uses: none` for nothing) names the
helper files under `lib/` and what the script takes from each. The chunk sent to Redis is
those helpers, each once, a helper's own `uses:` before it, then the script: only what a
script declares is in it, so a script calling an undeclared helper fails on Redis (and in
tests/test_lua_headers.py).

Constants Python also needs are spelled in Python only (shared/keys.py,
shared/fleet/dispatch_lag.py)
and appear in Lua as `{{NAME}}`, replaced by the value's text (a string as is, to be put in
quotes by the Lua around it; numbers joined by ", "). An unknown name, or a `{{...}}` left over,
raises `LuaSourceError`: nothing half-substituted ever reaches Redis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from shared import keys
from shared.conversation import index as conversation_index
from shared.conversation import late_failure_codes
from shared.fleet import dispatch_lag, stats_hash

LUA_DIR = Path(__file__).parent.parent / "lua"

_VALUE = re.compile(r"[\w:.-]*")


class LuaSourceError(ValueError):
    """A Lua file the loader cannot turn into a script: the message names file and cause."""


def _text(value: str | int | tuple[int, ...]) -> str:
    if isinstance(value, tuple):
        return ", ".join(str(int(v)) for v in value)
    text = str(value)
    if not _VALUE.fullmatch(text):
        raise LuaSourceError(f"{text!r} cannot be written into Lua as a placeholder's value")
    return text


_PYTHON_VALUES: dict[str, str | int | tuple[int, ...]] = {
    "PENDING": keys.PENDING,
    "BATCH": keys.BATCH,
    "LOCK": keys.LOCK,
    "LASTIN": keys.LASTIN,
    "MEMORY": keys.MEMORY,
    "CONTEXT": keys.CONTEXT,
    "NOTIFY_EVENTS": keys.NOTIFY_EVENTS,
    "REVIEW_IX": keys.REVIEW_IX,
    "REVIEW_IX_REASON": keys.REVIEW_IX_REASON,
    "REVIEW_IX_OF": keys.REVIEW_IX_OF,
    "REVIEW_COUNTS": keys.REVIEW_COUNTS,
    "REVIEW_IX_PERSON": keys.REVIEW_IX_PERSON,
    "SILENT": keys.SILENT,
    "HUMAN": keys.HUMAN,
    "SENT": keys.SENT,
    "LATE": keys.LATE,
    "OUTBOUND": keys.OUTBOUND,
    "OUTBOUND_BOOK": keys.OUTBOUND_BOOK,
    "LASTIN_BOOK": keys.LASTIN_BOOK,
    "BOOK_GENS": keys.BOOK_GENS,
    "STATS_LAYOUT_FIELD": stats_hash.LAYOUT_FIELD,
    "STATS_LAYOUT": stats_hash.LAYOUT,
    "SENT_KEEP": late_failure_codes.SENT_KEEP,
    "CONVERSATIONS_KEPT": conversation_index.KEPT,
    "CONVERSATIONS_KEPT_MS": conversation_index.KEPT_MS,
    "SENT_TTL_S": late_failure_codes.SENT_TTL_S,
    "LATE_TTL_S": late_failure_codes.LATE_TTL_S,
    "LAG_BUCKETS_MS": dispatch_lag.BUCKETS_MS,
    "LAG_BUCKET_PREFIX": dispatch_lag.BUCKET_PREFIX,
    "LAG_INF": dispatch_lag.INF,
    "LAG_SUM_FIELD": dispatch_lag.SUM_FIELD,
    "LAG_COUNT_FIELD": dispatch_lag.COUNT_FIELD,
}
# What `{{NAME}}` stands for in the Lua files.
CONSTANTS = {name: _text(value) for name, value in _PYTHON_VALUES.items()}

_PLACEHOLDER = re.compile(r"\{\{([A-Z][A-Z0-9_]*)\}\}")
_LEFTOVER = re.compile(r"\{\{\s*[\w.$]*\s*\}\}")
_SLOT = re.compile(r"--\s+(KEYS|ARGV)\[(\d+)(\.\.)?\]\s+(\w+)(?:\[(\w+(?:,\s*\w+)*)\])?")
_USES = re.compile(r"--\s+uses:(.*)")
_USE = re.compile(r"(lib/[\w/]+\.lua)\s*(?:\(([^)]*)\))?")
_EXPORT = re.compile(r"^local[ \t]+(?:function[ \t]+(\w+)|([\w, \t]+?)[ \t]*=)", re.MULTILINE)


@dataclass(frozen=True)
class Slot:
    """One `KEYS[i]` or `ARGV[i]` entry; `repeats` for `[i..]`, whose group is `fields`."""

    index: int
    name: str
    repeats: bool = False
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class Use:
    """A helper file a script (or helper) takes names from: `lib/keys.lua (conv_key, LOCK)`."""

    lib: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Header:
    """What a Lua file's leading comment block declares."""

    keys: tuple[Slot, ...]
    argv: tuple[Slot, ...]
    returns: str  # the `-- Returns` sentence, "" if there is none
    uses: tuple[Use, ...] | None  # None: no `uses:` line at all


def header_lines(text: str) -> list[str]:
    """The leading block of comment lines."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return lines


def read_header(text: str, where: str = "<lua>") -> Header:
    lines = header_lines(text)
    slots: dict[str, list[Slot]] = {"KEYS": [], "ARGV": []}
    uses: list[Use] | None = None
    returns = ""
    for i, line in enumerate(lines):
        if slot := _SLOT.match(line):
            kind, index, repeats, name, fields = slot.groups()
            group = tuple(f.strip() for f in fields.split(",")) if fields else ()
            slots[kind].append(Slot(int(index), name, bool(repeats), group))
        elif match := _USES.match(line):
            uses = (uses or []) + _read_uses(match.group(1), where)
        elif line.startswith("-- Returns"):
            rest = [ln[2:].strip() for ln in lines[i:]]
            returns = " ".join(rest[: rest.index("") if "" in rest else len(rest)])
    for kind, entries in slots.items():
        _check_slots(kind, entries, where)
    declared = None if uses is None else tuple(uses)
    return Header(tuple(slots["KEYS"]), tuple(slots["ARGV"]), returns, declared)


def _read_uses(text: str, where: str) -> list[Use]:
    if text.strip() == "none":
        return []
    found = [
        Use(lib, tuple(n.strip() for n in names.split(",") if n.strip()))
        for lib, names in _USE.findall(text)
    ]
    if not found or _USE.sub("", text).strip(" ,"):
        raise LuaSourceError(f"{where}: cannot read `uses:{text}`: lib/<file>.lua (<names>), ...")
    return found


def _check_slots(kind: str, entries: list[Slot], where: str) -> None:
    indexes = [s.index for s in entries]
    if indexes != list(range(1, len(entries) + 1)):
        raise LuaSourceError(f"{where}: {kind} entries must be numbered 1, 2, ...: {indexes}")
    if any(s.repeats for s in entries[:-1]):
        raise LuaSourceError(f"{where}: only the last {kind} entry may repeat ([i..])")


def exported_names(text: str) -> set[str]:
    """The names a helper file defines at its top level (`local function f`, `local A, B =`)."""
    names: set[str] = set()
    for function, variables in _EXPORT.findall(text):
        names.update([function] if function else (v.strip() for v in variables.split(",")))
    return names


def helpers_of(header: Header, directory: Path, where: str) -> list[str]:
    """The helper files (`lib/...`) the chunk holds, each once, dependencies first."""
    ordered: list[str] = []
    visiting: list[str] = []

    def visit(use: Use, by: str) -> None:
        path = directory / use.lib
        if not path.is_file():
            raise LuaSourceError(f"{by} uses {use.lib}, which does not exist in {directory}")
        text = path.read_text()
        missing = sorted(set(use.names) - exported_names(text))
        if missing:
            raise LuaSourceError(
                f"{by} takes {', '.join(missing)} from {use.lib}: not defined there"
            )
        if use.lib in ordered:
            return
        if use.lib in visiting:
            raise LuaSourceError(f"helpers use each other in a circle: {' -> '.join(visiting)}")
        visiting.append(use.lib)
        for dependency in read_header(text, use.lib).uses or ():
            visit(dependency, use.lib)
        visiting.pop()
        ordered.append(use.lib)

    for use in header.uses or ():
        visit(use, where)
    return ordered


def substitute(text: str, where: str) -> str:
    """Replace every `{{NAME}}` by its constant; raise on an unknown or leftover placeholder."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in CONSTANTS:
            raise LuaSourceError(f"{where}: unknown placeholder {{{{{name}}}}}")
        return CONSTANTS[name]

    out = _PLACEHOLDER.sub(value, text)
    if leftover := _LEFTOVER.search(out):
        raise LuaSourceError(f"{where}: placeholder {leftover.group(0)} not substituted")
    return out


def _parts(text: str, directory: Path, where: str) -> list[tuple[str, str]]:
    """The helper files a script's text uses, (name, text) each, dependencies first."""
    header = read_header(text, where)
    return [(lib, (directory / lib).read_text()) for lib in helpers_of(header, directory, where)]


def _joined(parts: list[tuple[str, str]]) -> str:
    # Each part under its file's name: Redis reports errors by line of the whole chunk.
    return "".join(f"-- {name}\n{_line_ended(substitute(part, name))}" for name, part in parts)


def assemble(text: str, directory: Path = LUA_DIR, where: str = "<lua>") -> str:
    """The chunk Redis runs for a script's text: its helpers, then the script."""
    return _joined([*_parts(text, directory, where), (where, text)])


# A helper that keeps state for one script call defines `<name>_new_call()`, which clears it:
# a function library lives on between calls (see `function_library`).
_NEW_CALL = re.compile(r"^local function (\w+_new_call)\(\)", re.M)


def function_library(name: str, function: str, directory: Path = LUA_DIR) -> str:
    """`<directory>/<name>.lua` as a Redis function library (FUNCTION LOAD, called by FCALL):
    its helpers, then the script as the body of function `function`, KEYS and ARGV its
    arguments, as EVAL would give them. The helpers are made once, when Redis loads the
    library, instead of at every call: for the finish that was two thirds of what Redis spent
    on a call that did nothing (docs/benchmarks/worker.md). The library takes the function's
    name. Each helper's per-call state is cleared as the call begins (`*_new_call`)."""
    path = _script_path(name, directory)
    text = path.read_text()
    parts = _parts(text, directory, path.name)
    resets = "".join(f"{reset}()\n" for _, part in parts for reset in _NEW_CALL.findall(part))
    return (
        f"#!lua name={function}\n{_joined(parts)}"
        f"redis.register_function('{function}', function(KEYS, ARGV)\n{resets}"
        f"{_joined([(path.name, text)])}end)\n"
    )


def _line_ended(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _script_path(name: str, directory: Path) -> Path:
    path = directory / f"{name}.lua"
    if not path.is_file():
        raise LuaSourceError(f"no Lua script named {name!r} in {directory}")
    return path


def script_source(name: str, directory: Path = LUA_DIR) -> str:
    """The assembled chunk of `<directory>/<name>.lua`."""
    path = _script_path(name, directory)
    return assemble(path.read_text(), directory, path.name)


def script_names(directory: Path = LUA_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.lua"))
