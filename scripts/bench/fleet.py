"""Fleet-scaling benchmark: signed webhook in -> reply sent, through real processes.

    scripts/bench_fleet                      # every scenario, 1 round
    scripts/bench_fleet --only scaling --rounds 2 --write
    scripts/bench_fleet --messages 200 --tenant-counts 10,50 --waiting 500  # smoke

Every run starts its own receivers (uvicorn, uvloop + httptools, as the
Procfile) and workers (`python -m worker`), the echo brain (zero latency) and a zero-latency
sender (scripts/bench/fleet_probe.py: answers with a message id at once, like the Graph API,
and records when it sent), on a private Redis: one server, or a local cluster of three masters
(`scripts.dev.redis_server`), appendonly off. The load generator (this process) posts N signed
one-message webhooks, each from a different person, over keep-alive connections as fast as
the receivers answer, spread over the tenants; end-to-end rate = N / (last reply sent - first
POST). CPU per message comes from /proc for every process of the run.

Scenarios (--only, comma-separated):
    scaling   1 and 2 receivers x 1, 2 and 4 workers, on one Redis and on the cluster
    tenants   1 receiver, 1 worker, one Redis: traffic spread over 10, 1 000, 10 000 active
              tenants; then the idle cost of the worker's registry sweep with that many
    waiting   the same with 100 000 conversations waiting (window 300 s, in 10 other tenants)
              against the same load without them
    idle      no traffic at all: --tenant-counts tenants registered (registry entry and stats
              hash, as traffic leaves them), --idle-workers workers, POLL_INTERVAL_S set by
              --idle-poll-s (1); the CPU the workers and Redis spend on the safety sweep, and
              the commands it sends

Results are ratios against a baseline measured in the same round (one receiver, one worker, one
Redis, 10 tenants), because the machine is shared and noisy; absolute rates are shown too.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as AsyncCluster

from receiver.http_protocol import UVICORN_HTTP
from scripts.bench.commandstats import script_stats
from scripts.dev.redis_server import RedisCluster, RedisServer, find_server_binary, free_port
from scripts.webhooks import inbound_webhook, sign_body, text_message
from shared.events import dedupe_id, encode, message_event
from shared.fleet import dispatch_lag, wake
from shared.keys import Keys
from shared.storage.scripts import Scripts

ROOT = Path(__file__).resolve().parents[2]

PREFIX = "fleet"
SECRET = "fleet-bench-secret"
FIRST_TENANT = 106540352200000
DOC = ROOT / "docs" / "benchmarks" / "fleet.md"
BEGIN, END = "<!-- bench_fleet:begin -->", "<!-- bench_fleet:end -->"
IDLE_BEGIN, IDLE_END = "<!-- bench_fleet:idle:begin -->", "<!-- bench_fleet:idle:end -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Variables of the product's contract: the developer's shell must not leak into the processes.
CONTRACT = (
    "REDIS_URL REDIS_CLUSTER REDIS_TIMEOUT_S KEY_PREFIX PORT WHATSAPP_APP_SECRET "
    "WHATSAPP_VERIFY_TOKEN WHATSAPP_ACCESS_TOKEN WHATSAPP_API_BASE_URL WHATSAPP_API_VERSION "
    "ANTHROPIC_API_KEY ANTHROPIC_BASE_URL AI_MODEL SYSTEM_PROMPT BRAIN SENDER TENANTS_FILE "
    "DEBOUNCE_WINDOW_S MAX_WAIT_S LEASE_S LEASE_RENEW_S MAX_ATTEMPTS RETRY_BASE_S "
    "REVIEW_AFTER_S WORKER_CONCURRENCY POLL_INTERVAL_S SHUTDOWN_GRACE_S DEDUPE_TTL_S"
).split()


def say(text: str) -> None:
    print(text, flush=True)


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process used so far; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy() -> float:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values[:3]) / CLK_TCK  # user + nice + system


def tenant_ids(count: int, start: int = 0) -> list[str]:
    return [str(FIRST_TENANT + start + i) for i in range(count)]


# --- Redis ------------------------------------------------------------------------------------
@dataclass
class Backend:
    name: str
    url: str
    cluster: bool
    pids: list[int]
    node_urls: list[str]
    _owner: Any = None

    def client(self) -> Any:
        return AsyncCluster.from_url(self.url) if self.cluster else Redis.from_url(self.url)

    def close(self) -> None:
        self._owner.close()


def start_backend(name: str) -> Backend:
    if name == "cluster":
        cluster = RedisCluster(masters=3).start()
        pids = [n.process.pid for n in cluster.nodes if n.process]
        return Backend(name, cluster.url, True, pids, cluster.urls, cluster)
    server = RedisServer().start()
    assert server.process is not None
    return Backend(name, server.url, False, [server.process.pid], [server.url], server)


def flush(backend: Backend) -> None:
    for url in backend.node_urls:
        client = redis.Redis.from_url(url)
        client.flushall()
        client.close()


def script_calls(backend: Backend) -> int:
    """Script calls (EVALSHA, FCALL) every node has served so far (INFO commandstats)."""
    total = 0
    for url in backend.node_urls:
        client = redis.Redis.from_url(url)
        total += script_stats(client.info("commandstats"))["calls"]
        client.close()
    return total


def listening_workers(backend: Backend) -> int:
    """Workers with their wake-up connection open (named; `CLIENT LIST` of every node)."""
    prefix = Keys(PREFIX).worker_client_prefix
    names = set()
    for url in backend.node_urls:
        client = redis.Redis.from_url(url)
        names |= {c["name"] for c in client.client_list() if c["name"].startswith(prefix)}
        client.close()
    return len(names)


def used_memory(backend: Backend) -> int:
    total = 0
    for url in backend.node_urls:
        client = redis.Redis.from_url(url)
        total += int(client.info("memory")["used_memory"])
        client.close()
    return total


# --- processes --------------------------------------------------------------------------------
@dataclass
class Fleet:
    """Receivers and workers of one run; `stop()` ends them (SIGTERM: workers dump their rows)."""

    backend: Backend
    receivers: int
    workers: int
    out: Path
    tenants_file: Path | None = None
    poll_interval_s: float = 1.0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    receiver_pids: list[int] = field(default_factory=list)
    worker_pids: list[int] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in CONTRACT}
        env.update(
            REDIS_URL=self.backend.url,
            REDIS_CLUSTER="true" if self.backend.cluster else "false",
            KEY_PREFIX=PREFIX,
            WHATSAPP_APP_SECRET=SECRET,
            BRAIN="echo",
            SENDER="scripts.bench.fleet_probe:ClockSender",
            BENCH_OUT=str(self.out),
            PYTHONPATH=str(ROOT),  # scripts.bench.fleet_probe, whatever the caller's PYTHONPATH
            DEBOUNCE_WINDOW_S="0.001",
            MAX_WAIT_S="1",
            LEASE_S="60",
            LEASE_RENEW_S="20",
            WORKER_CONCURRENCY="200",
            POLL_INTERVAL_S=str(self.poll_interval_s),
            MEMORY_TURNS="0",
            LOG_LEVEL="WARNING",
            LOG_FORMAT="text",
        )
        if self.tenants_file:
            env["TENANTS_FILE"] = str(self.tenants_file)
        return env

    def start(self) -> Fleet:
        env = self.env()
        logs = self.out / "logs"
        logs.mkdir(exist_ok=True)
        for i in range(self.receivers):
            port = free_port()
            command = [sys.executable, "-m", "uvicorn", "receiver.app:create_app", "--factory"]
            command += ["--port", str(port)]
            command += ["--loop", "uvloop", "--http", UVICORN_HTTP, "--no-access-log"]
            self._spawn(command, env, logs / f"receiver-{i}.log")
            self.ports.append(port)
            self.receiver_pids.append(self.procs[-1].pid)
        for i in range(self.workers):
            self._spawn([sys.executable, "-m", "worker"], env, logs / f"worker-{i}.log")
            self.worker_pids.append(self.procs[-1].pid)
        self._wait_ready()
        return self

    def _spawn(self, command: list[str], env: dict[str, str], log: Path) -> None:
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            )

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a process exited at start-up: see {self.out}/logs")
            if listening_workers(self.backend) >= self.workers and all(map(_healthy, self.ports)):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the fleet did not come up in {timeout_s}s: see {self.out}/logs")

    def cpu(self) -> dict[str, float]:
        return {
            "receivers": sum(proc_cpu(p) for p in self.receiver_pids),
            "workers": sum(proc_cpu(p) for p in self.worker_pids),
            "redis": sum(proc_cpu(p) for p in self.backend.pids),
        }

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def sends(self) -> list[tuple[float, int, int]]:
        rows = []
        for path in self.out.glob("sends-*.tsv"):
            for line in path.read_text().splitlines():
                s, r, n = line.split("\t")
                rows.append((float(s), int(r), int(n)))
        return rows


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


# --- load ----------------------------------------------------------------------------------
def webhook(tenant: str, person: str, message_id: str, now_s: int) -> bytes:
    """One signed webhook POST as raw HTTP/1.1 bytes (post_all writes them to the sockets)."""
    text = text_message(message_id, "hola, ¿tienen turno el sábado?", person, now_s)
    body = orjson.dumps(inbound_webhook(tenant, person, [text]))
    head = (
        "POST /webhooks/whatsapp HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"X-Hub-Signature-256: {sign_body(SECRET, body)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def requests_for(count: int, tenants: list[str], tag: str) -> list[bytes]:
    now_s = int(time.time())
    return [
        webhook(tenants[i % len(tenants)], f"549{i:010d}", f"wamid.{tag}.{i}", now_s)
        for i in range(count)
    ]


async def post_all(
    ports: list[int], requests: list[bytes], connections: int, rate: float = 0.0
) -> Counter[int]:
    """POST every request once over `connections` keep-alive connections; status counts.
    `rate` > 0: request i goes out no sooner than i / rate seconds after the first."""
    statuses: Counter[int] = Counter()
    todo: Iterator[tuple[int, bytes]] = enumerate(requests)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one_connection(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i, request in todo:
                if rate > 0 and (wait := start + i / rate - loop.time()) > 0:
                    await asyncio.sleep(wait)
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                statuses[int(head[9:12])] += 1
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                        if length:
                            await reader.readexactly(length)
        finally:
            writer.close()

    await asyncio.gather(*(one_connection(ports[i % len(ports)]) for i in range(connections)))
    return statuses


async def turns_done(client: Any, tenants: list[str]) -> int:
    keys = Keys(PREFIX)
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.hget(keys.tenant(tenant).stats, "turns")
    return sum(int(v or 0) for v in await pipe.execute())


async def lag_counts(client: Any, tenants: list[str]) -> Counter[str]:
    """The dispatch-lag fields (due -> claim, recorded by claim.lua) of every tenant, summed."""
    keys = Keys(PREFIX)
    total: Counter[str] = Counter()
    for start in range(0, len(tenants), 1000):
        pipe = client.pipeline(transaction=False)
        for tenant in tenants[start : start + 1000]:
            pipe.hgetall(keys.tenant(tenant).stats)
        for stats in await pipe.execute():
            for name, value in stats.items():
                name = name.decode()
                if name.startswith(dispatch_lag.BUCKET_PREFIX) or name in (
                    dispatch_lag.SUM_FIELD,
                    dispatch_lag.COUNT_FIELD,
                ):
                    total[name] += int(value)
    return total


def lag_summary(before: Counter[str], after: Counter[str]) -> dict[str, float]:
    """Mean and p50/p99 of the claims between two readings (a percentile is the upper bound
    of the histogram bucket it falls in: 1, 5, 10, 25, 50 ms ...)."""
    count = after[dispatch_lag.COUNT_FIELD] - before[dispatch_lag.COUNT_FIELD]
    if count <= 0:
        return {"lag_mean_ms": float("nan"), "lag_p50_ms": float("nan"), "lag_p99_ms": float("nan")}
    mean = (after[dispatch_lag.SUM_FIELD] - before[dispatch_lag.SUM_FIELD]) / count
    bounds = [str(b) for b in dispatch_lag.BUCKETS_MS] + [dispatch_lag.INF]
    cumulative, found = 0, {}
    for bound in bounds:
        name = dispatch_lag.BUCKET_PREFIX + bound
        cumulative += after[name] - before[name]
        for q in (0.5, 0.99):
            if q not in found and cumulative >= q * count:
                found[q] = float(bound) if bound != dispatch_lag.INF else float("inf")
    return {"lag_mean_ms": mean, "lag_p50_ms": found[0.5], "lag_p99_ms": found[0.99]}


async def wait_turns(client: Any, tenants: list[str], expected: int, timeout_s: float) -> None:
    every = 0.05 if len(tenants) <= 100 else 0.5
    deadline = time.monotonic() + timeout_s
    while (done := await turns_done(client, tenants)) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {done} of {expected} turns after {timeout_s}s")
        await asyncio.sleep(every)


# --- one measured run -------------------------------------------------------------------------
@dataclass
class Run:
    label: str
    backend: str
    receivers: int
    workers: int
    tenants: int
    messages: int
    rate: float  # messages/s, first POST to last reply sent
    ingest_rate: float  # messages/s, first POST to last 200
    cpu_us: dict[str, float]  # per message, by component
    others_share: float  # machine CPU used by other processes during the run (cores)
    non_200: int
    script_calls: float = 0.0  # EVALSHA calls per message (every node)
    lag_ms: dict[str, float] = field(default_factory=dict)  # dispatch lag: mean, p50, p99
    latency_ms: dict[str, float] = field(default_factory=dict)  # webhook in -> reply: p50, p99
    extra: dict[str, float] = field(default_factory=dict)


async def measure(
    fleet: Fleet,
    tenants: list[str],
    messages: int,
    connections: int,
    tag: str,
    label: str,
    rate: float = 0.0,
) -> Run:
    client = fleet.backend.client()
    try:
        warm = requests_for(min(200, messages), tenants, f"{tag}w")
        await post_all(fleet.ports, warm, min(connections, len(warm)))
        await wait_turns(client, tenants, len(warm), 60)
        load = requests_for(messages, tenants, tag)
        cpu0, busy0, own0 = fleet.cpu(), machine_busy(), time.process_time()
        calls0 = script_calls(fleet.backend)
        lag0 = await lag_counts(client, tenants)
        t0_ms = time.time() * 1000
        statuses = await post_all(fleet.ports, load, connections, rate)
        posted_ms = time.time() * 1000
        await wait_turns(client, tenants, len(warm) + messages, 120 + messages / 100)
        cpu1, busy1, own1 = fleet.cpu(), machine_busy(), time.process_time()
        calls1 = script_calls(fleet.backend)
        lag1 = await lag_counts(client, tenants)
    finally:
        await client.aclose()
    fleet.stop()
    sends = [s for s in fleet.sends() if s[1] >= t0_ms - 1]
    if len(sends) != messages:
        raise RuntimeError(f"{label}: {len(sends)} replies recorded for {messages} messages")
    last_ms = max(s[0] for s in sends)
    latencies = sorted(s[0] - s[1] for s in sends)
    cpu_us = {k: (cpu1[k] - cpu0[k]) / messages * 1e6 for k in cpu0}
    cpu_us["load generator"] = (own1 - own0) / messages * 1e6
    ours = sum(cpu1[k] - cpu0[k] for k in cpu0) + (own1 - own0)
    elapsed_s = (time.time() * 1000 - t0_ms) / 1000
    return Run(
        label=label,
        backend=fleet.backend.name,
        receivers=fleet.receivers,
        workers=fleet.workers,
        tenants=len(tenants),
        messages=messages,
        rate=messages / ((last_ms - t0_ms) / 1000),
        ingest_rate=messages / ((posted_ms - t0_ms) / 1000),
        cpu_us=cpu_us,
        others_share=max(0.0, (busy1 - busy0) - ours) / elapsed_s,
        non_200=sum(n for s, n in statuses.items() if s != 200),
        script_calls=(calls1 - calls0) / messages,
        lag_ms=lag_summary(lag0, lag1),
        latency_ms={
            "p50": latencies[len(latencies) // 2],
            "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        },
    )


def describe(run: Run) -> str:
    cpu = ", ".join(f"{k} {v:.0f}" for k, v in run.cpu_us.items())
    return (
        f"  {run.label}: {run.rate:,.0f} msg/s end to end (ingest {run.ingest_rate:,.0f}/s), "
        f"CPU µs/msg: {cpu}; {run.script_calls:.2f} script calls/msg; "
        f"dispatch lag mean {run.lag_ms['lag_mean_ms']:.1f} ms, p50 <= "
        f"{run.lag_ms['lag_p50_ms']:g} ms, p99 <= {run.lag_ms['lag_p99_ms']:g} ms; "
        f"webhook to reply p50 {run.latency_ms['p50']:.1f} ms, p99 {run.latency_ms['p99']:.1f} ms; "
        f"other load {run.others_share:.2f} cores"
        + ("" if not run.non_200 else f"; NON-200: {run.non_200}")
    )


async def run_fleet(
    backend: Backend,
    receivers: int,
    workers: int,
    tenants: list[str],
    args: argparse.Namespace,
    label: str,
    *,
    keep_data: bool = False,
    **fleet_options: Any,
) -> Run:
    """One measured run of a fresh fleet; Redis flushed first unless `keep_data` (the parked
    conversations of the `waiting` scenario stay)."""
    if not keep_data:
        flush(backend)
    out = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    fleet = Fleet(backend, receivers, workers, out, **fleet_options).start()
    try:
        tag = f"{label}.{time.monotonic_ns()}".replace(" ", "")
        run = await measure(fleet, tenants, args.messages, args.connections, tag, label, args.rate)
    finally:
        fleet.stop()
        shutil.rmtree(out, ignore_errors=True)
    say(describe(run))
    return run


# --- scenarios -----------------------------------------------------------------------------
SHAPES = "1x1,1x2,1x4,2x1,2x2,2x4"  # receivers x workers


async def scaling(backends: dict[str, Backend], args: argparse.Namespace) -> list[Run]:
    tenants = tenant_ids(args.tenants)
    runs = []
    for name in args.backends:
        for receivers, workers in args.shapes:
            label = f"{name} {receivers}r {workers}w"
            runs.append(await run_fleet(backends[name], receivers, workers, tenants, args, label))
    return runs


async def tenant_growth(backend: Backend, args: argparse.Namespace) -> list[Run]:
    runs = []
    for count in args.tenant_counts:
        tenants = tenant_ids(count)
        saved = args.messages
        args.messages = max(args.messages, 2 * count)  # every tenant active, twice
        try:
            run = await run_fleet(backend, 1, 1, tenants, args, f"tenants {count}")
        finally:
            args.messages = saved
        run.extra.update(await idle_cost(backend, tenants, args))
        say(
            f"    idle with {count} tenants: worker {run.extra['idle_worker_pct']:.1f}% "
            f"+ Redis {run.extra['idle_redis_pct']:.1f}% of a core; "
            f"registry {run.extra['registry_b']:.0f} B/tenant, stats hash "
            f"{run.extra['stats_b']:.0f} B"
        )
        runs.append(run)
    return runs


async def idle_cost(
    backend: Backend, tenants: list[str], args: argparse.Namespace
) -> dict[str, float]:
    """A worker with these tenants registered and nothing to do: what its sweep costs."""
    keys = Keys(PREFIX)
    client = redis.Redis.from_url(backend.url)
    try:
        registry_b = float(client.memory_usage(keys.tenants) or 0) / len(tenants)
        stats_b = float(client.memory_usage(keys.tenant(tenants[0]).stats) or 0)
    finally:
        client.close()
    out = Path(tempfile.mkdtemp(prefix="bench-fleet-idle-"))
    fleet = Fleet(backend, 0, 1, out).start()
    try:
        await asyncio.sleep(2.0)  # the first sweeps take the registry in
        cpu0, t0 = fleet.cpu(), time.monotonic()
        await asyncio.sleep(args.idle_s)
        cpu1, elapsed = fleet.cpu(), time.monotonic() - t0
    finally:
        fleet.stop()
        shutil.rmtree(out, ignore_errors=True)
    return {
        "idle_worker_pct": (cpu1["workers"] - cpu0["workers"]) / elapsed * 100,
        "idle_redis_pct": (cpu1["redis"] - cpu0["redis"]) / elapsed * 100,
        "registry_b": registry_b,
        "stats_b": stats_b,
    }


@dataclass
class Idle:
    tenants: int
    workers: int
    worker_pct: float  # of one core, all workers together
    redis_pct: float
    commands: dict[str, float]  # per second, by command (INFO commandstats, every node)


async def idle_sweep(backend: Backend, args: argparse.Namespace) -> list[Idle]:
    """Registered tenants and no traffic: what the fleet's safety sweep costs while idle."""
    runs = []
    for count in args.tenant_counts:
        for workers in args.idle_workers:
            flush(backend)
            await register_idle_tenants(backend, tenant_ids(count))
            out = Path(tempfile.mkdtemp(prefix="bench-fleet-idle-"))
            fleet = Fleet(backend, 0, workers, out, poll_interval_s=args.idle_poll_s).start()
            try:
                await asyncio.sleep(2.0)  # start-up sweeps are over
                cpu0, calls0, t0 = fleet.cpu(), command_calls(backend), time.monotonic()
                await asyncio.sleep(args.idle_s)
                cpu1, calls1 = fleet.cpu(), command_calls(backend)
                elapsed = time.monotonic() - t0
            finally:
                fleet.stop()
                shutil.rmtree(out, ignore_errors=True)
            run = Idle(
                tenants=count,
                workers=workers,
                worker_pct=(cpu1["workers"] - cpu0["workers"]) / elapsed * 100,
                redis_pct=(cpu1["redis"] - cpu0["redis"]) / elapsed * 100,
                commands={
                    name: (calls1[name] - calls0.get(name, 0)) / elapsed
                    for name in calls1
                    if calls1[name] > calls0.get(name, 0)
                },
            )
            say(describe_idle(run))
            runs.append(run)
    return runs


