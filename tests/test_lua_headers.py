"""Each Lua script's header against what the code does: the KEYS and ARGV a call builds from
named values (count, names, order: shared/storage/scripts.py), the helpers the script calls
(each one declared, each declared one there), and the loader's refusals
(shared/storage/lua_source.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import hiredis
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared.keys import TenantKeys
from shared.storage import lua_source
from shared.storage.lua_source import LUA_DIR, Header, LuaSourceError, Slot, read_header
from shared.storage.raw_pipeline import packed
from shared.storage.scripts import TENANT_KEY_NAMES, Script, ScriptCallError, Scripts, main

SCRIPTS = lua_source.script_names()
LIBS = sorted(str(p.relative_to(LUA_DIR)) for p in (LUA_DIR / "lib").glob("*.lua"))


def header_of(path: Path) -> Header:
    return read_header(path.read_text(), path.name)


class _Names(TenantKeys):
    """Stands in for TenantKeys: every key or prefix is its own property name."""

    def __getattribute__(self, name: str) -> Any:
        return name if name in TENANT_KEY_NAMES else super().__getattribute__(name)


def _sample(slot: Slot) -> list[Any]:
    """Two items of a repeated entry, each naming its place: `seen#1`, (`turns#1.person`, ...)."""
    if slot.fields:
        return [tuple(f"{slot.name}#{i}.{f}" for f in slot.fields) for i in (1, 2)]
    return [f"{slot.name}#{i}" for i in (1, 2)]


def _expected(slots: tuple[Slot, ...]) -> list[str]:
    names: list[str] = []
    for slot in slots:
        if slot.repeats:
            names += [v for item in _sample(slot) for v in (item if slot.fields else (item,))]
        else:
            names.append(slot.name)
    return names


def _values(header: Header) -> dict[str, Any]:
    """Every name a call must give, set to its own name (a sample for a repeated entry)."""
    slots = (*header.keys, *header.argv)
    return {
        s.name: _sample(s) if s.repeats else s.name
        for s in slots
        if s.repeats or s.name not in TENANT_KEY_NAMES
    }


@pytest.mark.parametrize("name", SCRIPTS)
def test_header_is_complete(name: str) -> None:
    header = header_of(LUA_DIR / f"{name}.lua")
    assert header.keys, f"{name}.lua: no KEYS in its header (every key comes in through KEYS)"
    assert header.argv, f"{name}.lua: no ARGV in its header"
    assert header.returns, f"{name}.lua: the header does not say what it returns (-- Returns)"
    assert header.uses is not None, f"{name}.lua: no `-- uses:` line (`-- uses: none` if so)"


@pytest.mark.parametrize("name", SCRIPTS)
def test_call_matches_header(name: str) -> None:
    """Called with every value set to its own name, a script's command holds the header's
    KEYS and ARGV names, in order: same count, same names, same places."""
    header = header_of(LUA_DIR / f"{name}.lua")
    script = getattr(Scripts(), name)
    command = script.command(_Names("t"), **_values(header))
    keys = _expected(header.keys)
    assert command[:3] == ("EVALSHA", script.sha, len(keys))
    assert list(command[3 : 3 + len(keys)]) == keys, f"{name}: KEYS differ from the header"
    assert list(command[3 + len(keys) :]) == _expected(header.argv), f"{name}: ARGV differ"


def test_tenant_keys_are_taken_from_the_tenant() -> None:
    k = TenantKeys("wa:{t}")
    command = Scripts().resume_human.command(k, person="p")
    assert command[2:] == (3, k.due, k.running, k.stats, k.conversation_prefix, "p")
    # A value given wins over the tenant's (finish.lua's review_notify "" when none is wanted).
    command = Scripts().resume_human.command(k, person="p", stats="elsewhere")
    assert command[5] == "elsewhere"


def test_missing_or_unknown_name_raises_naming_it() -> None:
    k = TenantKeys("wa:{t}")
    scripts = Scripts()
    with pytest.raises(ScriptCallError, match=r"save_reply\.lua: no value for ARGV\[2\.\.\] turns"):
        scripts.save_reply.command(k)
    with pytest.raises(ScriptCallError, match=r"save_reply\.lua has no KEYS or ARGV named rpely"):
        scripts.save_reply.command(k, turns=[("p", "t", "r")], rpely="r")
    with pytest.raises(ScriptCallError, match=r"ingest\.lua: no value for KEYS\[2\.\.\] seen"):
        scripts.ingest.command(k, dedupe_ttl_s=60, events=[])
    with pytest.raises(ScriptCallError, match=r"KEYS\[1\] stats"):  # no tenant keys to take from
        scripts.save_reply.command(turns=[("p", "t", "r")])
    with pytest.raises(ScriptCallError, match=r"renew\.lua: each turns item has 2 values, not 1"):
        scripts.renew.command(k, lease_ms=1, turns=[("p",)])


def test_a_bound_call_builds_the_same_command_as_a_named_call() -> None:
    """`bind` (the worker's finish and save_reply) fixes a tenant's values once; each call
    then gives the same command `command` would, repeated group included."""
    k = TenantKeys("wa:{t}")
    finish = Scripts().finish
    fixed = {
        "window_ms": 2000,
        "max_wait_ms": 8000,
        "memory_turns": 10,
        "memory_ttl_ms": 1000,
        "outbound_ttl_s": 60,
        "review_notify": "",
    }
    turn = ("p", "t", "done", "", "", b"{}", 0, "wamid.1", "", 1, "ai_le:250 1 ai_sum_ms 120")
    other = ("q", "u", "retry", 500, "boom", b"", "", "", "", 0, "")
    bound = finish.bind(k, **fixed)
    for turns in ([turn], [turn, other], []):
        assert bound.command({"turns": turns}) == finish.command(k, **fixed, turns=turns)
    # Sent with its tenant's head packed once: the same bytes hiredis makes of the whole.
    for functions in (False, True):
        finish.mode.functions = functions
        for turns in ([turn], [turn, other]):
            whole = finish.command(k, **fixed, turns=turns)
            assert packed(bound.command({"turns": turns})) == hiredis.pack_command(whole)
    finish.mode.functions = False
    with pytest.raises(ScriptCallError, match=r"finish\.lua: no value for ARGV\[9\.\.\] turns"):
        bound.command({})
    with pytest.raises(ScriptCallError, match=r"finish\.lua has no KEYS or ARGV named windw_ms"):
        finish.bind(k, windw_ms=1)
    with pytest.raises(ScriptCallError, match=r"repeated KEYS cannot be bound"):
        Scripts().ingest.bind(k)


def test_order_comes_from_the_header(tmp_path: Path) -> None:
    """The same named values, two headers: each call follows its own header's order."""
    body = "-- Returns 1.\n-- uses: none\nreturn 1\n"
    directory = _lua_dir(
        tmp_path,
        {
            "ab.lua": "-- KEYS[1] due\n-- KEYS[2] stats\n-- ARGV[1] a\n-- ARGV[2] b\n" + body,
            "ba.lua": "-- KEYS[1] stats\n-- KEYS[2] due\n-- ARGV[1] b\n-- ARGV[2] a\n" + body,
        },
    )
    k = TenantKeys("wa:{t}")
    ab, ba = (Script.from_file(name, directory) for name in ("ab", "ba"))
    assert ab.command(k, a=1, b=2)[2:] == (2, k.due, k.stats, 1, 2)
    assert ba.command(k, a=1, b=2)[2:] == (2, k.stats, k.due, 2, 1)


def _exports() -> dict[str, str]:
    """Every name a helper file defines -> that file; a name defined twice is ambiguous."""
    owner: dict[str, str] = {}
    for lib in LIBS:
        for name in lua_source.exported_names((LUA_DIR / lib).read_text()):
            assert name not in owner, f"{name} defined in both {owner[name]} and {lib}"
            owner[name] = lib
    return owner


def _code_identifiers(text: str) -> set[str]:
    """Identifiers of the code, leaving out comments and string literals."""
    code = re.sub(r"--.*", "", text)
    code = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", code)
    return set(re.findall(r"\b[A-Za-z_]\w*\b", code))


@pytest.mark.parametrize("path", [f"{n}.lua" for n in SCRIPTS] + LIBS)
def test_helpers_used_are_declared_and_declared_ones_used(path: str) -> None:
    text = (LUA_DIR / path).read_text()
    owner = _exports()
    own = lua_source.exported_names(text) if path.startswith("lib/") else set()
    used = {n: owner[n] for n in _code_identifiers(text) if n in owner and n not in own}
    declared = {n: use.lib for use in read_header(text, path).uses or () for n in use.names}
    undeclared = {n: lib for n, lib in used.items() if declared.get(n) != lib}
    assert not undeclared, f"{path} uses these without `-- uses: <lib> (<name>)`: {undeclared}"
    unused = sorted(set(declared) - set(used))
    assert not unused, f"{path} declares {unused} but does not use them"


def test_helpers_declared_exist() -> None:
    for lib in LIBS:
        for use in read_header((LUA_DIR / lib).read_text(), lib).uses or ():
            assert (LUA_DIR / use.lib).is_file(), f"{lib} uses {use.lib}, which does not exist"
    for name in SCRIPTS:  # the loader checks files and names, and refuses otherwise
        lua_source.script_source(name)


def test_every_constant_is_used() -> None:
    text = "".join(p.read_text() for p in LUA_DIR.rglob("*.lua"))
    unused = [n for n in lua_source.CONSTANTS if f"{{{{{n}}}}}" not in text]
    assert not unused, f"constants no Lua file uses: {unused}"


def test_chunk_holds_only_declared_helpers_each_once() -> None:
    scripts = Scripts()
    assert "now_ms" not in scripts.deadletter.source
    assert "record_dispatch_lag" not in scripts.finish.source
    claim = scripts.claim.source
    for lib in ("lib/keys.lua", "lib/clock.lua", "lib/outbound.lua", "lib/dispatch_lag.lua"):
        assert claim.count(f"-- {lib}\n") == 1
    assert claim.count("local function now_ms()") == 1
    assert "'{{" not in claim and "'pending'" in claim


def test_show_prints_the_chunk(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "claim"]) == 0
    assert capsys.readouterr().out == Scripts().claim.source
    assert main(["show", "nope"]) == 2


