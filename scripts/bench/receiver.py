"""The receiver benchmark (run it as `scripts/bench_receiver --help`).

One run: a private Redis (appendonly off), the receiver and a bare Starlette app as uvicorn
subprocesses with identical flags, wrk driving both with the same Lua script and unique signed
bodies, alternating bare / receiver for `--rounds` rounds, medians reported. After each
receiver run the Redis inbox lists are read back and compared, message id by message id, with
what wrk sent and what was answered 200. The markdown result goes to stdout and into
docs/benchmarks/receiver.md (between markers; text outside them is kept).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import hmac
import http.client
import importlib.metadata
import math
import os
import platform
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis

from receiver.http_protocol import UVICORN_HTTP
from scripts.bench import payloads
from scripts.dev.redis_server import RedisServer, free_port
from shared.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parent

PATH = "/webhooks/whatsapp"
KEY_PREFIX = "bench"
BARE_APP = "scripts.bench.bare_app:app"
DOC = ROOT / "docs" / "benchmarks" / "receiver.md"
BEGIN, END = "<!-- bench_receiver:begin -->", "<!-- bench_receiver:end -->"
EXIT_MISSED, EXIT_BROKEN = 1, 2


class BenchError(RuntimeError):
    """The benchmark itself could not run (not a missed target)."""


# --------------------------------------------------------------------------------------------
# processes


@dataclass
class Pinning:
    client_cpu: int | None = None  # wrk and Redis
    server_cpu: int | None = None  # the app under test

    @classmethod
    def choose(cls, enabled: bool) -> Pinning:
        cpus = sorted(os.sched_getaffinity(0))
        if enabled and shutil.which("taskset") and len(cpus) >= 2:
            return cls(client_cpu=cpus[0], server_cpu=cpus[-1])
        return cls()

    @property
    def active(self) -> bool:
        return self.server_cpu is not None

    def prefix(self, cpu: int | None) -> list[str]:
        return ["taskset", "-c", str(cpu)] if cpu is not None else []

    def describe(self) -> str:
        if not self.active:
            return "not pinned (taskset missing, --no-pin, or fewer than 2 CPUs)"
        return (
            f"server pinned to CPU {self.server_cpu}; wrk and Redis pinned to CPU "
            f"{self.client_cpu} (taskset)"
        )


class PinnedRedis(RedisServer):
    def __init__(self, prefix: list[str]) -> None:
        super().__init__(appendonly=False)
        self._prefix = prefix

    def command(self) -> list[str]:
        return self._prefix + super().command()


class Server:
    """One uvicorn process serving `app` on a free port."""

    def __init__(self, name: str, app: str, env: dict[str, str], prefix: list[str], logdir: Path):
        self.name = name
        self.app = app
        self.port = free_port()
        self.args = [
            str(Path(sys.executable)),
            "-m",
            "uvicorn",
            app,
            # A `create_app` is a factory, as the Procfile runs the receiver.
            *(["--factory"] if app.endswith(":create_app") else []),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--loop",
            "uvloop",
            "--http",
            # The receiver with the Procfile's protocol (what it saves and what its deadlines
            # cost show here as in production); the bare app with uvicorn's own.
            UVICORN_HTTP if app.endswith(":create_app") else "httptools",
            # The Procfile's flags, log level included (uvicorn's default, info): a logging
            # setting that costs per request must show here as it would in production.
            "--no-access-log",
            "--limit-concurrency",  # the Procfile's default: its cost shows here too
            "1000",
        ]
        self.command = prefix + self.args
        self.env = env
        self.log_path = logdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{PATH}"

    def start(self) -> None:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = 30.0) -> int:
        """Until GET /readyz (or /healthz) answers 200; returns the status seen."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise BenchError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            for path in ("/readyz", "/healthz"):
                try:
                    status, _ = http_request(self.port, "GET", path)
                except OSError as exc:
                    last = exc
                    break
                last = status
                if status == 200:
                    return status
            time.sleep(0.1)
        raise BenchError(f"{self.name} not ready after {timeout_s}s (last: {last!r})")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def http_request(
    port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# CPU accounting: the machine is shared, so every run says how busy it was with other work


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) a process used so far; 0 if it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    # irq/softirq time is left out: on loopback it is mostly the benchmark's own traffic.
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = (values + [0] * 8)[:8]
    return (user + nice + system) / CLK_TCK, steal / CLK_TCK


@dataclass
class Sample:
    t: float
    busy: float
    steal: float
    mine: dict[str, float]


@dataclass
class CpuUse:
    """Cores used, on average over a window."""

    server: float = math.nan
    wrk: float = math.nan
    redis: float = math.nan
    other: float = math.nan  # everything that is not this benchmark
    steal: float = math.nan


