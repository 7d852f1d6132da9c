"""`python -m scripts.chaos_harness.ai_recovery`: how soon after an AI outage the fleet answers.

The chaos stack (Redis, both stand-ins, a receiver, `--workers` worker processes with the real
`anthropic` brain), run with the product's default AI-pause settings (`AI_OUTAGE_PAUSE_S`,
`AI_OUTAGE_MAX_PAUSE_S` unset). Each round the Messages API stand-in answers 529 with a
`retry-after` to every call for `--outage` seconds (plus up to `--vary`, at random); one
person writes as it starts (their call fails and pauses the fleet), `--people` more write at
random moments during it. After the stand-in answers again it prints, from the stand-ins'
records:

- the AI calls during the outage and the gaps between them (the fleet's probes);
- the delay from recovery to the first AI call, and to the first answer sent;
- the delay from recovery to the answer of the last person who was waiting.

The figures go to docs/benchmarks/ai_recovery.md. Run it alone on the machine. The stack's
processes run the code of the checkout the script is in: to measure another revision, run the
script from an export of it (`git archive REV | tar -x -C DIR`, the script copied in).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import orjson

from scripts.chaos_harness.stack import APP_SECRET, Stack
from scripts.chaos_harness.workload import TENANTS
from scripts.webhooks import inbound_webhook, meta_headers, text_message

# Fast batching, so a batch's own wait does not hide the pause's; everything else default.
WORKER_ENV = {"DEBOUNCE_WINDOW_S": "0.3", "MAX_WAIT_S": "1", "WORKER_CONCURRENCY": "20"}


@dataclass
class Round:
    outage_s: float
    failed_calls: int  # AI calls answered 529 during the outage
    probe_gaps_s: list[float]  # between the outage's failed calls
    first_call_s: float  # recovery -> the first AI call
    first_answer_s: float  # recovery -> the first answer sent
    last_answer_s: float  # recovery -> the last waiting person's answer
    waiting: int  # people waiting at recovery


async def post(client: httpx.AsyncClient, url: str, tenant: str, person: str, text: str) -> None:
    wamid = f"wamid.rec{person}{time.time_ns()}"
    body = orjson.dumps(inbound_webhook(tenant, person, [text_message(wamid, text, person)]))
    for _ in range(50):
        response = await client.post(url, content=body, headers=meta_headers(APP_SECRET, body))
        if response.status_code == 200:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the receiver refused a message: {response.status_code}")


async def one_round(
    stack: Stack, client: httpx.AsyncClient, number: int, args: argparse.Namespace
) -> Round:
    rng = random.Random(args.seed * 1000 + number)
    people = [f"5491166{number:02d}{i:04d}" for i in range(args.people + 1)]
    length = args.outage + rng.uniform(0.0, args.vary)
    await stack.ai_control(
        {
            "op": "outage",
            "seconds": length,
            "error": "overloaded",
            "retry_after": args.retry_after,
        }
    )
    state = (await client.get(f"{stack.ai_url}/_control")).json()
    recovered = max(float(f["until"]) for f in state["faults"] if f.get("until"))
    began = recovered - length

    async def write(i: int, person: str) -> None:
        at = 0.0 if i == 0 else rng.uniform(0.5, length - 0.5)
        await asyncio.sleep(max(0.0, began + at - time.time()))
        await post(client, stack.receiver_url, TENANTS[i % len(TENANTS)], person, f"hola {i}")

    await asyncio.gather(*(write(i, p) for i, p in enumerate(people)))
    answered: dict[str, float] = {}
    deadline = recovered + 120
    while len(answered) < len(people) and time.time() < deadline:
        await asyncio.sleep(0.5)
        for record in await stack.graph_records():
            body = record.get("body") or {}
            to = str(body.get("to")) if isinstance(body, dict) else ""
            if record.get("kind") == "text" and record.get("status") == 200 and to in people:
                end = float(record.get("answered") or record["time"])
                answered[to] = min(end, answered.get(to, end))
    if len(answered) < len(people):
        raise RuntimeError(f"round {number}: {len(people) - len(answered)} people not answered")
    calls = [
        r
        for r in await stack.ai_records()
        if r.get("kind") == "messages" and float(r["time"]) >= began - 0.5
    ]
    failed = sorted(float(r["time"]) for r in calls if r.get("status") != 200)
    after = sorted(float(r["time"]) for r in calls if float(r["time"]) >= recovered)
    return Round(
        outage_s=round(length, 2),
        failed_calls=len(failed),
        probe_gaps_s=[round(b - a, 2) for a, b in itertools.pairwise(failed)],
        first_call_s=round(after[0] - recovered, 2),
        first_answer_s=round(min(answered.values()) - recovered, 2),
        last_answer_s=round(max(answered.values()) - recovered, 2),
        waiting=len(people),
    )


async def measure(args: argparse.Namespace) -> list[Round]:
    run_dir = Path(tempfile.mkdtemp(prefix="ai-recovery-"))
    stack = Stack(run_dir, workers=args.workers, worker_env=WORKER_ENV)
    rounds = []
    try:
        await stack.start()
        async with httpx.AsyncClient(timeout=10.0) as client:
            for number in range(args.rounds):
                result = await one_round(stack, client, number, args)
                print(
                    f"round {number + 1}: {result.outage_s:.1f}s outage, {result.failed_calls}"
                    " calls failed during it,"
                    f" gaps {result.probe_gaps_s} s; after recovery: first AI call"
                    f" +{result.first_call_s:.2f}s, first answer +{result.first_answer_s:.2f}s,"
                    f" last of {result.waiting} waiting +{result.last_answer_s:.2f}s",
                    flush=True,
                )
                rounds.append(result)
                await asyncio.sleep(args.rest)
    finally:
        await stack.close()
    return rounds


def summary(rounds: list[Round]) -> str:
    first = [r.first_call_s for r in rounds]
    last = [r.last_answer_s for r in rounds]
    gaps = [g for r in rounds for g in r.probe_gaps_s]
    return (
        f"{len(rounds)} rounds: recovery -> first AI call median {statistics.median(first):.2f}s,"
        f" max {max(first):.2f}s; -> last waiting answer median {statistics.median(last):.2f}s,"
        f" max {max(last):.2f}s; gaps between failed calls min {min(gaps, default=0):.2f}s,"
        f" max {max(gaps, default=0):.2f}s"
    )


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_ai_recovery",
        description="An AI outage with default settings: how soon after it people are answered.",
    )
    parser.add_argument("--outage", type=float, default=20.0, help="seconds of 529s (20)")
    parser.add_argument(
        "--vary",
        type=float,
        default=0.0,
        help="each outage lasts up to this much longer, at random: recovery then falls anywhere"
        " between two probes (0)",
    )
    parser.add_argument("--retry-after", type=float, default=2.0, help="its retry-after (2)")
    parser.add_argument("--people", type=int, default=30, help="people writing during it (30)")
    parser.add_argument("--rounds", type=int, default=5, help="outages, one after another (5)")
    parser.add_argument("--rest", type=float, default=3.0, help="seconds between rounds (3)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="also print every round as JSON")
    args = parser.parse_args(argv)
    if args.outage <= 1 or args.people < 0 or args.rounds < 1 or args.workers < 1:
        parser.error("--outage > 1, --rounds and --workers >= 1, --people >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    rounds = asyncio.run(measure(args))
    print(summary(rounds))
    if args.json:
        print(json.dumps([asdict(r) for r in rounds]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
