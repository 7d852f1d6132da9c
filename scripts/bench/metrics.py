"""The /metrics benchmark (run it as `scripts/bench_metrics --help`).

One run: a private Redis holding `--tenants` registered tenants, each with a stats hash as a
busy fleet leaves it (counters, the dispatch lag, AI call and send histograms, tokens); the
receiver as the Procfile runs it (uvicorn, `receiver.app:create_app --factory`, uvloop,
httptools, no access log); signed webhooks at a steady `--rate`, each to a random tenant, for
`--baseline-s` without scrapes (the baseline) and then `--scrape-s` while `--scrapers` scrapers
fetch `/metrics` back to back, each after a `--pause-s` pause. A webhook's latency runs from
its scheduled send time (no coordinated omission). Targets: every scrape within 1 s, the
webhooks' p99 during scrapes within 50 ms. The fleet figures of one scrape are checked
against what was written. Exit 0 when both targets hold, 1 when one is missed, 2 when the
benchmark could not run. `--write` puts the result into docs/benchmarks/metrics.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import redis
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from receiver.http_protocol import UVICORN_HTTP
from scripts.dev.redis_server import RedisServer, free_port
from scripts.webhooks import inbound_webhook, meta_headers, text_message
from shared.fleet import turn_figures
from shared.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks" / "metrics.md"
BEGIN, END = "<!-- bench_metrics:begin -->", "<!-- bench_metrics:end -->"
PREFIX = "bench"
SECRET = "bench-secret"
TOKEN = "bench-metrics-token"
SCRAPE_MAX_S, WEBHOOK_P99_MAX_S = 1.0, 0.050
EXIT_MISSED, EXIT_BROKEN = 1, 2
# What a busy tenant's stats hash holds besides its messages (about 40 fields).
STATS = {
    "batches": 40,
    "turns": 40,
    "replies": 38,
    "parts_out": 41,
    "parts_delivered": 40,
    "parts_read": 35,
    "status:sent": 41,
    "status:delivered": 40,
    "status:read": 35,
    "review:too_old": 1,
    **{f"lag_le:{ms}": 10 for ms in (5, 10, 25, 50, 100)},
    "lag_sum_ms": 1500,
    "lag_count": 50,
    **turn_figures.increments(
        [700, 900, 1200, 1500, 2100, 3000, 5000],
        [80, 120, 200, 300, 600],
        {
            "input_tokens": 9000,
            "output_tokens": 3000,
            "cache_read_input_tokens": 60000,
            "cache_creation_input_tokens": 4000,
        },
    ),
}


class BenchError(RuntimeError):
    pass


def say(text: str) -> None:
    print(f"[bench_metrics] {text}", flush=True)


def tenant_id(i: int) -> str:
    return f"1065{i:011d}"


def populate(url: str, tenants: int) -> int:
    """Register the tenants and write their stats; returns the fleet's message count."""
    client = redis.Redis.from_url(url)
    keys = Keys(PREFIX)
    total = 0
    try:
        for start in range(0, tenants, 1000):
            pipe = client.pipeline(transaction=False)
            ids = [tenant_id(i) for i in range(start, min(start + 1000, tenants))]
            pipe.sadd(keys.tenants, *ids)
            for n, tenant in enumerate(ids, start):
                messages = 1 + n % 500
                total += messages
                fields: dict[str, int] = {**STATS, "messages": messages}
                pipe.hset(keys.tenant(tenant).stats, mapping=fields)  # type: ignore[arg-type]
            pipe.execute()
    finally:
        client.close()
    return total