async def register_idle_tenants(backend: Backend, tenants: list[str]) -> None:
    """What traffic leaves of a tenant once it is quiet: its registry entry and stats hash."""
    keys = Keys(PREFIX)
    client = backend.client()
    try:
        for start in range(0, len(tenants), 1000):
            chunk = tenants[start : start + 1000]
            await client.sadd(keys.tenants, *chunk)
            pipe = client.pipeline(transaction=False)
            for tenant in chunk:
                pipe.hset(keys.tenant(tenant).stats, mapping={"messages": 2, "turns": 2})
            await pipe.execute()
    finally:
        await client.aclose()


def command_calls(backend: Backend) -> dict[str, int]:
    """Calls served so far by command name, summed over every node (INFO commandstats)."""
    total: Counter[str] = Counter()
    for url in backend.node_urls:
        client = redis.Redis.from_url(url)
        for name, row in client.info("commandstats").items():
            total[name.removeprefix("cmdstat_")] += int(row.get("calls", 0))
        client.close()
    return dict(total)


def describe_idle(run: Idle) -> str:
    top = sorted(run.commands.items(), key=lambda kv: -kv[1])[:6]
    return (
        f"  idle {run.tenants} tenants, {run.workers} worker(s): workers {run.worker_pct:.1f}% "
        f"+ Redis {run.redis_pct:.1f}% of a core; commands/s: "
        + ", ".join(f"{name} {rate:,.0f}" for name, rate in top)
    )


