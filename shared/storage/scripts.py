"""Loads the Lua scripts in `shared/lua/` once and calls them by SHA.

Each script is sent as one chunk: the helpers its header declares (`-- uses: lib/...`), then
the script, with the constants Python also needs written in (shared/storage/lua_source.py). Calls go
through EVALSHA; if Redis answers NOSCRIPT (it restarted, or a failover lost its script
cache) the script is loaded again and the call repeated, which is safe because a NOSCRIPT call
did nothing. Scripts can also be queued on a pipeline (`queue`), the building block of group
commit. shared/storage/script_calls.py builds each script's KEYS and ARGV.

To see or run the chunk Redis gets for a script (e.g. with `redis-cli --eval`):

    python -m shared.storage.scripts show claim > /tmp/claim.lua
    redis-cli --eval /tmp/claim.lua <keys...> , <args...>
    python -m shared.storage.scripts list     # every script and its SHA
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from shared.storage.lua_source import LUA_DIR, script_names, script_source

__all__ = ["LUA_DIR", "Script", "ScriptArg", "Scripts", "is_noscript"]

ScriptArg = str | bytes | int | float


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str

    @classmethod
    def from_source(cls, name: str, source: str) -> Script:
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())

    async def __call__(self, redis: Any, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await redis.script_load(self.source)
            return await redis.evalsha(self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: Sequence[str], args: Sequence[ScriptArg]) -> None:
        """Add a call to a pipeline; `Scripts.load` must have run on that server.

        Through `execute_command` because redis-py's cluster pipeline blocks its `evalsha`
        method, yet routes a queued EVALSHA by its keys' slot; on one server it is the same
        command `evalsha` would queue.
        """
        pipe.execute_command(*self.command(keys, args))

    def command(self, keys: Sequence[str], args: Sequence[ScriptArg]) -> tuple[ScriptArg, ...]:
        """The EVALSHA command calling this script, as a tuple of its name and arguments."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


class Scripts:
    """All scripts of the product, by name: `scripts.ingest(redis, keys, args)`."""

    def __init__(self, directory: Path = LUA_DIR) -> None:
        self._directory = directory
        self._by_name = {
            name: Script.from_source(name, script_source(name, directory))
            for name in script_names(directory)
        }

    def __getattr__(self, name: str) -> Script:
        try:
            return self._by_name[name]
        except KeyError:
            raise AttributeError(f"no Lua script named {name!r} in {self._directory}") from None

    def all(self) -> list[Script]:
        return list(self._by_name.values())

    async def load(self, redis: Any) -> None:
        """SCRIPT LOAD every script (on a cluster the client sends it to every primary)."""
        for script in self._by_name.values():
            await redis.script_load(script.source)


def is_noscript(result: object) -> bool:
    return isinstance(result, NoScriptError)


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