@dataclass
class Receiver:
    redis_url: str
    logdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WHATSAPP_", "METRICS_"))}
        env.update(
            REDIS_URL=self.redis_url,
            KEY_PREFIX=PREFIX,
            WHATSAPP_APP_SECRET=SECRET,
            METRICS_TOKEN=TOKEN,
            LOG_LEVEL="WARNING",
        )
        command = [sys.executable, "-m", "uvicorn", "receiver.app:create_app", "--factory"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--loop", "uvloop"]
        command += ["--http", UVICORN_HTTP, "--no-access-log"]
        with (self.logdir / "receiver.log").open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"receiver exited: {(self.logdir / 'receiver.log').read_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise BenchError("receiver not ready after 30 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Phase:
    webhooks: list[float] = field(default_factory=list)  # seconds
    failed: Counter[int] = field(default_factory=Counter)  # status (0: no answer) -> count
    scrapes: list[float] = field(default_factory=list)
    page: str = ""


def bodies(count: int, tenants: int, seed: int) -> list[bytes]:
    """Signed webhook requests (HTTP/1.1, whole), each one new message to a random tenant."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        tenant = tenant_id(rng.randrange(tenants))
        person = f"549115{rng.randrange(10**7):07d}"
        message = text_message(f"wamid.bench{seed}.{i}", "hola", person)
        body = orjson.dumps(inbound_webhook(tenant, person, [message]))
        out.append(http_request("POST", "/webhooks/whatsapp", meta_headers(SECRET, body), body))
    return out


def http_request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: bench", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


class Connections:
    """Keep-alive HTTP/1.1 connections to the receiver, opened as needed (a minimal client:
    the load generator shares the machine, so it must cost little per request)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened: list[asyncio.StreamWriter] = []

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        # uvicorn closes a connection idle for 5 s: a reused one that fails is replaced once.
        for reused in (bool(self.idle), False):
            if reused:
                reader, writer = self.idle.pop()
            else:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                self.opened.append(writer)
            try:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                found = CONTENT_LENGTH.search(head)
                body = await reader.readexactly(int(found.group(1))) if found else b""
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()
                if reused:
                    continue
                raise
            self.idle.append((reader, writer))
            return int(head[9:12]), body
        raise AssertionError("unreachable")

    def close(self) -> None:
        for writer in self.opened:
            writer.close()


async def run_phase(
    port: int,
    duration_s: float,
    rate: float,
    scrapers: int,
    pause_s: float,
    tenants: int,
    seed: int,
) -> Phase:
    phase = Phase()
    requests = bodies(int(duration_s * rate), tenants, seed)
    webhooks, scrapes = Connections(port), Connections(port)
    # perf_counter, not the loop's clock: uvloop's counts whole milliseconds.
    start = time.perf_counter() + 0.2
    stop = start + duration_s

    async def post(due: float, request: bytes) -> None:
        try:
            status, _ = await webhooks.exchange(request)
        except (OSError, asyncio.IncompleteReadError):
            status = 0
        phase.webhooks.append(time.perf_counter() - due)
        if status != 200:
            phase.failed[status] += 1

    async def scrape_loop() -> None:
        request = http_request("GET", "/metrics", {"Authorization": f"Bearer {TOKEN}"})
        while time.perf_counter() < stop:
            began = time.perf_counter()
            status, body = await scrapes.exchange(request)
            phase.scrapes.append(time.perf_counter() - began)
            if status != 200:
                raise BenchError(f"/metrics answered {status}")
            phase.page = body.decode()
            await asyncio.sleep(pause_s)

    try:
        tasks = [asyncio.create_task(scrape_loop()) for _ in range(scrapers)]
        posts = []
        for i, request in enumerate(requests):
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            posts.append(asyncio.create_task(post(due, request)))
        await asyncio.gather(*posts, *tasks)
    finally:
        webhooks.close()
        scrapes.close()
    return phase


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fleet_figure(page: str, name: str) -> float:
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    raise BenchError(f"{name} not on the /metrics page")


def smembers_calls(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("commandstats").get("cmdstat_smembers", {}).get("calls", 0))
    finally:
        client.close()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def report(args: argparse.Namespace, base: Phase, load: Phase, reads: int, took_s: float) -> str:
    ok_scrape = max(load.scrapes) <= SCRAPE_MAX_S
    ok_p99 = quantile(load.webhooks, 0.99) <= WEBHOOK_P99_MAX_S
    lines = [
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"`scripts/bench_metrics --tenants {args.tenants} --rate {args.rate:g} "
        f"--scrapers {args.scrapers}` ({took_s:.0f} s in all); load average "
        f"{os.getloadavg()[0]:.1f} at the end (other work on the machine).",
        "",
        "| | webhooks | p50 | p99 | max | failed | scrapes | scrape p50 | scrape max |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, p in (("baseline (no scrapes)", base), ("with scrapes", load)):
        scrapes = (
            f"{len(p.scrapes)} | {ms(statistics.median(p.scrapes))} | {ms(max(p.scrapes))}"
            if p.scrapes
            else "0 | - | -"
        )
        lines.append(
            f"| {name} | {len(p.webhooks)} | {ms(quantile(p.webhooks, 0.5))} | "
            f"{ms(quantile(p.webhooks, 0.99))} | {ms(max(p.webhooks))} | "
            f"{_failed(p.failed)} | {scrapes} |"
        )
    lines += [
        "",
        f"Fleet reads from Redis during the scrapes: {reads} (one per "
        f"`METRICS_FLEET_MAX_AGE_S`, shared by the scrapes waiting for it); one page: "
        f"{len(load.page.encode()) / 1024:.0f} KiB, {load.page.count(chr(10))} lines.",
        f"Targets: every scrape ≤ {SCRAPE_MAX_S:g} s: {'met' if ok_scrape else 'MISSED'}; "
        f"webhook p99 with scrapes ≤ {WEBHOOK_P99_MAX_S * 1000:g} ms: "
        f"{'met' if ok_p99 else 'MISSED'}.",
    ]
    return "\n".join(lines)


def _failed(failed: Counter[int]) -> str:
    """`0`, or the count with the statuses seen (0: no answer)."""
    if not failed:
        return "0"
    return (
        f"{sum(failed.values())} ("
        + ", ".join(f"{s}: {n}" for s, n in sorted(failed.items()))
        + ")"
    )


def write_doc(block: str) -> None:
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + block + "\n" + text[end:])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_metrics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tenants", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=200.0, help="webhooks per second")
    parser.add_argument("--baseline-s", type=float, default=10.0)
    parser.add_argument("--scrape-s", type=float, default=20.0)
    parser.add_argument("--scrapers", type=int, default=3, help="scrapers in parallel")
    parser.add_argument("--pause-s", type=float, default=0.5, help="each scraper's pause")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks/metrics.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp, RedisServer() as server:
        receiver = Receiver(server.url, Path(tmp))
        try:
            say(f"writing {args.tenants} tenants' stats")
            messages = populate(server.url, args.tenants)
            receiver.start()
            say(f"baseline: {args.rate:g} webhooks/s for {args.baseline_s:g} s, no scrapes")
            base = uvloop.run(
                run_phase(receiver.port, args.baseline_s, args.rate, 0, 0, args.tenants, 1)
            )
            reads_before = smembers_calls(server.url)
            say(f"{args.scrapers} scrapers for {args.scrape_s:g} s, same webhooks")
            load = uvloop.run(
                run_phase(
                    receiver.port,
                    args.scrape_s,
                    args.rate,
                    args.scrapers,
                    args.pause_s,
                    args.tenants,
                    2,
                )
            )
            reads = smembers_calls(server.url) - reads_before
        except (BenchError, OSError, httpx.HTTPError, asyncio.IncompleteReadError) as exc:
            say(f"could not run: {exc}")
            return EXIT_BROKEN
        finally:
            receiver.stop()
    if fleet_figure(load.page, "wa_tenants") != args.tenants:
        say("the page does not count every tenant")
        return EXIT_BROKEN
    if fleet_figure(load.page, "wa_messages_total") != messages:
        say("the page's message total is not what was written")
        return EXIT_BROKEN
    block = report(args, base, load, reads, time.monotonic() - began)
    print(block)
    if args.write:
        write_doc(block)
    missed = max(load.scrapes) > SCRAPE_MAX_S or quantile(load.webhooks, 0.99) > WEBHOOK_P99_MAX_S
    return EXIT_MISSED if missed else 0


if __name__ == "__main__":
    sys.exit(main())
