"""Load and measurement helpers for `scripts/bench_worker` (scripts/bench/worker.py).

Writes go through the product's own pieces (shared.events, shared.keys, the ingest and claim
Lua scripts), the way the receiver writes: ingest.lua (dedupe + LPUSH), SADD tenants, PUBLISH
wake. Workers are real `python -m worker` subprocesses with BRAIN/SENDER from worker_probe,
run on the code under test (scripts/bench/revision.py).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from scripts.bench import revision
from shared.events import dedupe_id, encode, message_event
from shared.fleet.wake import listening_workers, now_ms, wake_command
from shared.keys import Keys
from shared.storage import scripts as scripts_module
from shared.storage.scripts import Scripts

# Revisions before named script calls (`bench_worker --at`) took KEYS and ARGV as two lists.
NAMED_CALLS = hasattr(scripts_module, "Signature")
# Revisions whose events named their tenant (`bench_worker --at`) take it as an argument.
EVENT_TENANT = "tenant" in inspect.signature(message_event).parameters

# The product code the workers run: this checkout, or a revision exported by bench_worker --at.
CODE = revision.code_dir()
PREFIX = "bench"
TENANT = "106540352242922"
DEDUPE_TTL_S = 604800
TEXTS = [
    "hola",
    "una consulta",
    "¿tienen turno el sábado?",
    "a la tarde, después de las 16 si puede ser",
]


# Temporary directories (worker logs and rows, exported code) removed by cleanup().
CREATED: list[Path] = []


def cleanup() -> None:
    for path in CREATED:
        shutil.rmtree(path, ignore_errors=True)
    CREATED.clear()


def person_id(i: int) -> str:
    return f"549115{i:07d}"


def wamid(person: str, n: int) -> str:
    # Shaped like a real wamid (base64 of the sender and a message key), ~60 characters.
    return f"wamid.HBgN{person}FQIAEhgUM0E{n:012d}QkNERUYxMjM0NQA="


def make_event(person: str, n: int, received_ms: int | None = None) -> dict[str, Any]:
    """A text message event as the receiver stores it (raw = the provider's message object)."""
    now_ms = int(time.time() * 1000) if received_ms is None else received_ms
    text = TEXTS[n % len(TEXTS)]
    mid = wamid(person, n)
    raw = {
        "from": person,
        "id": mid,
        "timestamp": str(now_ms // 1000),
        "type": "text",
        "text": {"body": text},
    }
    return message_event(
        **({"tenant": TENANT} if EVENT_TENANT else {}),
        channel="whatsapp",
        person=person,
        message_id=mid,
        type="text",
        text=text,
        ts=now_ms // 1000,
        received_ms=now_ms,
        raw=raw,
        name="Ana Pérez",
    )


@dataclass
class Bench:
    """A Redis client plus the product's scripts and key names, for one private server."""

    url: str
    redis: Any = None
    scripts: Scripts = field(default_factory=Scripts)
    keys: Keys = field(default_factory=lambda: Keys(PREFIX))

    async def __aenter__(self) -> Bench:
        self.redis = Redis.from_url(self.url)
        await self.scripts.load(self.redis)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.redis.aclose()

    @property
    def tk(self) -> Any:
        return self.keys.tenant(TENANT)

    def queue_ingest(self, pipe: Any, event: dict[str, Any], publish: bool) -> None:
        """One webhook with one message, as the receiver writes it."""
        tk = self.tk
        pipe.sadd(self.keys.tenants, TENANT)
        seen, data = [tk.seen(dedupe_id(event))], [encode(event)]
        if NAMED_CALLS:
            self.scripts.ingest.queue(pipe, tk, seen=seen, dedupe_ttl_s=DEDUPE_TTL_S, events=data)
        else:
            old_queue: Any = self.scripts.ingest.queue
            old_queue(pipe, [tk.inbox, *seen], [DEDUPE_TTL_S, *data])
        if publish:
            pipe.execute_command(*wake_command(self.keys, [TENANT], now_ms()))
            # Revisions before the wake-up queues (`bench_worker --at`) listened on a pub/sub
            # channel of this name; no subscriber, no cost.
            pipe.publish(self.keys.wake_queue, TENANT)

    async def ingest_live(self, event: dict[str, Any]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        self.queue_ingest(pipe, event, publish=True)
        stored = (await pipe.execute())[1]
        assert stored == [1], stored

    async def ingest_bulk(self, events: Sequence[dict[str, Any]], per_pipe: int = 1000) -> None:
        """Pre-load: one ingest call per message (one webhook each), pipelined, no PUBLISH."""
        for start in range(0, len(events), per_pipe):
            pipe = self.redis.pipeline(transaction=False)
            for event in events[start : start + per_pipe]:
                self.queue_ingest(pipe, event, publish=False)
            results = await pipe.execute()
            assert all(r == [1] for r in results[1::2]), "duplicates in a pre-load"

    async def intake(self, window_ms: int, max_wait_ms: int) -> int:
        """Take the whole inbox in with the worker's own claim call, claiming nothing, in one
        script call so every conversation gets its due time from the same clock reading.
        Returns that Redis clock (ms)."""
        import worker.conversation_store as store
        from shared.settings import Settings
        from shared.storage.group_commit import GroupCommitter

        settings = Settings().with_overrides(
            redis_url=self.url,
            key_prefix=PREFIX,
            debounce_window_s=window_ms / 1000,
            max_wait_s=max_wait_ms / 1000,
        )
        conversations = store.ConversationStore(
            settings, self.scripts, GroupCommitter(self.redis, self.scripts)
        )
        saved = store.MAX_INTAKE_PER_CALL
        store.MAX_INTAKE_PER_CALL = await self.redis.llen(self.tk.inbox) + 1
        try:
            claim = await conversations.claim(TENANT, 0, "bench-intake")
        finally:
            store.MAX_INTAKE_PER_CALL = saved
        assert not claim.more and not claim.batches
        return claim.now_ms

    async def key_sizes(self, people: Sequence[str]) -> dict[str, float]:
        """Median MEMORY USAGE of each kind of per-person key (found by SCAN, so keys the
        product adds later show up too), over `people`."""
        sizes: dict[str, list[int]] = {}
        for person in people:
            pattern = f"{self.tk.conversation_prefix}{person}:*"
            async for key in self.redis.scan_iter(match=pattern, count=100):
                kind = key.decode().rsplit(":", 1)[1]
                sizes.setdefault(kind, []).append(
                    int(await self.redis.memory_usage(key, samples=0) or 0)
                )
        return {kind: median(values) for kind, values in sorted(sizes.items())}

    async def redis_cpu_seconds(self) -> float:
        info = await self.redis.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    async def turns(self) -> int:
        return int(await self.redis.hget(self.tk.stats, "turns") or 0)

    async def wait_turns(self, n: int, timeout_s: float, poll_s: float = 0.002) -> float:
        """Poll the stats hash until `turns` reaches n; returns the wall-clock ms it did.
        Every `poll_s` once 95 % are done, ten times less often before: this process shares
        the machine's cores with the worker and Redis it measures (polled every 2 ms
        throughout, `perf sched` showed it taking ~7 % of a core from them), while the
        anchors count their jobs in their own process."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = await self.turns()
            if done >= n:
                return time.time() * 1000
            await asyncio.sleep(poll_s if done >= n * 0.95 else poll_s * 10)
        raise TimeoutError(f"only {await self.turns()} of {n} turns after {timeout_s}s")

    async def wait_listening(self, n: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            (_, subscribed), *_ = await self.redis.pubsub_numsub(self.keys.wake_queue)  # --at
            if max(subscribed, await listening_workers(self.redis, self.keys)) >= n:
                return
            await asyncio.sleep(0.01)
        raise TimeoutError(f"{n} workers did not come up within {timeout_s}s")


@dataclass
class Workers:
    """`python -m worker` subprocesses recording turns through worker_probe."""

    redis_url: str
    count: int = 1
    env: dict[str, str] = field(default_factory=dict)
    profile: str = ""  # py-spy output path (collapsed stacks) for the first worker, or ""
    wrapper: list[str] = field(default_factory=list)  # e.g. valgrind's command line, or none
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    spies: list[subprocess.Popen[bytes]] = field(default_factory=list)
    out: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-worker-")))

    def start(self) -> Workers:
        CREATED.append(self.out)
        env = {
            **os.environ,
            "REDIS_URL": self.redis_url,
            "KEY_PREFIX": PREFIX,
            "BRAIN": "scripts.bench.worker_probe:TimingBrain",
            "SENDER": "scripts.bench.worker_probe:NullSender",
            "LOG_LEVEL": "WARNING",
            "BENCH_OUT": str(self.out),
            # The product from CODE (also the working directory), scripts.bench from here.
            "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(CODE), str(revision.ROOT)])),
            **self.env,
        }
        env.pop("ANTHROPIC_API_KEY", None)
        for i in range(self.count):
            log = (self.out / f"worker-{i}.log").open("wb")
            # BENCH_VARIANTS (set by `bench_worker --variants`): patched worker, see
            # worker_variants.py; otherwise the product's own entry point.
            command = [sys.executable, "-m", "worker"]
            if os.environ.get("BENCH_VARIANTS"):
                command = [sys.executable, "-m", "scripts.bench.worker_variants"]
            command = [*self.wrapper, *command]
            proc = subprocess.Popen(
                command,
                cwd=CODE,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.procs.append(proc)
            if self.profile and i == 0:
                self.spies.append(
                    subprocess.Popen(
                        [
                            str(Path(sys.executable).with_name("py-spy")),
                            "record",
                            "--pid",
                            str(proc.pid),
                            "--rate",
                            "500",
                            "--nonblocking",
                            "--format",
                            "raw",
                            "--output",
                            self.profile,
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=(self.out / "py-spy.log").open("wb"),
                    )
                )
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for spy in self.spies:
            try:
                spy.wait(timeout_s)  # py-spy writes its profile when the target exits
            except subprocess.TimeoutExpired:
                spy.send_signal(signal.SIGINT)
                spy.wait()
        bad = [p.returncode for p in self.procs if p.returncode != 0]
        if bad:
            raise RuntimeError(f"worker exited with {bad}; logs in {self.out}")

    def cpu_seconds(self) -> float:
        """User + system CPU time the worker processes used so far (Linux /proc)."""
        total = 0
        for proc in self.procs:
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        return total / os.sysconf("SC_CLK_TCK")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.out.glob("worker-*.log"))

    def rows(self) -> list[tuple[float, int, int, int, int]]:
        """All turns recorded by every worker: (start_ms, due_ms, claimed_ms, received_ms, n)."""
        out: list[tuple[float, int, int, int, int]] = []
        for path in self.out.glob("turns-*.tsv"):
            for line in path.read_text().splitlines():
                a, b, c, d, e = line.split("\t")
                out.append((float(a), int(b), int(c), int(d), int(e)))
        return out

    def rows_by_process(self) -> list[int]:
        return [len(p.read_text().splitlines()) for p in sorted(self.out.glob("turns-*.tsv"))]


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), int(-(-p * len(ordered) // 100))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return float("nan")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


async def redis_lpush_rpop_baseline(url: str, n: int, chunk: int = 200) -> float:
    """Pairs/s of a trivial Redis-bound loop: one asyncio redis-py client, pipelines of `chunk`
    LPUSH then pipelines of `chunk` RPOP (two round trips per `chunk` items), event-sized values."""
    redis = Redis.from_url(url)
    payload = encode(make_event(person_id(0), 0))
    key = "baseline:list"
    try:
        await redis.delete(key)
        started = time.perf_counter()
        done = 0
        while done < n:
            k = min(chunk, n - done)
            pipe = redis.pipeline(transaction=False)
            for _ in range(k):
                pipe.lpush(key, payload)
            await pipe.execute()
            pipe = redis.pipeline(transaction=False)
            for _ in range(k):
                pipe.rpop(key)
            popped = await pipe.execute()
            assert all(p == payload for p in popped)
            done += k
        return n / (time.perf_counter() - started)
    finally:
        await redis.aclose()


async def finish_one_part_replies(conv: Any, batches: Sequence[Any], first: int = 0) -> None:
    """Finish each claimed batch as a turn does after a one-part reply "ok": the exchange
    remembered, the part's record (`wamid.X<i>`, i counted from `first`) and one AI call's and
    one send's figures (scripts/bench/turn_instructions.py, worker_scriptcost.py, lua_ab.py)."""
    import orjson

    from shared.fleet import turn_figures

    figures = turn_figures.pairs([900.0], [80.0], {})
    await asyncio.gather(
        *(
            conv.finish_done(
                x,
                orjson.dumps({"user": x.user_text, "assistant": "ok"}),
                (0, f"wamid.X{i}"),
                figures,
            )
            for i, x in enumerate(batches, first)
        )
    )
