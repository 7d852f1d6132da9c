"""Redis CPU of each worker script per turn, at a git revision.

    .venv/bin/python -m scripts.bench.worker_scriptcost HEAD [--n 10000]

Stores N one-message conversations on a private Redis (appendonly off), then runs the worker's
own ConversationStore calls one kind at a time, resetting `INFO commandstats` before each:
claim (200 per call), save_reply, finish (which records the reply's last part and adds the
turn's figures; a revision before that: record_part, then finish). Prints the script calls'
microseconds per turn (EVALSHA and FCALL: what Redis spent inside the scripts) and the
client's wall time per turn (group-committed).
The revision's code runs in a child process (scripts/bench/revision.py).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from scripts.bench import revision
from scripts.bench.commandstats import script_stats


async def measure(n: int) -> None:
    # Only the child measures (on the exported revision): the parent needs none of these.
    import orjson

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
    from shared.settings import Settings
    from shared.storage.group_commit import GroupCommitter

    with RedisServer() as server:
        async with Bench(server.url) as b:
            r = b.redis
            await b.ingest_bulk([make_event(person_id(i), 0) for i in range(n)])
            await b.intake(1, 2)
            await asyncio.sleep(0.05)
            settings = Settings().with_overrides(
                redis_url=server.url, key_prefix=PREFIX, debounce_window_s=0.001, max_wait_s=0.002
            )
            conv = store.ConversationStore(settings, b.scripts, GroupCommitter(r, b.scripts))
            batches: list[Any] = []

            async def phase(name: str, run: Callable[[], Awaitable[Any]]) -> None:
                await r.config_resetstat()
                started = time.perf_counter()
                await run()
                wall = time.perf_counter() - started
                stats = script_stats(await r.info("commandstats"))
                print(
                    f"{name:12s} script calls {stats.get('calls', 0):6d}  "
                    f"Redis {stats.get('usec', 0) / n:6.1f} µs/turn  "
                    f"client wall {wall / n * 1e6:6.1f} µs/turn"
                )

            async def claim() -> None:
                while len(batches) < n:
                    got = await conv.claim(TENANT, 200, f"t{len(batches)}")
                    batches.extend(got.batches)

            await phase("claim", claim)
            if "last_part" in inspect.signature(conv.finish_done).parameters:
                # The turn as it is now: the finish records the reply's last part and adds
                # the turn's figures (one AI call, one send), no record_part of its own.
                async def save_now() -> None:
                    await asyncio.gather(*(conv.save_reply(x, "ok") for x in batches))

                async def finish_now() -> None:
                    await finish_one_part_replies(conv, batches)

                await phase("save_reply", save_now)
                await phase("finish", finish_now)
                return
            if hasattr(conv, "save_reply"):

                async def save() -> None:
                    await asyncio.gather(*(conv.save_reply(x, "ok") for x in batches))

                async def record() -> None:
                    await asyncio.gather(
                        *(conv.record_part(x, 0, f"wamid.X{i}") for i, x in enumerate(batches))
                    )

                async def finish() -> None:
                    await asyncio.gather(
                        *(
                            conv.finish_done(
                                x, orjson.dumps({"user": x.user_text, "assistant": "ok"})
                            )
                            for x in batches
                        )
                    )

                await phase("save_reply", save)
                await phase("record_part", record)
            else:

                async def finish() -> None:
                    await asyncio.gather(*(conv.finish_done(x) for x in batches))

            await phase("finish", finish)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("rev", nargs="?", default="HEAD")
    p.add_argument("--n", type=int, default=10_000)
    args = p.parse_args()
    if revision.exported():
        asyncio.run(measure(args.n))
        return 0
    code, description = revision.export(args.rev)
    try:
        return revision.run_on(code, description, "scripts.bench.worker_scriptcost", sys.argv[1:])
    finally:
        shutil.rmtree(code, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