class CpuMonitor:
    """Samples /proc every 0.1 s in a thread: the benchmark's own processes and the machine."""

    def __init__(self) -> None:
        self.pids: dict[str, int | None] = {"self": os.getpid()}
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CpuMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> Sample:
        busy, steal = machine_cpu()
        mine = {name: proc_cpu(pid) for name, pid in list(self.pids.items())}
        return Sample(time.monotonic(), busy, steal, mine)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            if len(self.samples) > 20000:
                del self.samples[:10000]
            self._stop.wait(0.1)

    def use(self, start: float, end: float, server: str) -> CpuUse:
        samples = list(self.samples)
        before = [s for s in samples if s.t <= start]
        after = [s for s in samples if s.t >= end]
        if not before or not after:
            return CpuUse()
        a, b = before[-1], after[0]
        span = b.t - a.t
        if span <= 0:
            return CpuUse()
        delta = {k: b.mine.get(k, 0.0) - a.mine.get(k, 0.0) for k in b.mine}
        # A process that exited between the samples (wrk) reads 0 at the end: no negatives.
        delta = {k: max(v, 0.0) for k, v in delta.items()}
        return CpuUse(
            server=delta.get(server, 0.0) / span,
            wrk=delta.get("wrk", 0.0) / span,
            redis=delta.get("redis", 0.0) / span,
            other=max(b.busy - a.busy - sum(delta.values()), 0.0) / span,
            steal=(b.steal - a.steal) / span,
        )

    def other_load(self, seconds: float) -> float:
        """Cores used by processes that are not the benchmark's, over the next `seconds`."""
        a = self.sample()
        time.sleep(seconds)
        b = self.sample()
        mine = sum(max(b.mine.get(k, 0.0) - a.mine.get(k, 0.0), 0.0) for k in b.mine)
        return max(b.busy - a.busy - mine, 0.0) / (b.t - a.t)


# --------------------------------------------------------------------------------------------
# one wrk run


@dataclass
class ThreadStats:
    tid: int
    load_s: float
    slice: int
    sent: int
    responses: int
    ok: int
    non2xx: int
    wraps: int
    parked: int
    t_first: float
    t_last: float
    statuses: dict[int, int]


@dataclass
class RunResult:
    app: str  # "bare" or "receiver"
    round: int
    threads: list[ThreadStats]
    latency_us: dict[str, float]
    errors: dict[str, int]
    check: InboxCheck | None = None
    cpu: CpuUse = field(default_factory=CpuUse)
    redis_stats: dict[str, float] = field(default_factory=dict)
    waited_s: float = 0.0  # for the machine to become quiet before the run

    @property
    def sent(self) -> int:
        return sum(t.sent for t in self.threads)

    @property
    def responses(self) -> int:
        return sum(t.responses for t in self.threads)

    @property
    def ok(self) -> int:
        return sum(t.ok for t in self.threads)

    @property
    def non2xx(self) -> int:
        return sum(t.non2xx for t in self.threads)

    @property
    def wraps(self) -> int:
        return sum(t.wraps for t in self.threads)

    @property
    def socket_errors(self) -> int:
        return sum(v for k, v in self.errors.items() if k != "status")

    @property
    def cut_off(self) -> int:
        """Requests sent but never answered (wrk stopped them, or the connection broke)."""
        return self.sent - self.responses

    @property
    def rate(self) -> float:
        """Answered requests per second, each thread over its own first-request..last-answer."""
        return sum(t.responses / max(t.t_last - t.t_first, 1e-9) for t in self.threads)

    @property
    def statuses(self) -> dict[int, int]:
        total: Counter[int] = Counter()
        for t in self.threads:
            total.update(t.statuses)
        return dict(sorted(total.items()))

    @property
    def cpu_us_per_request(self) -> float:
        """Server CPU time per answered request: robust to other load stealing the core."""
        return self.cpu.server / self.rate * 1e6 if self.rate else math.nan

    def ms(self, key: str) -> float:
        return self.latency_us[key] / 1000.0


def parse_wrk(stdout: str) -> tuple[list[ThreadStats], dict[str, float], dict[str, int]]:
    threads: list[ThreadStats] = []
    latency: dict[str, float] = {}
    errors: dict[str, int] = {}
    for line in stdout.splitlines():
        if not line.startswith("BENCH "):
            continue
        kind, *pairs = line.split()[1:]
        fields = dict(p.split("=", 1) for p in pairs)
        if kind == "summary":
            errors = {
                k: int(float(fields[k])) for k in ("connect", "read", "write", "status", "timeout")
            }
        elif kind == "latency":
            latency = {k: float(v) for k, v in fields.items()}
        elif kind == "thread":
            statuses = {}
            for item in filter(None, fields["statuses"].split(",")):
                code, n = item.split(":")
                statuses[int(code)] = int(n)
            threads.append(
                ThreadStats(
                    tid=int(fields["tid"]),
                    load_s=float(fields["load_s"]),
                    slice=int(fields["slice"]),
                    sent=int(fields["sent"]),
                    responses=int(fields["responses"]),
                    ok=int(fields["ok"]),
                    non2xx=int(fields["non2xx"]),
                    wraps=int(fields["wraps"]),
                    parked=int(fields["parked"]),
                    t_first=float(fields["t_first"]),
                    t_last=float(fields["t_last"]),
                    statuses=statuses,
                )
            )
    if not threads or not latency:
        raise BenchError(f"could not parse wrk's output:\n{stdout}")
    return threads, latency, errors


