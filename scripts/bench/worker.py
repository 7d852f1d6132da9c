"""Worker benchmarks: dispatch lag, throughput, a slow brain, Redis memory.

    scripts/bench_worker                     # everything, 3 runs each
    scripts/bench_worker --only dispatch --repeat 2
    scripts/bench_worker --write             # also update docs/benchmarks/worker.md
    scripts/bench_worker --at HEAD~3         # the product code of another revision
    scripts/bench_worker --only throughput --anchors all   # + BullMQ, arq, SAQ in the same run

Scenarios (--only, comma-separated):
    dispatch    1 000 conversations coming due within 1 s (messages fed live over 1 s to a
                running worker, window 2 s, WORKER_CONCURRENCY=200); lag = turn start - due_ms
    throughput  N one-message conversations all due at the same instant, zero-latency brain and
                sender, WORKER_CONCURRENCY=200; 1 worker process, then 2; plus the baseline
                (N LPUSH/RPOP pairs, one asyncio redis-py client, pipelines of 200); with
                --anchors, BullMQ / arq / SAQ on the same terms (scripts/bench/anchors.py)
    slow        brain that takes 1 s, WORKER_CONCURRENCY=200: capacity (2 000 conversations due
                at once) and a steady feed below capacity (lag p50/p99 per 5 s slice)
    memory      10 000 waiting conversations of 3 messages; 100 000 dedupe markers
                (a soak and the steady state: scripts/bench/memory_soak.py)

Every run uses a private Redis server (scripts.dev.redis_server.RedisServer: appendonly off, no
RDB saves) and real `python -m worker` subprocesses; the brain and sender come from
scripts/bench/worker_probe.py. Turn start (the brain's time.time()) minus the batch's due_ms
(Redis TIME) is the dispatch lag: same machine, same clock.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.bench import anchors, revision
from scripts.bench.worker_load import (
    Bench,
    Workers,
    cleanup,
    make_event,
    median,
    percentile,
    person_id,
    redis_lpush_rpop_baseline,
)
from scripts.dev.redis_server import RedisServer, find_server_binary
from shared.events import encode

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "benchmarks" / "worker.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
CONCURRENCY = 200  # WORKER_CONCURRENCY of the throughput runs, and the anchors' concurrency
Metrics = dict[str, float]


# --- scenarios ------------------------------------------------------------------------------
async def dispatch(args: argparse.Namespace) -> Metrics:
    """1 000 conversations fed over 1 s to a running worker; each due `window` after intake."""
    n, window_s = args.dispatch_n, 2.0
    with RedisServer() as server:
        async with Bench(server.url) as b:
            workers = Workers(
                server.url,
                env={
                    "DEBOUNCE_WINDOW_S": str(window_s),
                    "MAX_WAIT_S": "10",
                    "WORKER_CONCURRENCY": "200",
                    "BENCH_E2E": "1",
                },
                profile=args.profile and f"{args.profile}-dispatch.txt",
            ).start()
            try:
                await b.wait_listening(1)
                await asyncio.sleep(0.5)  # let the worker settle (first sweep done)
                t0 = time.perf_counter()
                for i in range(n):
                    delay = t0 + i / n - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await b.ingest_live(make_event(person_id(i), 0))  # one webhook each
                feed_s = time.perf_counter() - t0
                await b.wait_turns(n, timeout_s=60)
            finally:
                workers.stop()
            rows = workers.rows()
    assert len(rows) == n, (len(rows), n)
    lag = [start - due for start, due, *_ in rows]
    claim = [claimed - due for _, due, claimed, *_ in rows]
    # Intake delay: how much later than "received + window" the conversation became due.
    intake = [due - (recv + window_s * 1000) for _, due, _, recv, _ in rows]
    dues = [due for _, due, *_ in rows]
    return {
        "feed_s": feed_s,
        "due_spread_ms": max(dues) - min(dues),
        "lag_p50": percentile(lag, 50),
        "lag_p99": percentile(lag, 99),
        "lag_max": max(lag),
        "claim_p99": percentile(claim, 99),
        "intake_p50": percentile(intake, 50),
        "intake_p99": percentile(intake, 99),
        "intake_max": max(intake),
    }


async def _all_due_at_once(
    url: str,
    n: int,
    procs: int,
    env: dict[str, str],
    profile: str = "",
    lead_s: float = 4.0,
) -> tuple[float, Workers, float, Metrics]:
    """Pre-load n one-message conversations, take them in with one claim.lua call so all are
    due at the same ms (`lead_s` later), start `procs` workers meanwhile; return (due wall ms,
    workers, end wall ms when stats.turns reached n)."""
    async with Bench(url) as b:
        await b.ingest_bulk([make_event(person_id(i), 0) for i in range(n)])
        due_ms = await b.intake(int(lead_s * 1000), int(lead_s * 1000) * 2) + lead_s * 1000
        workers = Workers(
            url,
            count=procs,
            env={"DEBOUNCE_WINDOW_S": str(lead_s), "MAX_WAIT_S": str(lead_s * 2), **env},
            profile=profile,
        ).start()
        try:
            await b.wait_listening(procs)
            await asyncio.sleep(max(0.0, (due_ms - time.time() * 1000) / 1000 - 0.3))
            if time.time() * 1000 >= due_ms:
                raise RuntimeError("workers were not up before the conversations came due")
            cpu0 = (workers.cpu_seconds(), await b.redis_cpu_seconds(), time.time() * 1000)
            end_ms = await b.wait_turns(n, timeout_s=300)
            wall_s = (time.time() * 1000 - cpu0[2]) / 1000
            worker_s = workers.cpu_seconds() - cpu0[0]
            redis_s = await b.redis_cpu_seconds() - cpu0[1]
            cpu = {
                "worker_cpu": worker_s / wall_s,
                "redis_cpu": redis_s / wall_s,
                "worker_us": worker_s / n * 1e6,
                "redis_us": redis_s / n * 1e6,
            }
        finally:
            workers.stop()
    return due_ms, workers, end_ms, cpu


async def throughput_one(args: argparse.Namespace, procs: int, tag: str) -> Metrics:
    n = args.n
    with RedisServer() as server:
        due_ms, workers, end_ms, cpu = await _all_due_at_once(
            server.url,
            n,
            procs,
            {"WORKER_CONCURRENCY": str(CONCURRENCY)},
            profile=args.profile and f"{args.profile}-{tag}.txt",
        )
        rows = workers.rows()
    assert len(rows) == n, (len(rows), n)
    starts = [r[0] for r in rows]
    return {
        "turns_s": n / ((end_ms - due_ms) / 1000),
        "first_start_ms": min(starts) - due_ms,
        "split": min(workers.rows_by_process()) / n if procs > 1 else 1.0,
        **cpu,
    }


async def baseline(args: argparse.Namespace) -> Metrics:
    with RedisServer() as server:
        return {"pairs_s": await redis_lpush_rpop_baseline(server.url, args.n)}


def anchor_scenario(anchor: anchors.Anchor) -> Callable[[argparse.Namespace], Any]:
    """The throughput scenario's terms for another library: N one-message jobs enqueued up
    front, a no-op handler, one process at CONCURRENCY, its own private Redis."""

    async def run(args: argparse.Namespace) -> Metrics:
        payload = len(encode(make_event(person_id(0), 0)))  # one message, as a turn has
        with RedisServer() as server:
            try:
                return await asyncio.to_thread(
                    anchor.run, server.url, args.n, CONCURRENCY, payload, args.anchor_retention
                )
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"anchor {anchor.label} failed: {exc}", file=sys.stderr, flush=True)
                return {}

    return run


async def slow_capacity(args: argparse.Namespace) -> Metrics:
    n = args.slow_n
    with RedisServer() as server:
        due_ms, workers, end_ms, _ = await _all_due_at_once(
            server.url,
            n,
            1,
            {"WORKER_CONCURRENCY": "200", "BENCH_BRAIN_S": "1"},
            profile=args.profile and f"{args.profile}-slow.txt",
        )
        rows = workers.rows()
    assert len(rows) == n
    return {"turns_s": n / ((end_ms - due_ms) / 1000)}


async def slow_steady(args: argparse.Namespace) -> Metrics:
    """Feed `rate` conversations/s for `duration` s to a worker whose brain takes 1 s."""
    rate, duration, window_s = args.rate, args.duration, 1.0
    n = int(rate * duration)
    with RedisServer() as server:
        async with Bench(server.url) as b:
            workers = Workers(
                server.url,
                env={
                    "DEBOUNCE_WINDOW_S": str(window_s),
                    "MAX_WAIT_S": "10",
                    "WORKER_CONCURRENCY": "200",
                    "BENCH_BRAIN_S": "1",
                },
            ).start()
            try:
                await b.wait_listening(1)
                await asyncio.sleep(0.5)
                t0 = time.perf_counter()
                for i in range(n):
                    delay = t0 + i / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await b.ingest_live(make_event(person_id(i), 0))  # one webhook each
                await b.wait_turns(n, timeout_s=60)
            finally:
                workers.stop()
            rows = workers.rows()
    assert len(rows) == n
    rows.sort(key=lambda r: r[1])
    first_due = rows[0][1]
    out: Metrics = {}
    slices = int(duration // 5)
    for k in range(slices):
        lags = [
            s - d for s, d, *_ in rows if first_due + k * 5000 <= d < first_due + (k + 1) * 5000
        ]
        out[f"p50_{k}"] = percentile(lags, 50)
        out[f"p99_{k}"] = percentile(lags, 99)
    lag = [s - d for s, d, *_ in rows]
    starts = sorted(r[0] for r in rows)
    out["lag_p50"] = percentile(lag, 50)
    out["lag_p99"] = percentile(lag, 99)
    out["lag_max"] = max(lag)
    out["starts_s"] = (n - 1) / ((starts[-1] - starts[0]) / 1000)
    return out


async def memory(args: argparse.Namespace) -> Metrics:
    people, per = args.mem_people, 3
    out: Metrics = {}
    sample = [person_id(i) for i in range(0, people, max(1, people // 100))]
    # (a) conversations waiting for their window: 3 messages each, window 300 s.
    with RedisServer() as server:
        async with Bench(server.url) as b:
            r, tk = b.redis, b.tk
            before = await used_memory(r)
            events = [make_event(person_id(i), m) for m in range(per) for i in range(people)]
            await b.ingest_bulk(events)
            await b.intake(300_000, 600_000)
            after = await used_memory(r)
            assert await r.zcard(tk.due) == people and await r.llen(tk.inbox) == 0
            out["conv_delta_B"] = (after - before) / people
            for kind, size in (await b.key_sizes(sample)).items():
                out[f"key:{kind}"] = size
            # Dedupe markers: a key each (releases before the books) or the tenant's book.
            out["seen_B"] = await _usage(r, [f"{tk.base}:seen:*", f"{tk.base}:s:*"]) / len(events)
            out["due_B"] = await r.memory_usage(tk.due, samples=0) / people
            # One hash (the releases before) or its shards (shared/lua/lib/burst.lua).
            out["burst_B"] = await _usage(r, [tk.burst, f"{tk.burst}:*"]) / people
            out["event_B"] = sum(len(encode(e)) for e in events[:300]) / 300
    # (b) what an answered one-message conversation leaves behind (zero-latency brain, a
    #     sender that returns a provider id as WhatsApp does), its dedupe marker included.
    empty = await _empty_used_memory()
    with RedisServer() as server:
        await _all_due_at_once(server.url, people, 1, {"WORKER_CONCURRENCY": "200"}, lead_s=3.0)
        async with Bench(server.url) as b:
            r = b.redis
            out["answered_B"] = (await used_memory(r) - empty) / people
            out["answered_keys"] = await r.dbsize() / people
            for kind, size in (await b.key_sizes(sample)).items():
                out[f"after:{kind}"] = size
            # Outbound records: a hash each (`out:`) or the tenant's book (`o:`).
            patterns = [f"{b.tk.base}:out:*", f"{b.tk.base}:o:*"]
            out["after:outbound record"] = await _usage(r, patterns) / people
    # (c) 100 000 dedupe markers alone.
    with RedisServer() as server:
        async with Bench(server.url) as b:
            r = b.redis
            before = await used_memory(r)
            n = args.dedupe_n
            await b.ingest_bulk([make_event(person_id(i), 0) for i in range(n)])
            await r.delete(b.tk.inbox)  # keep only the dedupe markers
            after = await used_memory(r)
            out["dedupe_used_MB"] = after / 2**20
            out["dedupe_delta_MB"] = (after - before) / 2**20
            out["dedupe_per_key_B"] = (after - before) / n
    return out


async def _usage(redis: Any, patterns: list[str]) -> int:
    """MEMORY USAGE of every key matching one of `patterns` (SCAN), summed."""
    total = 0
    for pattern in patterns:
        async for key in redis.scan_iter(match=pattern, count=1000):
            total += int(await redis.memory_usage(key, samples=0) or 0)
    return total


async def _empty_used_memory() -> int:
    """used_memory of a fresh server with the scripts loaded."""
    with RedisServer() as server:
        async with Bench(server.url) as b:
            return await used_memory(b.redis)


async def used_memory(redis: Any) -> int:
    await asyncio.sleep(0.05)
    return int((await redis.info("memory"))["used_memory"])


# --- running and reporting ------------------------------------------------------------------
SCENARIOS = ["dispatch", "throughput", "slow", "memory"]


def wanted_scenarios(args: argparse.Namespace) -> list[str]:
    wanted: list[str] = args.only.split(",") if args.only else SCENARIOS
    unknown = set(wanted) - set(SCENARIOS)
    if unknown:
        sys.exit(f"unknown scenario(s) {sorted(unknown)}; choose from {SCENARIOS}")
    if args.anchors and "throughput" not in wanted:
        sys.exit("--anchors runs within the throughput scenario: add it to --only")
    return wanted


def run_all(args: argparse.Namespace, ready: dict[str, anchors.Anchor]) -> dict[str, list[Metrics]]:
    wanted = wanted_scenarios(args)
    plan: list[tuple[str, Callable[[argparse.Namespace], Any]]] = []
    if "dispatch" in wanted:
        plan.append(("dispatch", dispatch))
    if "throughput" in wanted:
        plan += [
            ("baseline", baseline),
            ("throughput_1", lambda a: throughput_one(a, 1, "tp1")),
            ("throughput_2", lambda a: throughput_one(a, 2, "tp2")),
        ]
        plan += [(f"anchor_{name}", anchor_scenario(anchor)) for name, anchor in ready.items()]
    if "slow" in wanted:
        plan += [("slow_capacity", slow_capacity), ("slow_steady", slow_steady)]
    if "memory" in wanted:
        plan.append(("memory", memory))
    results: dict[str, list[Metrics]] = {name: [] for name, _ in plan}
    for rep in range(args.repeat):
        for name, fn in plan:  # interleaved, so the baseline sees the same machine noise
            started = time.perf_counter()
            metrics = asyncio.run(fn(args))
            took = time.perf_counter() - started
            shown = ", ".join(f"{k}={v:.1f}" for k, v in metrics.items())
            print(f"run {rep + 1}/{args.repeat} {name} ({took:.0f}s): {shown}", flush=True)
            results[name].append(metrics)
    return results


# Report rows: "scenario metric | label | unit | target". A metric ending in * expands to every
# result key with that prefix; a target is "<= x" or ">= x", checked against the median.
ROWS = """
dispatch lag_p50 | 1. dispatch lag p50 (1 000 due within 1 s) | ms |
dispatch lag_p99 | 1. dispatch lag p99 | ms | <= 50
dispatch lag_max | 1. dispatch lag max | ms |
dispatch claim_p99 | 1. due → claimed (Redis clock) p99 | ms |
dispatch due_spread_ms | 1. spread of the 1 000 due times | ms |
dispatch intake_p99 | 1. intake delay p99 (due − received − window) | ms |
baseline pairs_s | 2. baseline: LPUSH/RPOP pairs/s, 1 client, pipelines of 200 | /s |
throughput_1 turns_s | 2. throughput, 1 process | turns/s | >= 5000
throughput_1 ratio | 2. … ÷ baseline | × |
throughput_1 first_start_ms | 2. due → first turn start, 1 process | ms |
throughput_1 worker_cpu | 2. CPU used by the worker process | cores |
throughput_1 redis_cpu | 2. CPU used by Redis | cores |
throughput_1 worker_us | 2. worker CPU per turn | µs |
throughput_1 redis_us | 2. Redis CPU per turn | µs |
throughput_2 turns_s | 2. throughput, 2 processes | turns/s |
throughput_2 ratio | 2. … ÷ baseline | × |
throughput_2 split | 2. share of turns done by the less busy process | |
throughput_2 worker_cpu | 2. CPU used by the 2 worker processes | cores |
throughput_2 redis_cpu | 2. CPU used by Redis, 2 processes | cores |
throughput_2 worker_us | 2. worker CPU per turn, 2 processes | µs |
throughput_2 redis_us | 2. Redis CPU per turn, 2 processes | µs |
anchor_bullmq jobs_s | 2. anchor: BullMQ, 1 process, no-op jobs | jobs/s |
anchor_bullmq ratio | 2. throughput, 1 process ÷ BullMQ | × |
anchor_bullmq worker_us | 2. BullMQ: worker CPU per job | µs |
anchor_bullmq redis_us | 2. BullMQ: Redis CPU per job | µs |
anchor_bullmq cost_ratio | 2. CPU per turn (worker + Redis) ÷ BullMQ's per job | × |
anchor_arq jobs_s | 2. anchor: arq, 1 process, no-op jobs | jobs/s |
anchor_arq ratio | 2. throughput, 1 process ÷ arq | × |
anchor_arq worker_us | 2. arq: worker CPU per job | µs |
anchor_arq redis_us | 2. arq: Redis CPU per job | µs |
anchor_arq cost_ratio | 2. CPU per turn (worker + Redis) ÷ arq's per job | × |
anchor_saq jobs_s | 2. anchor: SAQ, 1 process, no-op jobs | jobs/s |
anchor_saq ratio | 2. throughput, 1 process ÷ SAQ | × |
anchor_saq worker_us | 2. SAQ: worker CPU per job | µs |
anchor_saq redis_us | 2. SAQ: Redis CPU per job | µs |
anchor_saq cost_ratio | 2. CPU per turn (worker + Redis) ÷ SAQ's per job | × |
slow_capacity turns_s | 3. 1 s brain, 2 000 due at once: turns/s | turns/s | >= 150
slow_steady starts_s | 3. 1 s brain, steady feed: turns/s | turns/s |
slow_steady lag_p50 | 3. steady feed: dispatch lag p50 (whole run) | ms |
slow_steady lag_p99 | 3. steady feed: dispatch lag p99 (whole run) | ms |
slow_steady lag_max | 3. steady feed: dispatch lag max | ms |
memory conv_delta_B | 4. used_memory per waiting conversation (3 msgs + 3 dedupe markers) | B |
memory key:* | 4. MEMORY USAGE per-person key | B |
memory seen_B | 4. MEMORY USAGE of the dedupe markers, per message | B |
memory due_B | 4. due ZSET share per conversation | B |
memory burst_B | 4. burst HASH share per conversation | B |
memory event_B | 4. encoded event size | B |
memory answered_B | 4. used_memory per answered 1-message conversation | B |
memory answered_keys | 4. keys left per answered conversation | |
memory after:* | 4. MEMORY USAGE after the turn | B |
memory dedupe_used_MB | 4. used_memory with 100 000 dedupe markers (total) | MiB |
memory dedupe_delta_MB | 4. … of which the 100 000 markers | MiB |
memory dedupe_per_key_B | 4. … per dedupe marker | B |
"""


def report_rows() -> list[tuple[str, str, str, str, str]]:
    rows = []
    for line in ROWS.strip().splitlines():
        head, label, unit, target = (x.strip() for x in line.split("|"))
        scenario, metric = head.split()
        rows.append((scenario, metric, label, unit, target))
    return rows


def meets(value: float, target: str) -> bool:
    op, limit = target.split()
    return value <= float(limit) if op == "<=" else value >= float(limit)


def add_ratios(results: dict[str, list[Metrics]]) -> None:
    base = results.get("baseline")
    for name in ("throughput_1", "throughput_2"):
        if base and name in results:
            for run, b in zip(results[name], base, strict=False):
                run["ratio"] = run["turns_s"] / b["pairs_s"]
    # The project's 1-process run against each anchor's run of the same round.
    project = results.get("throughput_1", [])
    for name in anchors.NAMES:
        for run, p in zip(results.get(f"anchor_{name}", []), project, strict=False):
            if "jobs_s" in run:
                run["ratio"] = p["turns_s"] / run["jobs_s"]
                cost = run["worker_us"] + run["redis_us"]
                run["cost_ratio"] = (p["worker_us"] + p["redis_us"]) / cost


def fmt(v: float) -> str:
    if v != v:  # nan
        return "–"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(results: dict[str, list[Metrics]]) -> str:
    lines = [
        "| measurement | runs | median | unit | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    expanded = []
    for scenario, metric, label, unit, target in report_rows():
        if not metric.endswith("*"):
            expanded.append((scenario, metric, label, unit, target))
            continue
        runs = results.get(scenario, [])
        for key in sorted({k for r in runs for k in r if k.startswith(metric[:-1])}):
            expanded.append((scenario, key, f"{label} `{key.split(':', 1)[1]}`", unit, target))
    for scenario, metric, label, unit, target in expanded:
        values = [r[metric] for r in results.get(scenario, []) if metric in r]
        if not values:
            continue
        m = median(values)
        verdict = f"{target}: " + ("met" if meets(m, target) else "**missed**") if target else ""
        shown = " / ".join(fmt(v) for v in values)
        lines.append(f"| {label} | {shown} | {fmt(m)} | {unit} | {verdict} |")
    steady = results.get("slow_steady", [])
    if steady:
        slices = sorted({int(k.split("_")[1]) for k in steady[0] if re.fullmatch(r"p\d+_\d+", k)})
        lines += [
            "",
            "Steady feed, dispatch lag per 5 s slice of due times (median of runs, ms):",
            "",
            "| slice | " + " | ".join(f"{5 * k}–{5 * k + 5} s" for k in slices) + " |",
            "| --- |" + " --- |" * len(slices),
        ]
        for p in ("p50", "p99"):
            cells = [fmt(median([r[f"{p}_{k}"] for r in steady])) for k in slices]
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment(args: argparse.Namespace, code: str) -> str:
    binary = find_server_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    cmd = shlex.join(["scripts/bench_worker", *sys.argv[1:]])
    return "\n".join(
        [
            f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
            f"- machine: nproc={os.cpu_count()} ({cpu}), "
            f"load average at start {', '.join(f'{x:.2f}' for x in load)}",
            f"- code: {code}",
            f"- python {platform.python_version()} ({sys.executable}), uvloop in the worker",
            f"- redis: {version} (`{binary}`), "
            "private server per run, appendonly off, no RDB saves",
            f"- command: `{cmd}` ({args.repeat} runs of each, interleaved; median reported)",
            f"- sizes: dispatch {args.dispatch_n} conversations, throughput N={args.n}, "
            f"1 s brain {args.slow_n} at once and {args.rate}/s for {args.duration} s, memory "
            f"{args.mem_people} conversations × 3 messages and {args.dedupe_n} dedupe markers",
        ]
    )


def anchors_environment(args: argparse.Namespace, ready: dict[str, anchors.Anchor]) -> str:
    if not ready:
        return ""
    shown = "; ".join(anchor.describe() for anchor in ready.values())
    payload = len(encode(make_event(person_id(0), 0)))
    return (
        f"\n- anchors: {shown}; one process each, concurrency {CONCURRENCY}, N={args.n} jobs "
        f"of a {payload}-byte message, completed-job retention {args.anchor_retention}"
    )


def write_doc(text: str) -> None:
    DOC.parent.mkdir(parents=True, exist_ok=True)
    if DOC.exists() and START in DOC.read_text():
        old = DOC.read_text()
        head, rest = old.split(START, 1)
        tail = rest.split(END, 1)[1] if END in rest else ""
        DOC.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    else:
        DOC.write_text(f"# Worker benchmarks\n\n{START}\n{text}\n{END}\n")
    print(f"wrote {DOC.relative_to(REPO)}")


def main() -> int:
    p = argparse.ArgumentParser(
        prog="scripts/bench_worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--only", default="", help=f"comma-separated subset of {SCENARIOS}")
    p.add_argument("--repeat", type=int, default=3, help="runs of each scenario (median reported)")
    p.add_argument("--n", type=int, default=30_000, help="conversations for the throughput runs")
    p.add_argument("--dispatch-n", type=int, default=1000)
    p.add_argument("--slow-n", type=int, default=2000)
    p.add_argument("--rate", type=float, default=180.0, help="steady feed rate for the 1 s brain")
    p.add_argument("--duration", type=float, default=20.0, help="steady feed duration (s)")
    p.add_argument("--mem-people", type=int, default=10_000)
    p.add_argument("--dedupe-n", type=int, default=100_000)
    p.add_argument("--profile", default="", help="py-spy the first worker: PREFIX-<scenario>.txt")
    p.add_argument("--at", default="", help="benchmark this git revision (default: working tree)")
    p.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(REPO)}")
    p.add_argument(
        "--anchors",
        default="",
        help=f"with throughput: also run these libraries ({','.join(anchors.NAMES)} or all), "
        "fetched on first use into ~/.cache/wa-inbox-bench/ (scripts/bench/anchors.py)",
    )
    p.add_argument(
        "--anchor-retention",
        choices=("off", "default"),
        default="off",
        help="the anchors' completed-job retention: off (default) or each library's default",
    )
    p.add_argument(
        "--variants",
        default="",
        help="patch candidate optimisations into the workers (scripts/bench/worker_variants.py)",
    )
    args = p.parse_args()
    if args.at and not revision.exported():
        # The harness reads and writes Redis with the revision's own events, keys and scripts:
        # the whole benchmark runs in a child on that code.
        code, description = revision.export(args.at)
        try:
            return revision.run_on(code, description, "scripts.bench.worker", sys.argv[1:])
        finally:
            shutil.rmtree(code, ignore_errors=True)
    if args.variants:
        os.environ["BENCH_VARIANTS"] = args.variants
    env = environment(args, revision.describe())
    wanted_scenarios(args)  # fail fast, before any fetch
    ready = anchors.prepare(anchors.parse_names(args.anchors)) if args.anchors else {}
    try:
        results = run_all(args, ready)
    except BaseException:
        print("worker logs kept in /tmp/bench-worker-*", file=sys.stderr)
        raise
    cleanup()
    if hasattr(os, "getloadavg"):
        env += f"\n- load average at end {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    env += anchors_environment(args, ready)
    add_ratios(results)
    text = f"{env}\n\n{table(results)}"
    print()
    print(text)
    if args.write:
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