async def waiting(backend: Backend, args: argparse.Namespace) -> list[Run]:
    tenants = tenant_ids(args.tenants)
    parked = tenant_ids(10, start=500_000)
    out = Path(tempfile.mkdtemp(prefix="bench-fleet-tenants-"))
    tenants_file = out / "tenants.toml"
    tenants_file.write_text(
        "".join(f'[tenants."{t}"]\ndebounce_window_s = 300\nmax_wait_s = 600\n\n' for t in parked)
    )
    try:
        base = await run_fleet(backend, 1, 1, tenants, args, "waiting 0")
        flush(backend)
        before = used_memory(backend)
        await park_conversations(backend, parked, args.waiting, tenants_file)
        grown = used_memory(backend) - before
        run = await run_fleet(
            backend,
            1,
            1,
            tenants,
            args,
            f"waiting {args.waiting}",
            keep_data=True,
            tenants_file=tenants_file,
        )
        run.extra["waiting_b"] = grown / args.waiting
        say(f"    {args.waiting:,} waiting conversations: {grown / args.waiting:,.0f} B each")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return [base, run]


async def park_conversations(
    backend: Backend, tenants: list[str], count: int, tenants_file: Path
) -> None:
    """Store `count` one-message conversations as the receiver would (ingest.lua, SADD,
    PUBLISH), then let a worker take them in: they wait 300 s for their turn."""
    keys, scripts = Keys(PREFIX), Scripts()
    client = backend.client()
    try:
        await scripts.load(client)
        await client.sadd(keys.tenants, *tenants)
        now_ms = int(time.time() * 1000)
        for start in range(0, count, 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(count, start + 1000)):
                tenant = tenants[i % len(tenants)]
                event = message_event(
                    channel="whatsapp",
                    person=f"548{i:010d}",
                    message_id=f"wamid.parked.{i}",
                    type="text",
                    text="hola, ¿tienen turno el sábado?",
                    ts=now_ms // 1000,
                    received_ms=now_ms,
                    raw={"id": f"wamid.parked.{i}", "type": "text"},
                )
                k = keys.tenant(tenant)
                scripts.ingest.queue(
                    pipe,
                    k,
                    seen=[k.seen(dedupe_id(event))],
                    dedupe_ttl_s=604800,
                    events=[encode(event)],
                )
            await pipe.execute()
        out = Path(tempfile.mkdtemp(prefix="bench-fleet-park-"))
        fleet = Fleet(backend, 0, 1, out, tenants_file=tenants_file).start()
        try:
            await wake.add(client, keys.wake_queue, tenants)
            deadline = time.monotonic() + 120
            while True:
                pipe = client.pipeline(transaction=False)
                for tenant in tenants:
                    pipe.zcard(keys.tenant(tenant).due)
                if sum(await pipe.execute()) >= count:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the parked conversations were not taken in")
                await asyncio.sleep(0.2)
        finally:
            fleet.stop()
            shutil.rmtree(out, ignore_errors=True)
    finally:
        await client.aclose()