def run_wrk(
    url: str,
    pf: payloads.PayloadFile,
    args: argparse.Namespace,
    seconds: float,
    pin: Pinning,
    monitor: CpuMonitor,
) -> tuple[list[ThreadStats], dict[str, float], dict[str, int]]:
    env = dict(
        os.environ,
        BENCH_PAYLOADS=str(pf.prefix),
        BENCH_CONNS_PER_THREAD=str(args.connections // args.threads),
        BENCH_SECONDS=str(seconds),
    )
    # wrk's -d is whole seconds and always fully slept; the Lua script stops each thread
    # once `seconds` are over and its last answers are in, so the extra second only idles.
    command = [
        *pin.prefix(pin.client_cpu),
        "wrk",
        "-t",
        str(args.threads),
        "-c",
        str(args.connections),
        "-d",
        f"{math.ceil(seconds) + 1}s",
        "-s",
        str(BENCH_DIR / "post.lua"),
        url,
    ]
    wrk = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    monitor.pids["wrk"] = wrk.pid  # taskset execs wrk: same pid
    try:
        stdout, stderr = wrk.communicate()
    finally:
        monitor.pids.pop("wrk", None)
    if wrk.returncode != 0 or "BENCH summary" not in stdout:
        raise BenchError(
            f"wrk failed ({wrk.returncode}): {shlex.join(command)}\n{stdout}\n{stderr}"
        )
    return parse_wrk(stdout)


# --------------------------------------------------------------------------------------------
# what Redis holds


@dataclass
class InboxCheck:
    expected: int  # 200-answered requests x messages per request
    stored: int  # entries in all inbox lists
    unique: int
    duplicates: int
    missing: int  # ids of sent requests not stored
    unexpected: int  # stored ids that were never sent
    undecodable: int
    deadletter: int
    exact: bool  # every sent request was answered, so stored must equal expected
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        if self.duplicates or self.unexpected or self.undecodable or self.deadletter:
            return False
        if self.exact:
            return self.stored == self.expected and self.missing == 0
        return self.stored >= self.expected  # some requests were cut off by wrk


def inbox_ids(client: redis.Redis) -> tuple[list[str], int, int]:
    ids: list[str] = []
    undecodable = 0
    keys = sorted(client.scan_iter(match=f"{KEY_PREFIX}:*:inbox", count=1000))
    for key in keys:
        length = client.llen(key)
        for start in range(0, length, 10000):
            for raw in client.lrange(key, start, start + 9999):
                try:
                    ids.append(str(orjson.loads(raw)["id"]))
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    undecodable += 1
    return ids, undecodable, len(keys)


def check_inbox(client: redis.Redis, pf: payloads.PayloadFile, run: RunResult) -> InboxCheck:
    m = pf.messages_per_request
    sent_ids: set[str] = set()
    for t in run.threads:
        for k in range(min(t.sent, t.slice)):
            sent_ids.update(pf.message_ids(t.tid * pf.per_thread + k))
    ids, undecodable, _ = inbox_ids(client)
    unique = set(ids)
    deadletter = client.llen(Keys(KEY_PREFIX).deadletter)
    exact = run.cut_off == 0 and run.non2xx == 0
    notes = []
    if run.cut_off:
        notes.append(f"{run.cut_off} request(s) sent but not answered (cut off)")
    if run.non2xx:
        notes.append(f"{run.non2xx} non-2xx answer(s): stored may include some of them")
    return InboxCheck(
        expected=run.ok * m,
        stored=len(ids),
        unique=len(unique),
        duplicates=len(ids) - len(unique),
        missing=len(sent_ids - unique) if exact else 0,
        unexpected=len(unique - sent_ids),
        undecodable=undecodable,
        deadletter=deadletter,
        exact=exact,
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# the benchmark


@dataclass
class Context:
    args: argparse.Namespace
    pin: Pinning
    secret: str
    tmp: Path
    redis: redis.Redis
    bare: Server
    receiver: Server
    monitor: CpuMonitor = field(default_factory=CpuMonitor)
    probes: list[str] = field(default_factory=list)
    payload_count: int = 0
    profile_lines: list[str] = field(default_factory=list)
    regenerations: int = 0


def signed_headers(secret: str, body: bytes) -> dict[str, str]:
    sig = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-Hub-Signature-256": f"sha256={sig}"}


def probe(ctx: Context) -> None:
    """Check, before measuring, that the receiver does the work the numbers are about."""
    m = ctx.args.messages_per_request
    body = payloads.body_for(0, f"probe{secrets.token_hex(4)}", m, int(time.time()))
    headers = signed_headers(ctx.secret, body)
    status, _ = http_request(ctx.bare.port, "POST", PATH, body, headers)
    if status != 200:
        raise BenchError(f"bare app answered {status} to a signed POST")
    ctx.redis.flushall()
    port = ctx.receiver.port
    first, _ = http_request(port, "POST", PATH, body, headers)
    again, _ = http_request(port, "POST", PATH, body, headers)
    bad = dict(headers, **{"X-Hub-Signature-256": "sha256=" + "0" * 64})
    forged_body = body.replace(b'"hola"', b'"HOLA"') if b'"hola"' in body else body + b" "
    forged, _ = http_request(port, "POST", PATH, forged_body, bad)
    ids, _, _ = inbox_ids(ctx.redis)
    ctx.probes = [
        f"signed POST ({m} message(s)) → {first}",
        f"same POST again (redelivery) → {again}",
        f"wrongly signed POST → {forged}",
        f"inbox afterwards: {len(ids)} message(s), expected {m}",
    ]
    problems = []
    if first != 200 or again != 200:
        problems.append("a signed POST was not answered 200")
    if forged not in (401, 403):
        problems.append("a wrongly signed POST was not refused with 401/403")
    if len(ids) != m:
        problems.append("the inbox does not hold exactly the probe's messages once")
    ctx.redis.flushall()
    if problems:
        raise BenchError(
            "receiver probe failed: " + "; ".join(problems) + "\n" + "\n".join(ctx.probes)
        )


def make_payloads(ctx: Context, count: int, tag: str) -> payloads.PayloadFile:
    threads = ctx.args.threads
    per_thread = max(1, math.ceil(count / threads))
    started = time.monotonic()
    pf = payloads.generate(
        ctx.tmp / f"payloads-{tag}",
        per_thread,
        threads,
        ctx.secret,
        ctx.args.messages_per_request,
    )
    say(f"  generated {pf.count} signed bodies ({tag}) in {time.monotonic() - started:.1f}s")
    return pf


def measure(
    ctx: Context, which: str, round_: int, pf: payloads.PayloadFile, seconds: float
) -> RunResult:
    server = ctx.bare if which == "bare" else ctx.receiver
    if which == "receiver":
        ctx.redis.flushall()
    waited = wait_quiet(ctx) if round_ > 0 else 0.0
    before = redis_counters(ctx.redis)
    threads, latency, errors = run_wrk(server.url, pf, ctx.args, seconds, ctx.pin, ctx.monitor)
    run = RunResult(which, round_, threads, latency, errors, waited_s=waited)
    after = redis_counters(ctx.redis)
    if which == "receiver" and run.ok:
        delta = {k: after[k] - before.get(k, 0) for k in after}
        run.redis_stats = {
            "round_trips": delta["total_reads_processed"],
            "requests_per_round_trip": run.ok / max(delta["total_reads_processed"], 1),
            "commands_per_request": delta["total_commands_processed"] / run.ok,
            "redis_us_per_request": delta["cpu_s"] * 1e6 / run.ok,
        }
    start = min(t.t_first for t in threads if t.sent) if any(t.sent for t in threads) else 0.0
    run.cpu = ctx.monitor.use(start, max(t.t_last for t in threads), which)
    if not server.alive():
        raise BenchError(f"{which} died during the run:\n{server.log_tail()}")
    if which == "receiver" and round_ > 0:
        time.sleep(0.2)  # nothing should be in flight; be generous anyway
        run.check = check_inbox(ctx.redis, pf, run)
    return run


def redis_counters(client: redis.Redis) -> dict[str, float]:
    """Read events (≈ round trips), commands and CPU time Redis counted so far."""
    stats = client.info("stats")
    cpu = client.info("cpu")
    return {
        "total_reads_processed": float(stats.get("total_reads_processed", 0)),
        "total_commands_processed": float(stats.get("total_commands_processed", 0)),
        "cpu_s": float(cpu.get("used_cpu_user", 0)) + float(cpu.get("used_cpu_sys", 0)),
    }


def wait_quiet(ctx: Context) -> float:
    """Wait (at most --quiet-wait s) until other processes use < --quiet-cores cores."""
    started = time.monotonic()
    while True:
        other = ctx.monitor.other_load(1.0)
        waited = time.monotonic() - started
        if other < ctx.args.quiet_cores or waited >= ctx.args.quiet_wait:
            if waited > 1.5:
                say(f"  (waited {waited:.0f}s for other load to drop; now {other:.2f} cores)")
            return max(waited - 1.0, 0.0)


def say(text: str) -> None:
    print(text, flush=True)


def describe_run(run: RunResult) -> str:
    line = (
        f"  round {run.round} {run.app:8s} {run.rate:9.0f} req/s  p50 {run.ms('p50'):6.2f} ms  "
        f"p90 {run.ms('p90'):6.2f}  p99 {run.ms('p99'):6.2f}  max {run.ms('max'):6.1f}  "
        f"answered {run.responses}  non-2xx {run.non2xx}  socket errors {run.socket_errors}"
        f"\n           server CPU {run.cpu_us_per_request:.0f} µs/request;"
        f" cores: server {run.cpu.server:.2f}  wrk {run.cpu.wrk:.2f}  redis"
        f" {run.cpu.redis:.2f}  other processes {run.cpu.other:.2f}  steal {run.cpu.steal:.2f}"
    )
    if run.wraps:
        line += f"  WRAPPED x{run.wraps}"
    if run.cut_off:
        line += f"  cut off {run.cut_off}"
    if run.redis_stats:
        st = run.redis_stats
        line += (
            f"\n           redis: {st['requests_per_round_trip']:.1f} requests per round trip,"
            f" {st['commands_per_request']:.2f} Redis commands (incl. inside scripts) and"
            f" {st['redis_us_per_request']:.1f} µs of Redis CPU per request"
        )
    if run.check:
        c = run.check
        line += (
            f"\n           inbox: stored {c.stored} / expected {c.expected}, duplicates "
            f"{c.duplicates}, missing {c.missing}, unexpected {c.unexpected}"
            f" → {'OK' if c.ok else 'FAIL'}"
        )
    return line


def benchmark(ctx: Context) -> list[RunResult]:
    args = ctx.args
    warm = make_payloads(ctx, 20000, "warmup")
    say(f"warm-up: {args.warmup}s each")
    measure(ctx, "bare", 0, warm, args.warmup)
    warm_receiver = measure(ctx, "receiver", 0, warm, args.warmup)
    warm.remove()
    ctx.redis.flushall()
    # Enough distinct bodies for the receiver at twice its warm-up rate (the bare app may wrap
    # around: it keeps nothing, repeats cost it nothing). A receiver run that still wraps is
    # repeated with twice as many.
    expected_rate = max(warm_receiver.rate, 1000.0)
    count = max(20000, math.ceil(expected_rate * (args.duration + 1) * 2))
    pf = make_payloads(ctx, count, "run")
    runs: list[RunResult] = []
    for round_ in range(1, args.rounds + 1):
        for which in ("bare", "receiver"):
            run = measure(ctx, which, round_, pf, args.duration)
            while which == "receiver" and run.wraps and ctx.regenerations < 3:
                say(describe_run(run) + "  (bodies ran out: regenerating, repeating the run)")
                pf.remove()
                ctx.regenerations += 1
                pf = make_payloads(ctx, pf.count * 2, f"run{ctx.regenerations}")
                run = measure(ctx, which, round_, pf, args.duration)
            say(describe_run(run))
            runs.append(run)
    ctx.payload_count = pf.count
    if ctx.args.profile:
        say("profiling one more receiver run with py-spy ...")
        ctx.profile_lines = profile(ctx, pf)
        for line in ctx.profile_lines:
            say(f"  {line}")
    pf.remove()
    return runs


def profile(ctx: Context, pf: payloads.PayloadFile) -> list[str]:
    """One more receiver run with py-spy attached; returns a summary of where the time went."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return ["py-spy is not installed: `.venv/bin/pip install py-spy`"]
    out_dir: Path = ctx.args.profile
    out_dir.mkdir(parents=True, exist_ok=True)
    folded = out_dir / "receiver.folded"
    ctx.redis.flushall()
    wait_quiet(ctx)
    pid = ctx.receiver.process.pid if ctx.receiver.process else 0
    seconds = ctx.args.duration
    spy_cmd = [spy, "record", "--pid", str(pid), "--nonblocking", "--rate", "200"]
    spy_cmd += ["--format", "raw", "-o", str(folded), "--duration", str(math.ceil(seconds) + 2)]
    recorder = subprocess.Popen(spy_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(0.5)
    url = ctx.receiver.url
    threads, latency, errors = run_wrk(url, pf, ctx.args, seconds, ctx.pin, ctx.monitor)
    output = recorder.communicate()[0].decode(errors="replace")
    run = RunResult("receiver", 0, threads, latency, errors)
    if not folded.exists():
        return [f"py-spy failed: {output.strip()[-500:]}"]
    lines = [
        f"receiver under py-spy (200 Hz, non-blocking): {run.rate:,.0f} req/s,"
        f" p99 {run.ms('p99'):.2f} ms; collapsed stacks in {folded}"
        " (flamegraph.pl or speedscope can draw them)",
        "",
        *summarize_folded(folded),
    ]
    (out_dir / "summary.txt").write_text("\n".join(lines) + "\n")
    return lines


def summarize_folded(path: Path, top: int = 25) -> list[str]:
    """Share of samples per function: inclusive (on the stack) and self (at the top)."""
    inclusive: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.rsplit(":", 1)[0] + ")" if f.endswith(")") else f for f in stack.split(";")]
        self_time[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return ["no samples"]
    skip = ("runpy", "click/", "uvicorn/main.py", "uvicorn/server.py", "uvicorn/_compat.py")
    out = [f"{total} samples. Inclusive (share of samples with the function on the stack):"]
    shown = 0
    for frame, n in inclusive.most_common():
        if any(s in frame for s in skip):
            continue
        out.append(f"  {100 * n / total:5.1f}%  {frame}")
        shown += 1
        if shown == top:
            break
    out.append("Self (share of samples at the top of the stack; C code is charged to its caller):")
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_time.most_common(top)]
    return out


# --------------------------------------------------------------------------------------------
# report


@dataclass
class Verdict:
    ratio: float
    ratio_of_medians: float
    bare: dict[str, float]
    receiver: dict[str, float]
    non2xx: int
    socket_errors: int
    wraps: int
    checks_ok: bool
    lost: int
    duplicates: int
    misses: list[str]


def summarize(runs: list[RunResult], args: argparse.Namespace) -> Verdict:
    def med(app: str) -> dict[str, float]:
        rs = [r for r in runs if r.app == app]
        return {
            "rate": statistics.median(r.rate for r in rs),
            **{k: statistics.median(r.ms(k) for r in rs) for k in ("p50", "p90", "p99", "max")},
            "cpu_us": statistics.median(r.cpu_us_per_request for r in rs),
            "other": statistics.median(r.cpu.other for r in rs),
        }

    bare, receiver = med("bare"), med("receiver")
    ratios = []
    for round_ in sorted({r.round for r in runs}):
        b = next(r for r in runs if r.round == round_ and r.app == "bare")
        x = next(r for r in runs if r.round == round_ and r.app == "receiver")
        ratios.append(x.rate / b.rate)
    rec = [r for r in runs if r.app == "receiver"]
    checks = [r.check for r in rec if r.check]
    non2xx = sum(r.non2xx for r in rec)
    socket_errors = sum(r.socket_errors for r in runs)
    wraps = sum(r.wraps for r in rec)
    lost = sum(max(c.expected - c.stored, 0) + c.missing for c in checks)
    duplicates = sum(c.duplicates for c in checks)
    checks_ok = all(c.ok for c in checks) and len(checks) == len(rec)
    ratio = statistics.median(ratios)
    misses = []
    if ratio < args.min_ratio:
        misses.append(f"throughput ratio {ratio:.2f} < {args.min_ratio}")
    if receiver["p99"] > args.max_p99_ms:
        misses.append(f"receiver p99 {receiver['p99']:.2f} ms > {args.max_p99_ms} ms")
    if non2xx:
        misses.append(f"{non2xx} non-2xx answers from the receiver")
    if socket_errors:
        misses.append(f"{socket_errors} socket errors/timeouts")
    if not checks_ok:
        misses.append("the inbox check failed (lost, duplicated or unexpected messages)")
    if wraps:
        misses.append("bodies wrapped around in a receiver run (duplicates): numbers invalid")
    return Verdict(
        ratio=ratio,
        ratio_of_medians=receiver["rate"] / bare["rate"],
        bare=bare,
        receiver=receiver,
        non2xx=non2xx,
        socket_errors=socket_errors,
        wraps=wraps,
        checks_ok=checks_ok,
        lost=lost,
        duplicates=duplicates,
        misses=misses,
    )


def mark(ok: bool) -> str:
    return "✅" if ok else "❌"


def versions() -> str:
    out = []
    for name in ("starlette", "uvicorn", "uvloop", "httptools", "redis", "hiredis", "orjson"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out.append(f"{name} {importlib.metadata.version(name)}")
    return ", ".join(out)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def wrk_version() -> str:
    done = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    first = (done.stdout + done.stderr).splitlines()
    return first[0].split(" Copyright")[0] if first else "wrk"


def report(
    ctx: Context, runs: list[RunResult], v: Verdict, command: str, redis_version: str
) -> str:
    args = ctx.args
    m = args.messages_per_request
    now = dt.datetime.now(dt.UTC).astimezone().strftime("%Y-%m-%d %H:%M %Z")
    rec_runs = [r for r in runs if r.app == "receiver"]
    answered = sum(r.ok for r in rec_runs)
    stored = sum(r.check.stored for r in rec_runs if r.check)
    lines = [
        BEGIN,
        "",
        f"Measured {now} with:",
        "",
        "```",
        command,
        "```",
        "",
        f"- **Machine**: {os.cpu_count()} CPUs (`nproc` {len(os.sched_getaffinity(0))}),"
        f" {cpu_model()}, {platform.system()} {platform.release()};"
        f" Python {platform.python_version()}; Redis {redis_version} (private instance,"
        f" **appendonly off** for the bench); {wrk_version()}.",
        f"- **Software**: {versions()}.",
        f"- **Apps**: `{args.app}` (receiver) and `{BARE_APP}` (scripts/bench/bare_app.py:"
        " reads the body, answers 200), one process each, started as"
        f" `uvicorn {' '.join(ctx.receiver.args[3:])}` and"
        f" `uvicorn {' '.join(ctx.bare.args[3:])}` (ports differ) with the same"
        f" environment (`WHATSAPP_APP_SECRET`, `REDIS_URL`, `KEY_PREFIX={KEY_PREFIX}`)"
        + (f", plus `{' '.join(args.app_env)}` for the receiver." if args.app_env else "."),
        f"- **Pinning**: {ctx.pin.describe()}.",
        f"- **Load**: wrk, {args.threads} thread(s), {args.connections} connections, same Lua"
        " script (scripts/bench/post.lua) for both apps; unique, correctly signed Meta"
        f" payloads with {m} text message(s) each, {len(payloads.TENANTS)} tenants"
        f" x {payloads.PEOPLE_PER_TENANT} people; {ctx.payload_count} distinct bodies per"
        " receiver run, never repeated (wrap-around is detected and fails the run);"
        f" Redis flushed before each receiver run. Warm-up {args.warmup}s per app, then"
        f" {args.rounds} rounds x {args.duration}s, alternating bare / receiver; medians.",
        "",
        f"## Result: {'PASS' if not v.misses else 'FAIL'}",
        "",
        "| | bare Starlette | receiver | target | |",
        "| --- | ---: | ---: | --- | --- |",
        f"| throughput (req/s) | {v.bare['rate']:,.0f} | {v.receiver['rate']:,.0f} |"
        f" ratio ≥ {args.min_ratio} | **{v.ratio:.2f}** {mark(v.ratio >= args.min_ratio)} |",
        f"| server CPU per request (µs) | {v.bare['cpu_us']:.0f} | {v.receiver['cpu_us']:.0f} |"
        f" | bare/receiver {v.bare['cpu_us'] / v.receiver['cpu_us']:.2f} (info) |",
        f"| latency p50 (ms) | {v.bare['p50']:.2f} | {v.receiver['p50']:.2f} | | |",
        f"| latency p90 (ms) | {v.bare['p90']:.2f} | {v.receiver['p90']:.2f} | | |",
        f"| latency p99 (ms) | {v.bare['p99']:.2f} | {v.receiver['p99']:.2f} |"
        f" ≤ {args.max_p99_ms} ms | {mark(v.receiver['p99'] <= args.max_p99_ms)} |",
        f"| non-2xx answers | {sum(r.non2xx for r in runs if r.app == 'bare')} |"
        f" {v.non2xx} | 0 | {mark(v.non2xx == 0)} |",
        f"| socket errors / timeouts | {sum(r.socket_errors for r in runs if r.app == 'bare')}"
        f" | {sum(r.socket_errors for r in rec_runs)} | 0 | {mark(v.socket_errors == 0)} |",
        f"| other processes' load (cores, median) | {v.bare['other']:.2f} |"
        f" {v.receiver['other']:.2f} | | |",
        f"| inbox check (all rounds) | | {stored:,} stored = {answered:,} x {m} answered 200;"
        f" lost {v.lost}, duplicates {v.duplicates} | equal, 0, 0 | {mark(v.checks_ok)} |",
        "",
        f"Throughput ratio = median of the per-round ratios (each round's receiver run next"
        f" to its bare run); the ratio of the medians is {v.ratio_of_medians:.2f}. Latency is"
        " wrk's (corrected for coordinated omission), median over rounds. Throughput counts"
        " answered requests per second; messages per second = that x"
        f" {m}. Server CPU per request = CPU time of the app's process / answered requests:"
        " unlike throughput it hardly depends on what else the shared machine is doing, so"
        " bare/receiver of it is the noise-free estimate of the throughput ratio on a quiet"
        " machine.",
        "",
        "### Rounds",
        "",
        "| round | app | req/s | p50 ms | p90 ms | p99 ms | max ms | sent | 200 | non-2xx"
        " | inbox: stored / expected, dup, missing | cores: server / wrk / redis / other |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in runs:
        check = ""
        if r.check:
            c = r.check
            check = (
                f"{c.stored:,} / {c.expected:,}, {c.duplicates}, {c.missing}"
                f"{'' if c.ok else ' ❌'}{'; ' + '; '.join(c.notes) if c.notes else ''}"
            )
        elif r.wraps:
            check = f"(bodies repeated {r.wraps}x: harmless for the bare app)"
        lines.append(
            f"| {r.round} | {r.app} | {r.rate:,.0f} | {r.ms('p50'):.2f} | {r.ms('p90'):.2f}"
            f" | {r.ms('p99'):.2f} | {r.ms('max'):.1f} | {r.sent:,} | {r.ok:,} | {r.non2xx}"
            f" | {check} | {r.cpu.server:.2f} / {r.cpu.wrk:.2f} / {r.cpu.redis:.2f} /"
            f" {r.cpu.other:.2f} |"
        )
    lines += [
        "",
        "Cores: CPU used during the measured window by the app under test, wrk, Redis, and by"
        ' every other process of the machine ("other": load that is not this benchmark;'
        f" before each run the benchmark waits up to {args.quiet_wait:.0f}s for it to drop"
        f" below {args.quiet_cores} cores).",
    ]
    lines += ["", "### Receiver probe before measuring", ""]
    lines += [f"- {p}" for p in ctx.probes]
    if ctx.profile_lines:
        lines += ["", "### Profile (py-spy)", "", "```", *ctx.profile_lines, "```"]
    if v.misses:
        lines += ["", "### Missed", ""] + [f"- {miss}" for miss in v.misses]
    lines += ["", END]
    return "\n".join(lines)


def write_doc(path: Path, block: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        text = path.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            tail = rest.split(END, 1)[1]
            path.write_text(head + block + tail)
            return
    path.write_text(
        "# Receiver benchmark\n\n"
        "Regenerate with `scripts/bench_receiver` (see `--help`); the block between the"
        " markers is rewritten by each run, the rest of this file is kept.\n\n" + block + "\n"
    )


# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench_receiver",
        description=(
            "Benchmark the webhook receiver against a bare Starlette app with wrk: unique,"
            " signed payloads, alternating rounds, medians, and a check that Redis holds"
            " exactly the messages that were answered 200. Exits 1 if a target is missed,"
            " 2 if the benchmark could not run."
        ),
    )
    p.add_argument("--duration", type=float, default=10, help="seconds per measured run")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="bare+receiver pairs (median)")
    p.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    p.add_argument("--messages-per-request", type=int, default=1)
    p.add_argument("--warmup", type=float, default=3, help="seconds of warm-up per app")
    p.add_argument(
        "--app",
        default="receiver.app:create_app",
        help="the app under test (module:create_app runs as a factory)",
    )
    p.add_argument(
        "--app-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the app under test only (repeatable)",
    )
    p.add_argument("--min-ratio", type=float, default=0.8, help="target: receiver/bare")
    p.add_argument("--max-p99-ms", type=float, default=5.0, help="target: receiver p99")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60,
        help="before each run, wait up to this many seconds for other load to drop",
    )
    p.add_argument(
        "--quiet-cores",
        type=float,
        default=0.3,
        help="'quiet' = other processes use fewer cores than this",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="after the rounds, profile one more receiver run with py-spy into DIR",
    )
    p.add_argument("--output", type=Path, default=DOC, help="markdown file to update")
    p.add_argument("--no-write", action="store_true", help="print only, do not write --output")
    args = p.parse_args(argv)
    if args.connections < 1 or args.threads < 1 or args.connections % args.threads:
        p.error("--connections must be a positive multiple of --threads")
    if any("=" not in item for item in args.app_env):
        p.error("--app-env takes NAME=VALUE")
    if args.rounds < 1 or args.duration <= 0 or args.messages_per_request < 1:
        p.error("--rounds, --duration and --messages-per-request must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["scripts/bench_receiver", *(sys.argv[1:] if argv is None else argv)])
    if not shutil.which("wrk"):
        say("wrk is not installed. Install it with `apt-get install wrk` (Debian/Ubuntu) or")
        say("`brew install wrk` (macOS), or build it from https://github.com/wg/wrk.")
        return EXIT_BROKEN
    pin = Pinning.choose(not args.no_pin)
    secret = "bench-" + secrets.token_hex(16)
    tmp = Path(tempfile.mkdtemp(prefix="bench-receiver-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "WHATSAPP_", "KEY_"))}
    pythonpath = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(PYTHONPATH=os.pathsep.join(pythonpath), WHATSAPP_APP_SECRET=secret)
    env.update(WHATSAPP_VERIFY_TOKEN="bench-verify", KEY_PREFIX=KEY_PREFIX)
    module = args.app.split(":", 1)[0]
    importable = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env, capture_output=True
    )
    if importable.returncode != 0:
        say(f"cannot import {module}: {importable.stderr.decode(errors='replace')[-2000:]}")
        return EXIT_BROKEN

    say(f"pinning: {pin.describe()}")
    redis_server = PinnedRedis(pin.prefix(pin.client_cpu))
    servers: list[Server] = []
    monitor = CpuMonitor()
    try:
        redis_server.start()
        monitor.pids["redis"] = redis_server.process.pid if redis_server.process else None
        client = redis.Redis.from_url(redis_server.url)
        redis_version = str(client.info("server")["redis_version"])
        say(f"redis {redis_version} on port {redis_server.port} (appendonly off for the bench)")
        env["REDIS_URL"] = redis_server.url
        env["REDIS_CLUSTER"] = "false"
        bare = Server("bare", BARE_APP, env, pin.prefix(pin.server_cpu), tmp)
        app_env = dict(env, **dict(item.split("=", 1) for item in args.app_env))
        receiver = Server("receiver", args.app, app_env, pin.prefix(pin.server_cpu), tmp)
        servers = [bare, receiver]
        for s in servers:
            s.start()
            monitor.pids[s.name] = s.process.pid if s.process else None
        monitor.start()
        for s in servers:
            s.wait_ready()
            say(f"{s.name}: {shlex.join(s.command)}")
        ctx = Context(args, pin, secret, tmp, client, bare, receiver, monitor)
        probe(ctx)
        for line in ctx.probes:
            say(f"  probe: {line}")
        runs = benchmark(ctx)
        verdict = summarize(runs, args)
        block = report(ctx, runs, verdict, command, redis_version)
    except BenchError as exc:
        say(f"benchmark failed: {exc}")
        for s in servers:
            if s.log_tail():
                say(f"--- {s.name} log (tail) ---\n{s.log_tail()}")
        return EXIT_BROKEN
    finally:
        if monitor._thread.is_alive():
            monitor.stop()
        for s in servers:
            s.stop()
        redis_server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    say("")
    say(block)
    if not args.no_write:
        write_doc(args.output, block)
        say(f"\nwritten to {args.output}")
    if verdict.misses:
        say("\nMISSED: " + "; ".join(verdict.misses))
        return EXIT_MISSED
    say("\nall targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
