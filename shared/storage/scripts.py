"""Loads the Lua scripts in `shared/lua/` once and calls them by SHA, with named values.

Each script is sent as one chunk: the helpers its header declares (`-- uses: lib/...`), then
the script, with the constants Python also needs written in (shared/storage/lua_source.py).

A call names its values as the script's header names its KEYS and ARGV; the order comes from
the header alone, read once at load (`Signature`):

    await scripts.forget(redis, tenant_keys, person=p, kinds=k, user_ids=[...])
    scripts.claim.queue(pipe, tenant_keys, max_claim=8, lease_ms=30000, ...)
    command = scripts.finish.command(tenant_keys, person=p, token=t, ...)

A KEYS entry, or an ARGV entry, whose name is a `TenantKeys` property (`due`, `stats`,
`conversation_prefix`, ...) is taken from the tenant's keys unless the call gives it; every
other name must be given. A missing or unknown name raises `ScriptCallError` naming the script
and the name before anything is sent. A repeated entry (`KEYS[2..] seen`) takes a sequence,
a repeated group (`ARGV[3..] turns[person, token]`) a sequence of tuples.

On one Redis 7 or newer the scripts are loaded as function libraries and called by FCALL
(shared/storage/functions.py): Redis then makes a script's helpers once, not at every call. On
a cluster, or a server without functions, they are loaded with SCRIPT LOAD and called by
EVALSHA. Either way, if Redis answers that it does not know the script (NOSCRIPT, or "Function
not found": it restarted without persistence, a failover, an operator's FUNCTION FLUSH) it is
loaded again and the call repeated, which is safe because such a call did nothing. A call can
also be queued on a pipeline (`queue`) or built as a command (`command`), the building blocks
of group commit, whose committer reloads the same way.

To see or run the chunk Redis gets for a script (e.g. with `redis-cli --eval`):

    python -m shared.storage.scripts show claim > /tmp/claim.lua
    redis-cli --eval /tmp/claim.lua <keys...> , <args...>
    python -m shared.storage.scripts list     # every script and its SHA
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import hiredis
from redis.exceptions import NoScriptError, ResponseError

from shared.keys import TenantKeys
from shared.storage.functions import FUNCTION_NOT_FOUND, load_functions
from shared.storage.lua_source import (
    LUA_DIR,
    Header,
    Slot,
    function_library,
    read_header,
    script_names,
    script_source,
)
from shared.storage.raw_pipeline import Prepacked
from shared.storage.redis_client import is_cluster

__all__ = [
    "LUA_DIR",
    "BoundCall",
    "Command",
    "Script",
    "ScriptArg",
    "ScriptCallError",
    "Scripts",
    "Signature",
    "is_noscript",
]

ScriptArg = str | bytes | int | float
# "EVALSHA", sha (or "FCALL", function name), how many keys, the keys, the arguments
Command = tuple[ScriptArg, ...]


class CallMode:
    """How a `Scripts`' calls reach Redis, decided when they are loaded: FCALL of function
    libraries, or EVALSHA (the default, until a load found functions)."""

    functions = False


# Header names a call may leave out: the tenant's keys hold them.
TENANT_KEY_NAMES = frozenset(
    name for name, attr in vars(TenantKeys).items() if isinstance(attr, property | cached_property)
)


class ScriptCallError(TypeError):
    """A script called without a value its header names, or with one it does not."""


def _getter(
    make: Callable[..., Callable[[Any], Any]], names: tuple[str, ...]
) -> Callable[[Any], tuple[Any, ...]]:
    """`itemgetter(*names)` or `attrgetter(*names)` (lookups in C, in order), always giving a
    tuple: for one name those give the value itself, for none they cannot be made."""
    if len(names) > 1:
        return make(*names)
    if names:
        one = make(names[0])
        return lambda source: (one(source),)
    return lambda source: ()


class _Entries:
    """One side of a header (its KEYS or its ARGV), in order, as a call fills it."""

    def __init__(self, script: str, slots: tuple[Slot, ...]) -> None:
        self._script = script
        self._fixed = _getter(itemgetter, tuple(s.name for s in slots if not s.repeats))
        rest = slots[-1] if slots and slots[-1].repeats else None
        self._rest = rest.name if rest else ""
        self._width = len(rest.fields) if rest else 0

    def take(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The entries in order; KeyError names a missing one."""
        fixed = self._fixed(values)
        if not self._rest:
            return fixed
        items = values[self._rest]
        if not self._width:
            return (*fixed, *items)
        for item in items:
            if len(item) != self._width:
                raise ScriptCallError(
                    f"{self._script}.lua: each {self._rest} item has {self._width}"
                    f" values, not {len(item)}: {item!r}"
                )
        return (*fixed, *(value for item in items for value in item))