# --- report --------------------------------------------------------------------------------
def total_cpu(run: Run) -> float:
    return sum(v for k, v in run.cpu_us.items() if k != "load generator")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(rounds: list[dict[str, list[Any]]], args: argparse.Namespace, started: str) -> str:
    lines = [
        f"- date: {started}",
        f"- machine: nproc={os.cpu_count()}, load average at start {args.load_start}, at end "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"- python {platform.python_version()}, redis-py {redis.__version__}, server "
        f"{args.server_version}",
        f"- command: `scripts/bench_fleet {' '.join(sys.argv[1:])}` ({len(rounds)} round(s); "
        "medians over rounds)",
    ]
    if args.only != ["idle"]:
        lines.append(
            f"- load: {args.messages} one-message webhooks per run (+200 warm-up), "
            f"{args.connections} keep-alive connections, {args.tenants} tenants unless stated"
            + (f", paced at {args.rate:g} webhooks/s" if args.rate else ", as fast as answered")
        )
    lines.append("")
    baseline = median([r.rate for rnd in rounds for r in rnd.get("scaling", [])[:1]])
    for scenario in ("scaling", "tenants", "waiting"):
        table = [rnd[scenario] for rnd in rounds if rnd.get(scenario)]
        if not table:
            continue
        lines += [
            f"**{scenario}**",
            "",
            "| run | msg/s end to end | × first row | ingest msg/s | CPU µs/msg "
            "(receivers + workers + Redis) | CPU × first row | script calls/msg "
            "| dispatch lag mean / p99 (ms) | webhook to reply p50 / p99 (ms) "
            "| load generator µs/msg | other load (cores) |",
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for i, first in enumerate(table[0]):
            same = [rnd[i] for rnd in table]
            rate = median([r.rate for r in same])
            base = median([rnd[0].rate for rnd in table])
            cpu = {k: median([r.cpu_us[k] for r in same]) for k in first.cpu_us}
            cpu_base = median([total_cpu(rnd[0]) for rnd in table])
            lines.append(
                f"| {first.label} | {rate:,.0f} | {rate / base:.2f} | "
                f"{median([r.ingest_rate for r in same]):,.0f} | "
                f"{cpu['receivers']:.0f} + {cpu['workers']:.0f} + {cpu['redis']:.0f} = "
                f"{cpu['receivers'] + cpu['workers'] + cpu['redis']:.0f} | "
                f"{median([total_cpu(r) for r in same]) / cpu_base:.2f} | "
                f"{median([r.script_calls for r in same]):.2f} | "
                f"{median([r.lag_ms['lag_mean_ms'] for r in same]):.1f} / "
                f"≤ {median([r.lag_ms['lag_p99_ms'] for r in same]):g} | "
                f"{median([r.latency_ms['p50'] for r in same]):.1f} / "
                f"{median([r.latency_ms['p99'] for r in same]):.1f} | "
                f"{cpu['load generator']:.0f} | {median([r.others_share for r in same]):.2f} |"
            )
        lines.append("")
        for i, first in enumerate(table[0]):
            if first.extra:
                merged = {k: median([rnd[i].extra[k] for rnd in table]) for k in first.extra}
                lines.append(
                    f"- {first.label}: " + ", ".join(f"{k} {v:,.1f}" for k, v in merged.items())
                )
        lines.append("")
    lines += idle_table([rnd["idle"] for rnd in rounds if rnd.get("idle")], args)
    if baseline == baseline:
        lines.append(f"Baseline (first scaling row, median): {baseline:,.0f} msg/s.")
    if args.only != ["idle"]:
        non_200 = sum(
            r.non_200 for rnd in rounds for runs in rnd.values() for r in runs if isinstance(r, Run)
        )
        lines.append(f"Non-200 answers over every run: {non_200}.")
    return "\n".join(lines)


def idle_table(table: list[list[Idle]], args: argparse.Namespace) -> list[str]:
    if not table:
        return []
    lines = [
        f"**idle** (no traffic; `POLL_INTERVAL_S={args.idle_poll_s:g}`)",
        "",
        "| tenants registered | workers | workers' CPU (% of a core) | Redis CPU | "
        "SMEMBERS/s | EVALSHA/s | other commands/s (scripts' own included) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, first in enumerate(table[0]):
        same = [rnd[i] for rnd in table]

        def rate(name: str, rows: list[Idle] = same) -> float:
            return median([r.commands.get(name, 0.0) for r in rows])

        others = median(
            [
                sum(v for k, v in r.commands.items() if k not in ("smembers", "evalsha", "info"))
                for r in same
            ]
        )
        lines.append(
            f"| {first.tenants:,} | {first.workers} | "
            f"{median([r.worker_pct for r in same]):.1f} | "
            f"{median([r.redis_pct for r in same]):.1f} | {rate('smembers'):.1f} | "
            f"{rate('evalsha'):,.0f} | {others:,.0f} |"
        )
    return [*lines, ""]


def write_doc(block: str, idle_only: bool = False) -> None:
    """Replace the generated block of the doc (the idle block when only `idle` ran)."""
    text = DOC.read_text()
    begin, end_ = (IDLE_BEGIN, IDLE_END) if idle_only else (BEGIN, END)
    start, end = text.index(begin) + len(begin), text.index(end_)
    DOC.write_text(text[:start] + "\n" + block + "\n" + text[end:])


# --- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", default="scaling,tenants,waiting")
    parser.add_argument("--backends", default="single,cluster", help="single, cluster or both")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of each run")
    parser.add_argument("--messages", type=int, default=6000, help="webhooks per run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="webhooks/s to pace the load at (default: as fast as the receivers answer); "
        "below capacity, the dispatch lag and latency columns show the fleet's reaction time",
    )
    parser.add_argument("--shapes", default=SHAPES, help="receivers x workers of the scaling runs")
    parser.add_argument("--tenants", type=int, default=10, help="tenants of the scaling runs")
    parser.add_argument("--tenant-counts", default="10,1000,10000")
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle-cost measuring time")
    parser.add_argument("--idle-workers", default="1,4", help="worker counts of the idle runs")
    parser.add_argument(
        "--idle-poll-s", type=float, default=1.0, help="POLL_INTERVAL_S of the idle runs"
    )
    parser.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    args.backends = [b for b in args.backends.split(",") if b]
    args.tenant_counts = [int(n) for n in args.tenant_counts.split(",") if n]
    args.idle_workers = [int(n) for n in args.idle_workers.split(",") if n]
    args.shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    return args


async def amain(args: argparse.Namespace) -> list[dict[str, list[Any]]]:
    need = set(args.backends) if {"scaling", "idle"} & set(args.only) else set()
    if {"tenants", "waiting"} & set(args.only):
        need.add("single")
    backends = {name: start_backend(name) for name in sorted(need)}
    try:
        rounds = []
        for n in range(args.rounds):
            say(f"round {n + 1} of {args.rounds}")
            rnd: dict[str, list[Any]] = {}
            if "scaling" in args.only:
                rnd["scaling"] = await scaling(backends, args)
            if "tenants" in args.only:
                rnd["tenants"] = await tenant_growth(backends["single"], args)
            if "waiting" in args.only:
                rnd["waiting"] = await waiting(backends["single"], args)
            if "idle" in args.only:
                rnd["idle"] = [
                    row for name in args.backends for row in await idle_sweep(backends[name], args)
                ]
            rounds.append(rnd)
        return rounds
    finally:
        for backend in backends.values():
            backend.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.load_start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    version = subprocess.run(
        [find_server_binary(), "--version"], capture_output=True, text=True
    ).stdout.strip()
    args.server_version = version.split(" sha=")[0]
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rounds = asyncio.run(amain(args))
    block = report(rounds, args, started)
    say("\n" + block)
    if args.write:
        write_doc(block, idle_only=args.only == ["idle"])
        say(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
