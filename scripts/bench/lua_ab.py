"""Redis CPU of the worker's intake and finish with two revisions' Lua scripts, side by side.

    .venv/bin/python -m scripts.bench.lua_ab main [--n 20000]

On a loaded machine two benchmark runs minutes apart differ by more than a few µs; this puts
both revisions' scripts in one private Redis (appendonly off) and alternates them call by call,
so what the machine does meanwhile falls on both alike. The calls are this checkout's
ConversationStore's (the scripts' headers must take the same names: a revision that only adds
keys qualifies). Two figures, Redis microseconds (`INFO commandstats`, EVALSHA):

- intake: N one-message conversations taken in, 1 000 a claim call, the calls alternating
  (new people: each message a person the index has not listed; then known people: a second
  message each);
- claim: N due conversations claimed, 200 a call, the calls alternating;
- finish: the N batches finished in chunks of 250 alternating, as a turn after a one-part
  reply (the exchange remembered, the part recorded, the figures).

Written for issue 23's conversations index (one ZADD per claim call and per finish).
`--steady-windows` seeds the book of 24-hour windows (issue 24) as a steady traffic leaves it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from scripts.bench.commandstats import script_stats
from scripts.bench.revision import ROOT

CHUNK = 250
CLAIM = 200  # batches a claim call asks for, as a worker with 200 free slots


def export_lua(rev: str) -> Path:
    """`shared/lua` of `rev` in a new temporary directory (the caller removes it)."""
    target = Path(tempfile.mkdtemp(prefix="lua-ab-"))
    archive = subprocess.run(
        ["git", "archive", rev, "--", "shared/lua"], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "shared" / "lua"


async def seed_windows(r: Any, k: Any, n: int) -> None:
    """The book of 24-hour windows (shared/lua/lib/lastin.lua) as a steady traffic leaves it
    in the middle of a day: begun long ago (no key of the release before can be left), its
    newest generation 12 h old, with shards for `n` people at its fill (64). Its shards are not
    written: lookups ask them as they would."""
    gens = getattr(k, "lastin_gens", None)
    if gens is None:
        return
    now = int((await r.time())[0])
    shards = 1
    while shards * 64 < n:
        shards *= 2
    start = now - 43200
    value = f"{start}:{shards}:{start + 86400 + 90000}"
    await r.hset(gens, mapping={str(start): value, "newest": value, "since": now - 30 * 86400})


async def measure(other: str, lua: Path, n: int, steady_windows: bool = False) -> None:
    import worker.conversation_store as store
    from scripts.bench.worker_load import (
        PREFIX,
        TENANT,
        Bench,
        finish_one_part_replies,
        make_event,
        person_id,
    )
    from scripts.dev.redis_server import RedisServer
    from shared.keys import Keys
    from shared.settings import Settings
    from shared.storage.group_commit import GroupCommitter
    from shared.storage.scripts import LUA_DIR, Scripts

    with RedisServer() as server:
        async with Bench(server.url) as b:
            r = b.redis
            stores: dict[str, Any] = {}
            for label, directory in (("this checkout", LUA_DIR), (other, lua)):
                scripts = Scripts(directory)
                await scripts.load(r)
                settings = Settings().with_overrides(
                    redis_url=server.url,
                    key_prefix=PREFIX,
                    debounce_window_s=0.001,
                    max_wait_s=0.002,
                )
                stores[label] = store.ConversationStore(
                    settings, scripts, GroupCommitter(r, scripts)
                )
            labels = list(stores)
            if steady_windows:
                await seed_windows(r, Keys(PREFIX).tenant(TENANT), n)

            async def usec() -> float:
                return float(script_stats(await r.info("commandstats"))["usec"])

            for round_, what in ((0, "new people"), (1, "known people")):
                await b.ingest_bulk([make_event(person_id(i), round_) for i in range(n)])
                spent = dict.fromkeys(labels, 0.0)
                call = 0
                while True:
                    label = labels[call % 2]
                    await r.config_resetstat()
                    got = await stores[label].claim(TENANT, 0, "intake")
                    spent[label] += await usec()
                    call += 1
                    if not got.more:
                        break
                for label in labels:
                    print(f"intake, {what:12s} {label:>14s}: {spent[label] / (n / 2):6.2f} µs/msg")

            await asyncio.sleep(0.05)
            batches: list[Any] = []
            spent = dict.fromkeys(labels, 0.0)
            claimed = dict.fromkeys(labels, 0)
            while len(batches) < n:
                label = labels[(len(batches) // CLAIM) % 2]
                await r.config_resetstat()
                got = await stores[label].claim(TENANT, CLAIM, f"t{len(batches)}")
                spent[label] += await usec()
                claimed[label] += len(got.batches)
                if not got.batches:
                    break
                batches.extend(got.batches)
            for label in labels:
                per = spent[label] / max(claimed[label], 1)
                print(f"claim, {CLAIM} a call         {label:>14s}: {per:6.2f} µs/batch")
            spent = dict.fromkeys(labels, 0.0)
            done = dict.fromkeys(labels, 0)
            for i in range(0, len(batches), CHUNK):
                label = labels[(i // CHUNK) % 2]
                chunk = batches[i : i + CHUNK]
                await r.config_resetstat()
                await finish_one_part_replies(stores[label], chunk, first=i)
                spent[label] += await usec()
                done[label] += len(chunk)
            for label in labels:
                print(
                    f"finish (done)             {label:>14s}: {spent[label] / done[label]:6.2f} µs"
                )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("rev", help="the other revision (its shared/lua)")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument(
        "--steady-windows",
        action="store_true",
        help="give the book of 24-hour windows a steady state's generations first (else it "
        "begins with the run: a day after an upgrade, the old keys still read)",
    )
    args = p.parse_args()
    lua = export_lua(args.rev)
    try:
        asyncio.run(measure(args.rev, lua, args.n, args.steady_windows))
    finally:
        shutil.rmtree(lua.parents[1], ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