class Signature:
    """How a script's KEYS and ARGV are built from named values, in its header's order.

    Worked out once per script; a call only looks its names up."""

    def __init__(self, script: str, header: Header) -> None:
        self.script = script
        self._header = header
        self._keys = _Entries(script, header.keys)
        self._argv = _Entries(script, header.argv)
        slots = (*header.keys, *header.argv)
        self.names = frozenset(s.name for s in slots)
        self._from_tenant = tuple(sorted(self.names & TENANT_KEY_NAMES))
        self._tenant_values = _getter(attrgetter, self._from_tenant)
        self._label = {
            s.name: f"{kind}[{s.index}{'..' if s.repeats else ''}] {s.name}"
            for kind, side in (("ARGV", header.argv), ("KEYS", header.keys))
            for s in side
        }

    def build(
        self, tenant_keys: TenantKeys | None, values: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """KEYS and ARGV for these values; raises `ScriptCallError` for a missing or unknown
        name. `tenant_keys` gives the names a call leaves out (None: every name is given)."""
        if not self.names.issuperset(values):
            unknown = ", ".join(sorted(set(values) - self.names))
            raise ScriptCallError(f"{self.script}.lua has no KEYS or ARGV named {unknown}")
        named = (
            {}
            if tenant_keys is None
            else dict(zip(self._from_tenant, self._tenant_values(tenant_keys), strict=True))
        )
        named.update(values)  # a value given wins over the tenant's
        try:
            return self._keys.take(named), self._argv.take(named)
        except KeyError as missing:
            name = missing.args[0]
            raise ScriptCallError(f"{self.script}.lua: no value for {self._label[name]}") from None


# How many values a bound call's fixed head must hold to be sent prepacked (`BoundCall`):
# save_reply's five cost more instructions prepacked (turn_instructions --side worker).
MIN_PREPACKED = 8


class BoundCall:
    """A script's calls for one tenant with some values fixed (`Script.bind`): the command is
    a copy of a template with the remaining values put in, for the calls a turn makes on the
    hot path (building the command name by name cost ~5 µs per call)."""

    def __init__(
        self, script: Script, tenant_keys: TenantKeys | None, fixed: Mapping[str, Any]
    ) -> None:
        header, signature = script.signature._header, script.signature
        if any(s.repeats for s in header.keys):
            raise ScriptCallError(f"{script.name}.lua: a call with repeated KEYS cannot be bound")
        named = dict(fixed)
        if tenant_keys is not None:
            for name in signature.names & TENANT_KEY_NAMES:
                named.setdefault(name, getattr(tenant_keys, name))
        template: list[Any] = ["EVALSHA", script.sha, len(header.keys)]
        self._mode = script.mode
        self._holes: list[tuple[int, str]] = []
        self._rest, self._width = "", 0
        self._fields: tuple[str, ...] = ()
        for slot in (*header.keys, *header.argv):
            if slot.repeats:
                self._rest, self._width = slot.name, len(slot.fields)
                self._fields = slot.fields
            elif slot.name in named:
                template.append(named[slot.name])
            else:
                self._holes.append((len(template), slot.name))
                template.append(None)
        self._template = template
        self._fcall = ["FCALL", script.function, *template[2:]]
        self._script = script.name
        self._labels = signature._label
        # The values before the first hole, packed once per way of calling (Prepacked): when
        # the header puts the fixed values first (finish.lua), that is half of the command.
        # Splicing costs about what packing a few values does, so a shorter head is not.
        first = self._holes[0][0] if self._holes else 0
        self._at = first if first >= MIN_PREPACKED else 0
        self._heads = {
            False: _resp_values(self._template[: self._at]),
            True: _resp_values(self._fcall[: self._at]),
        }

    @property
    def rest(self) -> str:
        """The name of the header's repeated group ("" for none)."""
        return self._rest

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of one item of the repeated group, in the header's order."""
        return self._fields

    def command(self, values: Mapping[str, Any]) -> Command:
        """The EVALSHA (or FCALL) command with these values in the holes (and the repeated
        group)."""
        out = (self._fcall if self._mode.functions else self._template).copy()
        try:
            for at, name in self._holes:
                out[at] = values[name]
            if self._rest:
                items = values[self._rest]
                if self._width:
                    for item in items:
                        out.extend(item)
                else:
                    out.extend(items)
        except KeyError as missing:
            label = self._labels[missing.args[0]]
            raise ScriptCallError(f"{self._script}.lua: no value for {label}") from None
        if not self._at:
            return tuple(out)
        command = Prepacked(out)
        command.head, command.at = self._heads[self._mode.functions], self._at
        return command


def _resp_values(values: list[Any]) -> bytes:
    """These values as RESP, without the count of a command's values."""
    if not values:
        return b""
    resp: bytes = hiredis.pack_command(tuple(values))
    return resp[resp.index(b"\n") + 1 :]


@dataclass(frozen=True)
class Script:
    name: str
    source: str  # the chunk Redis runs
    sha: str
    signature: Signature = field(compare=False, repr=False)
    mode: CallMode = field(default_factory=CallMode, compare=False, repr=False)
    directory: Path = field(default=LUA_DIR, compare=False, repr=False)

    @classmethod
    def from_file(
        cls, name: str, directory: Path = LUA_DIR, mode: CallMode | None = None
    ) -> Script:
        """`<directory>/<name>.lua`, assembled, with the signature its header declares."""
        source = script_source(name, directory)  # refuses a missing file or a bad header
        header = read_header((directory / f"{name}.lua").read_text(), f"{name}.lua")
        sha = hashlib.sha1(source.encode()).hexdigest()
        return cls(name, source, sha, Signature(name, header), mode or CallMode(), directory)

    @property
    def function(self) -> str:
        """Its function's (and library's) name: one per version of the chunk, so releases
        running side by side during a deploy each call their own."""
        return f"wa_{self.name}_{self.sha[:16]}"

    @cached_property
    def library(self) -> str:
        """The function library FUNCTION LOAD takes (shared/storage/lua_source.py)."""
        return function_library(self.name, self.function, self.directory)

    def command(self, tenant_keys: TenantKeys | None = None, /, **values: Any) -> Command:
        """The command calling this script with these values (see the module doc)."""
        keys, argv = self.signature.build(tenant_keys, values)
        if self.mode.functions:
            return ("FCALL", self.function, len(keys), *keys, *argv)
        return ("EVALSHA", self.sha, len(keys), *keys, *argv)

    def bind(self, tenant_keys: TenantKeys | None = None, /, **fixed: Any) -> BoundCall:
        """The calls of one tenant with these values fixed: `bound.command(values)` gives the
        command for the others (see `BoundCall`). A value not fixed must be given then."""
        unknown = set(fixed) - self.signature.names
        if unknown:
            names = ", ".join(sorted(unknown))
            raise ScriptCallError(f"{self.name}.lua has no KEYS or ARGV named {names}")
        return BoundCall(self, tenant_keys, fixed)

    def queue(self, pipe: Any, tenant_keys: TenantKeys | None = None, /, **values: Any) -> None:
        """Add a call to a pipeline; `Scripts.load` must have run on that server.

        Through `execute_command` because redis-py's cluster pipeline blocks its `evalsha`
        method, yet routes a queued EVALSHA by its keys' slot; on one server it is the same
        command `evalsha` would queue.
        """
        pipe.execute_command(*self.command(tenant_keys, **values))

    async def __call__(
        self, redis: Any, tenant_keys: TenantKeys | None = None, /, **values: Any
    ) -> Any:
        """Run the script now with these values; its reply."""
        return await self.run(redis, self.command(tenant_keys, **values))

    async def run(self, redis: Any, command: Command) -> Any:
        """Send a call `command` built; when Redis does not know the script, load it and
        send it again.

        `execute_command` is what redis-py's `evalsha` calls (a cluster client routes it by
        the keys' slot)."""
        try:
            return await redis.execute_command(*command)
        except ResponseError as exc:
            if not is_noscript(exc):
                raise
        if command[0] == "FCALL":
            if not is_cluster(redis) and await load_functions(redis, [self]):
                return await redis.execute_command(*command)
            # A server without functions after one with them (a cluster client given these
            # scripts, a failover to an older Redis): EVALSHA from now on.
            self.mode.functions = False
            command = ("EVALSHA", self.sha, *command[2:])
        await redis.script_load(self.source)
        return await redis.execute_command(*command)


class Scripts:
    """All scripts of the product, by name: `await scripts.ingest(redis, tenant_keys, ...)`."""

    def __init__(self, directory: Path = LUA_DIR, functions: bool = True) -> None:
        """`functions=False`: always SCRIPT LOAD and EVALSHA, even where Redis has functions."""
        self._directory = directory
        self._functions = functions
        self.mode = CallMode()  # every script's: decided by `load`
        self._by_name = {
            name: Script.from_file(name, directory, self.mode) for name in script_names(directory)
        }

    def __getattr__(self, name: str) -> Script:
        try:
            return self._by_name[name]
        except KeyError:
            raise AttributeError(f"no Lua script named {name!r} in {self._directory}") from None

    def all(self) -> list[Script]:
        return list(self._by_name.values())

    async def load(self, redis: Any) -> None:
        """Load every script: as function libraries on one server that has functions (the
        calls become FCALL), else SCRIPT LOAD (on a cluster the client sends it to every
        primary; the calls stay EVALSHA). A client of another kind later (a cluster after one
        server) turns FCALL off for good: a command built for one must run on the other.
        Loaded as scripts either way, so a call built before (EVALSHA) still runs."""
        self._functions = (
            self._functions and not is_cluster(redis) and await load_functions(redis, self.all())
        )
        # As scripts too: a call built before this load (EVALSHA) is repeated as it was.
        for script in self._by_name.values():
            await redis.script_load(script.source)
        self.mode.functions = self._functions


@functools.cache
def shared_scripts() -> Scripts:
    """One `Scripts` per process for callers that are handed none (the ops library's
    functions): the Lua files are read and assembled once, on first use."""
    return Scripts()


def is_noscript(result: object) -> bool:
    """Whether a reply says Redis does not know the script called (nothing ran)."""
    return isinstance(result, NoScriptError) or (
        isinstance(result, ResponseError) and str(result).startswith(FUNCTION_NOT_FOUND)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shared.storage.scripts",
        description="Print the Lua chunks the product sends to Redis.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("show", help="the assembled source of one script").add_argument("name")
    sub.add_parser("list", help="every script's name and SHA")
    args = parser.parse_args(argv)
    scripts = Scripts()
    if args.command == "list":
        for script in scripts.all():
            print(f"{script.name:16} {script.sha}")
        return 0
    try:
        sys.stdout.write(getattr(scripts, args.name).source)
    except AttributeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
