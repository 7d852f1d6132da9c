"""Loads the Lua scripts in `shared/lua/` once and calls them by SHA.

Each script is prepended with `keys.lua_prelude()` (the conversation key helpers),
`dispatch_lag.lua_prelude()` (the lag histogram's buckets) and the functions of
`lua/lib/*.lua` that several scripts share. Calls go through EVALSHA; if Redis answers
NOSCRIPT (it restarted, or a failover lost its script cache) the script is loaded again and
the call repeated, which is safe because a NOSCRIPT call did nothing. Scripts can also be
queued on a pipeline (`queue`), the building block of group commit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from shared import dispatch_lag
from shared.keys import lua_prelude

LUA_DIR = Path(__file__).with_name("lua")
ScriptArg = str | bytes | int | float


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str

    @classmethod
    def from_file(cls, path: Path, library: str = "") -> Script:
        source = lua_prelude() + dispatch_lag.lua_prelude() + library + path.read_text()
        return cls(path.stem, source, hashlib.sha1(source.encode()).hexdigest())

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
        library = "".join(p.read_text() for p in sorted((directory / "lib").glob("*.lua")))
        self._by_name = {
            p.stem: Script.from_file(p, library) for p in sorted(directory.glob("*.lua"))
        }

    def __getattr__(self, name: str) -> Script:
        try:
            return self._by_name[name]
        except KeyError:
            raise AttributeError(f"no Lua script named {name!r} in {LUA_DIR}") from None

    def all(self) -> list[Script]:
        return list(self._by_name.values())

    async def load(self, redis: Any) -> None:
        """SCRIPT LOAD every script (on a cluster the client sends it to every primary)."""
        for script in self._by_name.values():
            await redis.script_load(script.source)


def is_noscript(result: object) -> bool:
    return isinstance(result, NoScriptError)
