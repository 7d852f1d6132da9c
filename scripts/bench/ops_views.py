"""What the ops page costs: each list view at many review items, and the webhooks' latency
while operators reload ops views nonstop (the ops page runs in the receiver's process).

    python -m scripts.bench.ops_views --items 200000 --seconds 15
    python -m scripts.bench.ops_views --items 20000 --seconds 5 --rate 200     # quick

One run: a private Redis (a free port, appendonly off), `--items` review items on 4 tenants
written as the previous release wrote them (the review hash alone), then indexed by the ops
page's backfill (timed: what the first view after a deploy pays, in bounded steps), one
receiver (uvicorn, the Procfile's flags) with `OPS_TOKEN` set. Then:

1. Views: each ops view (first page, a reason, a tenant, tenant and reason, an age filter, a
   later page, the page before it, an item, a conversation, the audit, the inbox's overview,
   a tenant's conversations, a search by number and by word, a thread) fetched `--view-reps`
   times over HTTP by one signed-in client, one after the other; median and p95 of the wall
   time.
2. Webhooks: signed one-message webhooks posted at `--rate` per second for `--seconds`, with no
   operator, then the same with `--operators` processes each reloading those views nonstop;
   latency measured from each request's scheduled time (no coordinated omission): p50, p99.
3. A bulk drop of every too_old item (a job in the background) while webhooks come in at the
   same rate: how fast the request answers, how long the job takes, the webhooks' latency.

Prints a Markdown block for docs/benchmarks/ops.md; nothing is written by itself. The machine
must be otherwise quiet for figures to be compared; say so when it was not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx
import orjson
from redis.asyncio import Redis

from receiver.http_protocol import UVICORN_HTTP
from scripts.dev.redis_server import RedisServer, free_port
from scripts.webhooks import inbound_webhook, sign_body, text_message
from shared.keys import Keys
from shared.ops.review_index import ReviewIndex
from shared.storage.scripts import Scripts

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "opsbench"
SECRET = "ops-bench-secret"
OPS_TOKEN = "ops-bench-token-0123456789abcdefghijklmnopqrstuv"
TENANTS = ["106500000000001", "106500000000002", "106500000000003", "106500000000004"]
# Reasons by share of the items (an outage's backlog is mostly too_old).
REASONS = [("too_old", 6), ("max_attempts", 1), ("window_closed", 1), ("ai_hand_over", 1)]
REASONS += [("delivery_unknown", 1)]
PERSONS = 5000  # per tenant
SPAN_MS = 10 * 86_400_000  # the items were parked over the last 10 days
CONNECTIONS = 16  # the webhook poster's keep-alive connections


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- data ----------------------------------------------------------------------------------
def item(n: int, count: int, tenant: str, now_ms: int) -> tuple[str, bytes]:
    """Item `n` of `count`, parked between 10 days and a minute ago (oldest first)."""
    weights = sum(w for _, w in REASONS)
    slot, reason = n % weights, REASONS[0][0]
    for name, w in REASONS:
        if slot < w:
            reason = name
            break
        slot -= w
    at = now_ms - SPAN_MS + n * (SPAN_MS - 60_000) // max(1, count)
    item_id = f"{at}-{n}"
    body = {
        "id": item_id,
        "tenant": tenant,
        "person": f"549{n % PERSONS:010d}",
        "reason": reason,
        "error": "RetryLater: HTTP 500, code None: <html>busy</html>",
        "attempts": 1,
        "reviewed_ms": at,
        "messages": [{"id": f"wamid.{n}", "type": "text", "text": "hola, ¿tienen turno?"}],
    }
    return item_id, orjson.dumps(body)


async def fill(url: str, count: int) -> dict[str, float]:
    """`count` items written as the previous release wrote them; then the backfill, timed."""
    redis = Redis.from_url(url)
    keys = Keys(PREFIX)
    now_ms = int(time.time() * 1000)
    started = time.monotonic()
    await redis.sadd(keys.tenants, *TENANTS)
    pipe = redis.pipeline(transaction=False)
    for n in range(count):
        tenant = TENANTS[n % len(TENANTS)]
        item_id, body = item(n, count, tenant, now_ms)
        pipe.hset(keys.tenant(tenant).review, item_id, body)
        if len(pipe) >= 5000:
            await pipe.execute()
    # The inbox's index of conversations by last activity, as the claim keeps it (its own
    # bound, 10 000 a tenant): every person of the items, active over the items' span.
    for tenant in TENANTS:
        recent = {f"549{p:010d}": now_ms - p * (SPAN_MS // PERSONS) for p in range(PERSONS)}
        pipe.zadd(keys.tenant(tenant).conversations, recent)
    await pipe.execute()
    written = time.monotonic() - started
    scripts = Scripts()
    await scripts.load(redis)
    index = ReviewIndex(redis, keys, scripts)
    started = time.monotonic()
    steps = 0
    while await index.fill(TENANTS, budget_s=0.5):
        steps += 1
    filled = time.monotonic() - started
    memory = (await redis.info("memory"))["used_memory"]
    await redis.aclose()
    return {"write_s": written, "fill_s": filled, "used_mb": memory / 1e6}


# --- the receiver ----------------------------------------------------------------------------
def start_receiver(url: str, logdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "OPS_", "WHATSAPP_"))}
    env.update(
        REDIS_URL=url,
        KEY_PREFIX=PREFIX,
        WHATSAPP_APP_SECRET=SECRET,
        OPS_TOKEN=OPS_TOKEN,
        LOG_LEVEL="WARNING",
        LOG_FORMAT="text",
        PYTHONPATH=str(ROOT),
    )
    command = [sys.executable, "-m", "uvicorn", "receiver.app:create_app", "--factory"]
    command += ["--port", str(port), "--loop", "uvloop", "--http", UVICORN_HTTP]
    command += ["--no-access-log"]
    with (logdir / "receiver.log").open("wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.5) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the receiver did not come up: see {logdir / 'receiver.log'}")


async def signed_in(base: str, name: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base, timeout=30)
    answer = await client.post("/ops/signin", data={"token": OPS_TOKEN, "name": name})
    assert answer.status_code == 303, answer.text
    return client


async def views(client: httpx.AsyncClient) -> dict[str, str]:
    """The paths of the views measured (the later pages found by following the links)."""
    first = (await client.get("/ops/?reason=too_old")).text
    later = re.search(r'href="([^"]+)">newer items', first)
    second = later.group(1).replace("&amp;", "&") if later else "/ops/?reason=too_old"
    second_text = (await client.get(second)).text
    third = re.search(r'href="([^"]+)">newer items', second_text)
    third_path = third.group(1).replace("&amp;", "&") if third else second
    back = re.search(r'href="([^"]+)">← older items', (await client.get(third_path)).text)
    one = re.search(r'href="(/ops/item\?[^"]+)"', first)
    person = re.search(r'href="(/ops/conversation\?[^"]+)"', first)
    return {
        "first page, every tenant": "/ops/",
        "one reason": "/ops/?reason=too_old",
        "one tenant": f"/ops/?tenant={TENANTS[0]}",
        "tenant and reason": f"/ops/?tenant={TENANTS[1]}&reason=window_closed",
        "older than 1 day": "/ops/?age=1d",
        "third page (newer items)": third_path,
        "back a page (older items)": back.group(1).replace("&amp;", "&") if back else third_path,
        "an item": one.group(1).replace("&amp;", "&") if one else "/ops/",
        "a conversation": person.group(1).replace("&amp;", "&") if person else "/ops/",
        "audit": "/ops/audit",
        "inbox overview": "/ops/conversations",
        "a tenant's conversations": f"/ops/conversations?tenant={TENANTS[0]}",
        "search by number": f"/ops/conversations?tenant={TENANTS[0]}&q=5490000001",
        "search by a word": f"/ops/conversations?tenant={TENANTS[0]}&q=turno",
        "a thread": f"/ops/thread?tenant={TENANTS[0]}&person=5490000000004",
    }


async def measure_views(base: str, reps: int) -> dict[str, tuple[float, float]]:
    client = await signed_in(base, "bench")
    paths = await views(client)
    result = {}
    for label, path in paths.items():
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            answer = await client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
        result[label] = (statistics.median(times), pct(times, 0.95))
    await client.aclose()
    return result


# --- operators (their own process) -----------------------------------------------------------
async def operate(base: str, seconds: float, name: str) -> int:
    client = await signed_in(base, name)
    paths = list((await views(client)).values())
    done, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        await client.get(paths[done % len(paths)])
        done += 1
    await client.aclose()
    return done


# --- webhooks --------------------------------------------------------------------------------
def webhook_request(n: int, tag: str) -> bytes:
    """One signed webhook POST as raw HTTP/1.1 bytes: the poster spends next to no CPU."""
    tenant = TENANTS[n % len(TENANTS)]
    person = f"549{n % 200:010d}"
    message = text_message(f"wamid.{tag}.{n}", "hola", person, int(time.time()))
    body = orjson.dumps(inbound_webhook(tenant, person, [message]))
    head = (
        "POST /webhooks/whatsapp HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"X-Hub-Signature-256: {sign_body(SECRET, body)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def post_at_rate(port: int, rate: float, seconds: float, tag: str) -> dict[str, float]:
    """Request i goes out at i / rate s over keep-alive connections (one free connection per
    request: enough of them that none waits for another); latency from its scheduled time."""
    count = int(rate * seconds)
    requests = [webhook_request(n, tag) for n in range(count)]
    latencies: list[float] = []
    failures = 0
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5
    todo = iter(range(count))

    async def connection() -> None:
        nonlocal failures
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for n in todo:
                scheduled = start + n / rate
                if (wait := scheduled - loop.time()) > 0:
                    await asyncio.sleep(wait)
                writer.write(requests[n])
                head = await reader.readuntil(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:") and int(line[15:]):
                        await reader.readexactly(int(line[15:]))
                latencies.append((loop.time() - scheduled) * 1000)
                failures += head[9:12] != b"200"
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(CONNECTIONS)))
    return {
        "requests": count,
        "failures": failures,
        "p50": pct(latencies, 0.5),
        "p99": pct(latencies, 0.99),
        "max": max(latencies),
    }


async def bulk_drop(base: str, port: int, args: argparse.Namespace) -> dict[str, float]:
    """Drop every too_old item in one bulk job while webhooks come in at the rate: the job's
    time and rate, and the webhooks' latency meanwhile."""
    client = await signed_in(base, "bulk")
    page = (await client.get("/ops/?reason=too_old")).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf, page[:300]
    form = {"csrf": csrf.group(1), "action": "drop", "reason": "too_old", "confirm": "yes"}
    started = time.monotonic()
    answer = await client.post("/ops/bulk", data=form)
    assert answer.status_code == 303, answer.text[:300]
    answered_ms = (time.monotonic() - started) * 1000
    job = answer.headers["location"]
    hooks = asyncio.create_task(post_at_rate(port, args.rate, args.seconds, "bulk"))
    while 'id="bulk-state">finished' not in (text := (await client.get(job)).text):
        assert 'id="bulk-state">stopped' not in text, text[:2000]
        await asyncio.sleep(0.5)
    took = time.monotonic() - started
    done = re.search(r"Dropped (\d+) of (\d+)", text)
    assert done, text[:2000]
    result = await hooks
    await client.aclose()
    return {
        **result,
        "answered_ms": answered_ms,
        "items": float(done.group(1)),
        "took_s": took,
        "items_per_s": float(done.group(1)) / took,
    }


