"""The scripts as Redis function libraries (shared/storage/functions.py) on a real Redis: every
script loads as one and is called by FCALL; a function Redis lost is loaded again and the
call repeated; a library keeps nothing of one call for the next; a server without functions
gets EVALSHA; old releases' libraries are removed once no worker started with them for a
week."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from redis.asyncio import Redis

from shared.keys import FUNCTIONS, Keys
from shared.storage.functions import FUNCTIONS_KEPT_S, note_and_prune
from shared.storage.group_commit import GroupCommitter
from shared.storage.lua_source import LUA_DIR
from shared.storage.scripts import Script, Scripts
from tests.worker.support import TENANT, message_event

PERSON = "5491155550001"


PREFIX = "fn"


async def libraries(redis: Redis) -> set[str]:
    names = set()
    for entry in await redis.function_list():  # [b"library_name", name, b"engine", ...]
        fields = dict(zip(entry[::2], entry[1::2], strict=True))
        names.add(fields[b"library_name"].decode())
    return names


async def test_every_script_loads_as_a_function_and_is_called_by_fcall(redis: Redis) -> None:
    scripts = Scripts()
    await scripts.load(redis)
    assert scripts.mode.functions
    assert {s.function for s in scripts.all()} <= await libraries(redis)
    k = Keys("t").tenant(TENANT)
    command = scripts.claim.command(k, max_claim=0, lease_ms=1, token_prefix="x", **_claim(k))
    assert command[:2] == ("FCALL", scripts.claim.function)
    # Loading again (a second process of the same release) is fine: same name, same code.
    await Scripts().load(redis)


async def test_a_function_redis_lost_is_loaded_again_and_the_call_repeated(redis: Redis) -> None:
    """FUNCTION FLUSH stands for a restart without persistence or an operator's flush: the
    next calls, direct or group-committed, load their library again and run once."""
    scripts = Scripts()
    await scripts.load(redis)
    k = Keys(PREFIX).tenant(TENANT)
    await redis.execute_command("FUNCTION", "FLUSH")
    stored = await scripts.ingest(
        redis, k, seen=[k.seen("whatsapp:wamid.1")], dedupe_ttl_s=60, events=[_event("wamid.1")]
    )
    assert [int(x) for x in stored] == [1]
    await redis.execute_command("FUNCTION", "FLUSH")
    committer = GroupCommitter(redis, scripts)
    again = scripts.ingest.command(
        k, seen=[k.seen("whatsapp:wamid.1")], dedupe_ttl_s=60, events=[_event("wamid.1")]
    )
    assert again[0] == "FCALL"
    assert [int(x) for x in await committer.submit(again)] == [0], "a duplicate, not stored twice"
    assert await redis.llen(k.inbox) == 1


async def test_without_functions_the_scripts_are_called_by_evalsha(redis: Redis) -> None:
    scripts = Scripts(functions=False)
    await scripts.load(redis)
    assert not scripts.mode.functions
    k = Keys(PREFIX).tenant(TENANT)
    command = scripts.ingest.command(
        k, seen=[k.seen("whatsapp:wamid.2")], dedupe_ttl_s=60, events=[_event("wamid.2")]
    )
    assert command[:2] == ("EVALSHA", scripts.ingest.sha)
    assert [int(x) for x in await scripts.ingest.run(redis, command)] == [1]


PROBE = """-- book_probe: the newest generation of a book, as a call of the library sees it.
--
-- ARGV[1] book         the book's prefix
-- Returns the newest generation's id, or "".
--
-- uses: lib/book.lua (book_newest)
local gen = book_newest(ARGV[1])
return gen and gen.id or ''
"""


async def test_a_library_keeps_nothing_of_one_call_for_the_next(
    redis: Redis, tmp_path: Path
) -> None:
    """lib/book.lua reads a book's generations once per call: a function library, which lives
    on between calls, must forget them when the next call begins, or a generation opened by
    another script meanwhile would stay unseen (a status would miss its outbound record)."""
    shutil.copytree(LUA_DIR / "lib", tmp_path / "lib")
    (tmp_path / "book_probe.lua").write_text(PROBE)
    probe = Script.from_file("book_probe", tmp_path)
    await redis.execute_command("FUNCTION", "LOAD", "REPLACE", probe.library)
    book = f"{PREFIX}:book:"
    await redis.hset(f"{book}gens", mapping={"100": "100:1:200", "newest": "100:1:200"})
    assert await redis.fcall(probe.function, 0, book) == b"100"
    await redis.hset(f"{book}gens", mapping={"150": "150:1:250", "newest": "150:1:250"})
    assert await redis.fcall(probe.function, 0, book) == b"150"


async def test_libraries_no_worker_started_with_for_a_week_are_removed(redis: Redis) -> None:
    scripts = Scripts()
    await scripts.load(redis)
    old = "wa_old_0123456789abcdef"
    await redis.execute_command(
        "FUNCTION", "LOAD", f"#!lua name={old}\nredis.register_function('{old}', function() end)"
    )
    now_ms = int(time.time() * 1000)
    await redis.hset(FUNCTIONS, old, now_ms - FUNCTIONS_KEPT_S * 1000 - 1)
    recent = "wa_recent_0123456789abcdef"
    await redis.execute_command(
        "FUNCTION",
        "LOAD",
        f"#!lua name={recent}\nredis.register_function('{recent}', function() end)",
    )
    await redis.hset(FUNCTIONS, recent, now_ms - 3600_000)  # another release, an hour ago
    await note_and_prune(redis, scripts.all())
    loaded = await libraries(redis)
    assert old not in loaded and recent in loaded
    noted = await redis.hgetall(FUNCTIONS)
    assert old.encode() not in noted and recent.encode() in noted
    for script in scripts.all():
        assert int(noted[script.function.encode()]) >= now_ms
    # A process still running the removed release loads its library again at its next call.
    await redis.execute_command("FUNCTION", "DELETE", recent)


def _event(message_id: str) -> bytes:
    from shared import events

    return events.encode(message_event(TENANT, PERSON, message_id, "hola"))


def _claim(k: object) -> dict[str, object]:
    """The claim's other values, as the worker gives them (only the command is built)."""
    names = Scripts().claim.signature.names - {"max_claim", "lease_ms", "token_prefix"}
    return {n: 1 for n in names if not hasattr(k, n)}
