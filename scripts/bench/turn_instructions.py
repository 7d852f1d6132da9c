"""Instructions per turn, worker and Redis: figures other load on the machine cannot move.

    .venv/bin/python -m scripts.bench.turn_instructions [--n 2000] [--side both|worker|redis]
    .venv/bin/python -m scripts.bench.turn_instructions --side scripts  # Redis, per script call
    .venv/bin/python -m scripts.bench.turn_instructions --side intake   # Redis, per message
    .venv/bin/python -m scripts.bench.turn_instructions --at REV      # another revision

The throughput scenario of `scripts/bench_worker` (N one-message conversations due at once, the
probe brain and sender, `WORKER_CONCURRENCY=200`, one `python -m worker`), with one side run under
`valgrind --tool=callgrind`:

- **worker**: the worker process traced; its counters are zeroed once it is up and idle, and
  dumped when the N-th turn is finished (`callgrind_control`), so start-up and shutdown are
  not counted. What remains is the worker's Python per turn: the claim's parsing, the turn, the
  group committer, the Redis client, the event loop.
- **redis**: `redis-server` traced, zeroed after the conversations were stored and taken in,
  dumped at the N-th turn: the claim, the reply's store and the finish per turn, Redis's
  network and event loop included.
- **scripts**: the claim, the reply's store and the finish called one kind at a time by the
  worker's own ConversationStore on a traced `redis-server`: instructions per call of each,
  and how many commands each call ran (`INFO commandstats`): a command called from Lua costs
  Redis ~10k instructions with its arguments and the reply parsed back into Lua.

Why: on this shared 2-core machine CPU time per turn moves by a third from one minute to the
next (docs/benchmarks/worker.md); instruction counts repeat to about a percent. Use it to decide
whether a change saves work, `scripts/bench_worker` for turns per second. Under valgrind the
traced side is ~50x slower, so rounds are larger than in a real run (per-round costs weigh less
here). Needs valgrind (apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench import revision

CONCURRENCY = 200


def _collected(dump: Path) -> int:
    """Instructions in one callgrind dump (its `summary:` line)."""
    found = re.search(r"^summary:\s+(\d+)", dump.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"no summary in {dump}")
    return int(found.group(1))


def _control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def _callgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p"]


def _newest(out: Path, pid: int) -> Path:
    """The last dump `callgrind_control -d` made of process `pid`."""
    return max(out.glob(f"cg.{pid}.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))


def _traced_redis(out: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server under callgrind (appendonly off, no saves), and its URL."""
    from scripts.dev.redis_server import find_server_binary, free_port

    port = free_port()
    proc = subprocess.Popen(
        [
            *_callgrind(out),
            *(find_server_binary(), "--port", str(port), "--save", "", "--appendonly", "no"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, f"redis://127.0.0.1:{port}/0"


async def _shutdown(url: str) -> None:
    from redis.asyncio import Redis

    r = Redis.from_url(url)
    try:
        await r.shutdown(nosave=True)
    except Exception:  # it answers by closing the connection
        pass
    finally:
        await r.aclose()


async def _run(side: str, n: int, out: Path) -> int:
    from scripts.bench.worker_load import Bench, Workers, make_event, person_id
    from scripts.dev.redis_server import RedisServer

    lead_s = 1.0
    cg = _callgrind(out)
    server: RedisServer | None = None
    traced_redis: subprocess.Popen[bytes] | None = None
    if side == "redis":
        traced_redis, url = _traced_redis(out)
        await _wait_ping(url)
    else:
        server = RedisServer()
        server.__enter__()
        url = server.url
    env = {
        "WORKER_CONCURRENCY": str(CONCURRENCY),
        "DEBOUNCE_WINDOW_S": str(lead_s),
        "MAX_WAIT_S": str(lead_s * 2),
        # A traced side is ~50x slower: no lease may lapse meanwhile, and no claim's answer
        # may be taken for lost (its batches would be handed back and claimed again, counting
        # that work twice: worker/fleet/unanswered_claims.py).
        "LEASE_S": "600",
        "REDIS_TIMEOUT_S": "120",
    }
    workers = Workers(url, env=env)
    if side == "worker":
        workers.wrapper = cg
    try:
        async with Bench(url) as b:
            workers.start()
            await b.wait_listening(1, timeout_s=120)
            await b.ingest_bulk([make_event(person_id(i), 0) for i in range(n)])
            await b.intake(int(lead_s * 1000), int(lead_s * 2000))
            traced = traced_redis.pid if traced_redis else workers.procs[0].pid
            _control("-z", traced)  # before the conversations come due
            await b.wait_turns(n, timeout_s=1800, poll_s=0.05)
            _control("-d", traced)
        return _collected(_newest(out, traced))
    finally:
        workers.stop(timeout_s=120)
        if traced_redis is not None:
            await _shutdown(url)
            traced_redis.wait(60)
        if server is not None:
            server.__exit__(None, None, None)


async def _per_script(n: int, out: Path) -> dict[str, float]:
    """Redis instructions per call of each script a turn makes, as the turn makes it: the
    claim (200 batches a call), the reply's store, the finish (done: memory, the last part's
    record, the figures of one AI call and one send). The worker's own ConversationStore calls,
    on a traced Redis, counters dumped after each kind."""
    import worker.conversation_store as store
    from scripts.bench.worker_load import (
        PREFIX,
        TENANT,
        Bench,
        finish_one_part_replies,
        make_event,
        person_id,
    )
    from shared.settings import Settings
    from shared.storage.group_commit import GroupCommitter

    traced, url = _traced_redis(out)
    costs: dict[str, float] = {}
    try:
        await _wait_ping(url)
        async with Bench(url) as b:
            await b.ingest_bulk([make_event(person_id(i), 0) for i in range(n)])
            await b.intake(1, 2)
            await asyncio.sleep(0.05)
            settings = Settings().with_overrides(
                redis_url=url, key_prefix=PREFIX, debounce_window_s=0.001, max_wait_s=0.002
            )
            conv = store.ConversationStore(settings, b.scripts, GroupCommitter(b.redis, b.scripts))
            batches: list[Any] = []

            async def claim() -> None:
                while len(batches) < n:
                    got = await conv.claim(TENANT, CONCURRENCY, f"t{len(batches)}")
                    batches.extend(got.batches)

            async def save() -> None:
                await asyncio.gather(*(conv.save_reply(x, "ok") for x in batches))

            async def finish() -> None:
                await finish_one_part_replies(conv, batches)

            for name, phase in (("claim", claim), ("save_reply", save), ("finish", finish)):
                await b.redis.config_resetstat()
                _control("-z", traced.pid)
                await phase()
                _control("-d", traced.pid)
                costs[name] = _collected(_newest(out, traced.pid)) / n
                stats = await b.redis.info("commandstats")
                costs[f"  {name} commands"] = _inner_commands(stats) / n
    finally:
        await _shutdown(url)
        traced.wait(60)
    return costs


def _inner_commands(commandstats: dict[str, Any]) -> int:
    """The commands the scripts called (what a script costs is mostly how many it calls)."""
    outer = {"cmdstat_fcall", "cmdstat_evalsha", "cmdstat_config|resetstat", "cmdstat_info"}
    return sum(int(v.get("calls", 0)) for k, v in commandstats.items() if k not in outer)


async def _per_intake(n: int, out: Path) -> dict[str, float]:
    """Redis instructions per message the claim takes in (claiming nothing, the whole inbox in
    one call, as the worker's intake does): N people's first messages, then a second message
    each, which joins the burst waiting (docs/benchmarks/memory.md)."""
    from scripts.bench.worker_load import Bench, make_event, person_id

    traced, url = _traced_redis(out)
    costs: dict[str, float] = {}
    try:
        await _wait_ping(url)
        async with Bench(url) as b:
            for name, m in (("intake_new", 0), ("intake_known", 1)):
                await b.ingest_bulk([make_event(person_id(i), m) for i in range(n)])
                _control("-z", traced.pid)
                await b.intake(300_000, 600_000)
                _control("-d", traced.pid)
                costs[name] = _collected(_newest(out, traced.pid)) / n
    finally:
        await _shutdown(url)
        traced.wait(60)
    return costs


async def _wait_ping(url: str) -> None:
    from redis.asyncio import Redis
    from redis.exceptions import RedisError

    r = Redis.from_url(url)
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                await r.ping()
                return
            except (OSError, RedisError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await r.aclose()


def measure(side: str, n: int, keep: str = "") -> dict[str, float]:
    """Instructions per turn of `side` (per call of each script, for "scripts")."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(keep or tmp)  # kept: for callgrind_annotate
        out.mkdir(parents=True, exist_ok=True)
        if side == "scripts":
            return asyncio.run(_per_script(n, out))
        if side == "intake":
            return asyncio.run(_per_intake(n, out))
        return {side: asyncio.run(_run(side, n, out)) / n}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="conversations (turns) per measurement")
    p.add_argument(
        "--side", choices=("both", "worker", "redis", "scripts", "intake"), default="both"
    )
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--keep", default="", help="keep the callgrind dumps in this directory")
    p.add_argument("--at", default="", help="measure this git revision's product code")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind not found: apt-get install valgrind")
    if args.at and not revision.exported():
        code, description = revision.export(args.at)
        try:
            argv = [a for a in sys.argv[1:] if a != args.at and a != "--at"]
            return revision.run_on(code, description, "scripts.bench.turn_instructions", argv)
        finally:
            shutil.rmtree(code, ignore_errors=True)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sides = ("worker", "redis") if args.side == "both" else (args.side,)
    print(f"code: {revision.describe()}, N={args.n}", flush=True)
    for _ in range(args.repeat):
        for side in sides:
            for name, per in measure(side, args.n, args.keep).items():
                unit = "message" if side == "intake" else "turn"
                if name.startswith(" "):  # the commands a script called, per call
                    print(f"{name:20s} {per:>10,.1f} per call", flush=True)
                else:
                    print(f"{name:20s} {per:>10,.0f} instructions/{unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
