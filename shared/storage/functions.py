"""The scripts as Redis function libraries: loading them, and forgetting old releases' ones.

Each script is a library of its own holding one function, both named for the chunk's version
(`Script.function`: `wa_<script>_<16 hex digits of its SHA-1>`), so the processes of two
releases running side by side during a deploy each call their own code. Loading a library
Redis holds already changes nothing (the same name is the same code).

Unlike the script cache, functions are kept with the data set (RDB, AOF) and copied to
replicas, so every release would add its libraries for good: a worker starting notes its
release's libraries in the `FUNCTIONS` hash (library -> ms of that start) and removes those no
worker started with for `FUNCTIONS_KEPT_S` (`note_and_prune`). A process still running such a
release meets "Function not found" at its next call, loads its own again
(shared/storage/scripts.py `is_noscript`) and goes on.

A server that refuses FUNCTION LOAD (Redis before 7, an ACL or a provider that forbids it)
is answered with `False`: the caller loads the scripts with SCRIPT LOAD and calls EVALSHA.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from redis.exceptions import ResponseError

from shared.keys import FUNCTIONS

log = logging.getLogger(__name__)

# How Redis answers FCALL of a function it does not hold (redis-py drops the "ERR ").
FUNCTION_NOT_FOUND = "Function not found"
# A library no process loaded for a week is removed (a running process loads it again).
FUNCTIONS_KEPT_S = 7 * 24 * 3600


class Loadable(Protocol):
    @property
    def function(self) -> str: ...

    @property
    def library(self) -> str: ...


async def load_functions(redis: Any, scripts: Sequence[Loadable]) -> bool:
    """FUNCTION LOAD these scripts' libraries (one pipeline); False when the server refuses
    functions."""
    pipe = redis.pipeline(transaction=False)
    for script in scripts:
        pipe.execute_command("FUNCTION", "LOAD", script.library)
    for script, result in zip(scripts, await pipe.execute(raise_on_error=False), strict=True):
        if isinstance(result, ResponseError) and "already exists" not in str(result):
            log.info("Redis refused %s, calling by EVALSHA: %s", script.function, result)
            return False
    return True


async def note_and_prune(redis: Any, scripts: Sequence[Loadable]) -> None:
    """A worker started with these scripts' libraries: note them, and delete the libraries
    no worker started with for `FUNCTIONS_KEPT_S`."""
    now_ms = int(time.time() * 1000)
    await redis.hset(FUNCTIONS, mapping={script.function: now_ms for script in scripts})
    await _forget_unused(redis, now_ms, {script.function for script in scripts})


async def _forget_unused(redis: Any, now_ms: int, ours: set[str]) -> None:
    """Delete the libraries of `FUNCTIONS` last loaded over `FUNCTIONS_KEPT_S` ago."""
    old = [
        name.decode() if isinstance(name, bytes) else str(name)
        for name, at in (await redis.hgetall(FUNCTIONS)).items()
        if int(at) < now_ms - FUNCTIONS_KEPT_S * 1000
    ]
    old = [name for name in old if name not in ours]
    if not old:
        return
    pipe = redis.pipeline(transaction=False)
    for name in old:
        pipe.execute_command("FUNCTION", "DELETE", name)  # gone already: an error, ignored
    pipe.hdel(FUNCTIONS, *old)
    await pipe.execute(raise_on_error=False)
    log.info("removed %d function libraries no process loaded for a week", len(old))