async def webhooks(base: str, port: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    alone = await post_at_rate(port, args.rate, args.seconds, "alone")
    command = [sys.executable, "-m", "scripts.bench.ops_views", "--operate", base]
    command += ["--seconds", str(args.seconds + 3)]
    operators = [
        subprocess.Popen(  # noqa: ASYNC220 - started once, before the measured phase
            [*command, "--name", f"operator-{i}"], cwd=ROOT, stdout=subprocess.PIPE
        )
        for i in range(args.operators)
    ]
    await asyncio.sleep(2.0)  # signed in, reloading
    loaded = await post_at_rate(port, args.rate, args.seconds, "loaded")
    views_done = 0
    for proc in operators:
        out, _ = proc.communicate(timeout=args.seconds + 60)
        views_done += int(out.decode().strip() or 0)
    loaded["views"] = views_done
    loaded["views_per_s"] = views_done / (args.seconds + 3)
    bulk = await bulk_drop(base, port, args)
    return {"alone": alone, "loaded": loaded, "bulk": bulk}


# --- report --------------------------------------------------------------------------------
def report(
    args: argparse.Namespace,
    filled: dict[str, float],
    view_times: dict[str, tuple[float, float]],
    hooks: dict[str, dict[str, float]],
    load: tuple[float, float],
) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:",
        "",
        "```",
        f"python -m scripts.bench.ops_views --items {args.items} --seconds {args.seconds} "
        f"--rate {args.rate} --operators {args.operators} --view-reps {args.view_reps}",
        "```",
        "",
        f"- **Machine**: {os.cpu_count()} CPUs, {platform.machine()}, Python "
        f"{platform.python_version()}; load average {load[0]:.2f} at the start, "
        f"{load[1]:.2f} at the end (other processes of a shared machine included).",
        f"- **Data**: {args.items} review items on {len(TENANTS)} tenants, written as the "
        f"previous release wrote them, then indexed by the backfill in "
        f"{filled['fill_s']:.1f} s (bounded steps of 500 items); Redis used "
        f"{filled['used_mb']:.0f} MB.",
        "",
        "### Views (one signed-in client, over HTTP, one after the other)",
        "",
        "| view | median (ms) | p95 (ms) |",
        "| --- | ---: | ---: |",
    ]
    for label, (median, p95) in view_times.items():
        lines.append(f"| {label} | {median:.1f} | {p95:.1f} |")
    alone, loaded, bulk = hooks["alone"], hooks["loaded"], hooks["bulk"]
    lines += [
        "",
        f"### Webhooks at {args.rate:g}/s for {args.seconds:g} s",
        "",
        "| | p50 (ms) | p99 (ms) | max (ms) | non-200 |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| no operator | {alone['p50']:.1f} | {alone['p99']:.1f} | {alone['max']:.1f} | "
        f"{alone['failures']:.0f} |",
        f"| {args.operators} operators reloading views nonstop "
        f"({loaded['views_per_s']:.0f} views/s) | {loaded['p50']:.1f} | {loaded['p99']:.1f} | "
        f"{loaded['max']:.1f} | {loaded['failures']:.0f} |",
        f"| a bulk drop of every too_old item running (below) | {bulk['p50']:.1f} | "
        f"{bulk['p99']:.1f} | {bulk['max']:.1f} | {bulk['failures']:.0f} |",
        "",
        f"p99 difference with the operators: {loaded['p99'] - alone['p99']:+.1f} ms (target: "
        "within 10 ms).",
        "",
        f"The bulk drop: the request answered in {bulk['answered_ms']:.0f} ms; the job dropped "
        f"{bulk['items']:.0f} items (each audited) in {bulk['took_s']:.1f} s "
        f"({bulk['items_per_s']:.0f} items/s), the webhooks above coming in meanwhile "
        f"(measured over their first {args.seconds:g} s).",
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ops-bench-") as tmp:
        server = RedisServer().start()
        proc = None
        try:
            print(f"filling {args.items} items ...", file=sys.stderr)
            filled = await fill(server.url, args.items)
            proc, port = start_receiver(server.url, Path(tmp))
            base = f"http://127.0.0.1:{port}"
            print("views ...", file=sys.stderr)
            view_times = await measure_views(base, args.view_reps)
            print("webhooks ...", file=sys.stderr)
            hooks = await webhooks(base, port, args)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)
            server.stop()
    print(report(args, filled, view_times, hooks, (load_start, os.getloadavg()[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=15.0, help="each webhook phase")
    parser.add_argument("--rate", type=float, default=300.0, help="webhooks per second")
    parser.add_argument("--operators", type=int, default=4)
    parser.add_argument("--view-reps", type=int, default=30)
    parser.add_argument("--operate", help=argparse.SUPPRESS)  # an operator process: its URL
    parser.add_argument("--name", default="operator", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.operate:
        print(asyncio.run(operate(args.operate, args.seconds, args.name)))
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