# --- the loader's refusals, on Lua files of the test's own -------------------------------


def _lua_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


SCRIPT_HEADER = "-- KEYS[1] stats\n-- Returns it.\n"


def test_helpers_come_dependencies_first_each_once(tmp_path: Path) -> None:
    directory = _lua_dir(
        tmp_path,
        {
            "lib/a.lua": "-- uses: lib/b.lua (B)\nlocal function a() return B end\n",
            "lib/b.lua": "local B = 1\n",
            "s.lua": SCRIPT_HEADER + "-- uses: lib/a.lua (a), lib/b.lua (B)\nreturn a() + B\n",
        },
    )
    source = lua_source.script_source("s", directory)
    order = [line for line in source.splitlines() if line.startswith("-- lib/")]
    assert order == ["-- lib/b.lua", "-- lib/a.lua"]


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({"s.lua": "-- uses: lib/x.lua (f)\nreturn f()\n"}, "does not exist"),
        (
            {"lib/x.lua": "local function f() end\n", "s.lua": "-- uses: lib/x.lua (g)\n"},
            "not defined there",
        ),
        ({"s.lua": "-- uses: none\nreturn '{{NO_SUCH}}'\n"}, "unknown placeholder"),
        ({"s.lua": "-- uses: none\nreturn '{{lowercase}}'\n"}, "not substituted"),
        ({"s.lua": "-- KEYS[2] due\nreturn 1\n"}, "numbered 1, 2"),
        ({"s.lua": "-- uses: lib/x.lua (f), clock.lua (now_ms)\n"}, "cannot read"),
        (
            {
                "lib/a.lua": "-- uses: lib/b.lua (b)\nlocal function a() end\n",
                "lib/b.lua": "-- uses: lib/a.lua (a)\nlocal function b() end\n",
                "s.lua": "-- uses: lib/a.lua (a)\n",
            },
            "circle",
        ),
    ],
)
def test_loader_refuses(tmp_path: Path, files: dict[str, str], error: str) -> None:
    with pytest.raises(LuaSourceError, match=error):
        lua_source.script_source("s", _lua_dir(tmp_path, files))


async def test_undeclared_helper_fails_on_redis(redis_server: Any, tmp_path: Path) -> None:
    """A script calling a helper it does not declare gets no copy of it: Redis refuses."""
    directory = _lua_dir(tmp_path, {"s.lua": SCRIPT_HEADER + "-- uses: none\nreturn now_ms()\n"})
    script = Script.from_file("s", directory)
    redis = Redis.from_url(redis_server.url)
    try:
        with pytest.raises(ResponseError, match="now_ms"):
            await script(redis, stats="t:stats")
    finally:
        await redis.aclose()
