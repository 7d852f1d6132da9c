"""The `chatwoot_outage` scenario: Redis is down longer than the receiver's hold while Chatwoot
customers write, beside the usual WhatsApp traffic.

Chatwoot's account webhooks are posted once, whatever the answer; the Chatwoot API stand-in does
the same. So every customer message written while Redis is away is answered 500 (after
`WEBHOOK_HOLD_S`, 4 s) and never sent again: only the catch-up (worker/fleet/chatwoot_catchup.py)
can bring it in, reading it back from the stand-in once Redis answers. Meta retries, so the
WhatsApp traffic is completed by its own retries and held to every usual check.

A few customers (Chatwoot conversations `9001`, ...) each write a message every
`WRITE_EVERY_S`, before, during and after the outage; every message carries a token
`k<conversation>z<seq>`, which the Messages API stand-in's reply repeats. The checks, from
the Chatwoot stand-in's records after the run drained:

- every customer message is in exactly one reply Chatwoot accepted: answered, and once
  (whether its webhook or the catch-up brought it, or both);
- the fault had its effect: webhooks were answered other than 200 and never posted again, and
  the catch-up took messages in (`catchup_messages`).

Not checked: the order of a conversation's answers around the outage. A message the catch-up
brings in comes a moment after Redis is back, and one its customer wrote after that moment may
have been answered first (docs/providers/chatwoot.md#catch-up).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from typing import Any

from scripts.chaos_harness.stack import CHATWOOT_TENANT

OUTAGE_S = 8.0  # Redis down this long: twice the receiver's hold (WEBHOOK_HOLD_S, 4 s)
# The workers' lease, longer than the outage. With a lease shorter than the outage (5 s, tried) a
# turn that sent its reply while Redis was down cannot record it, its lease ends in Redis
# meanwhile, and another worker answers the batch again after the outage: `reply_once` broke
# for WhatsApp batches so. That is the leases' documented limit under an outage longer than
# the lease (docs/operating.md, "Redis blips"), which this scenario does not test.
LEASE_S = OUTAGE_S * 2.5
CONVERSATIONS = 6
WRITE_EVERY_S = 0.5
FIRST_CONVERSATION = 9001
TOKEN_RE = re.compile(r"\bk(\d+)z(\d+)\b")
CATCH_UP_WAIT_S = 30.0  # the catch-up runs within this long of Redis's return


def token(conversation: int, seq: int) -> str:
    return f"k{conversation}z{seq}"


async def inject(run: Any) -> None:
    """Customers write all along; Redis goes down for OUTAGE_S a moment into the run."""
    stop = asyncio.Event()
    written: list[tuple[int, int, float]] = []
    run.notes["chatwoot_written"] = written
    writers = asyncio.create_task(_customers_write(run, stop, written))
    try:
        await asyncio.sleep(min(run.duration_s / 4, 2.0))
        await run.stack.redis_stop()
        run.fault("redis_down", f"stopped for {OUTAGE_S:g}s (longer than the hold)")
        await asyncio.sleep(OUTAGE_S)
        await run.stack.redis_start()
        back = time.monotonic()
        run.fault("redis_back", "started again from its AOF")
        # A little traffic after the return too, and at least the run's duration in all.
        await asyncio.sleep(max(2.0, run.duration_s - OUTAGE_S))
    finally:
        stop.set()
        await writers
    ran = await _catch_up_ran(run, back)
    run.notes["catch_up_after_s"] = ran
    run.fault("catch_up", f"ran {ran:.1f}s after Redis was back" if ran >= 0 else "never ran")


async def _customers_write(run: Any, stop: asyncio.Event, written: list[Any]) -> None:
    seq = 0
    while not stop.is_set():
        for n in range(CONVERSATIONS):
            conversation = FIRST_CONVERSATION + n
            text = f"hola {token(conversation, seq)}"
            await run.stack.chatwoot_control(
                {"op": "customer_writes", "conversation": conversation, "content": text}
            )
            written.append((conversation, seq, time.time()))
        seq += 1
        try:
            await asyncio.wait_for(stop.wait(), WRITE_EVERY_S)
        except TimeoutError:
            pass


async def _catch_up_ran(run: Any, back: float) -> float:
    """Seconds from Redis's return to the first catch-up run's end (-1: none within the wait)."""
    stack = run.stack
    stats = stack.keys.tenant(CHATWOOT_TENANT).stats
    while time.monotonic() - back < CATCH_UP_WAIT_S:
        try:
            runs = await stack.redis.hget(stats, "catchup_runs")
            wanted = await stack.redis.exists(stack.keys.chatwoot_catchup_wanted)
        except Exception:  # Redis still starting
            runs, wanted = None, 1
        if runs is not None and not wanted:
            return time.monotonic() - back
        await asyncio.sleep(0.1)
    return -1.0


def verify(run: Any, obs: Any, stats: dict[str, int]) -> None:
    records = run.notes.get("chatwoot", {})
    written = run.notes.get("chatwoot_written", [])
    answers: Counter[tuple[int, int]] = Counter()
    for record in records.get("requests", []):
        body = record.get("body")
        if record.get("kind") == "reply" and record.get("status") == 200 and body:
            for conversation, seq in TOKEN_RE.findall(str(body.get("content", ""))):
                answers[(int(conversation), int(seq))] += 1
    unanswered = [token(c, s) for c, s, _ in written if answers[(c, s)] == 0]
    twice = [token(c, s) for c, s, _ in written if answers[(c, s)] > 1]
    run.expect(
        "every Chatwoot customer message answered exactly once",
        bool(written) and not unanswered and not twice,
        f"{len(written)} written; unanswered {unanswered[:10] or 'none'}; answered more than"
        f" once {twice[:10] or 'none'}",
    )
    hooks = [
        h
        for h in records.get("webhooks", [])
        if h.get("body", {}).get("message_type") == "incoming"
    ]
    refused = [h for h in hooks if h.get("response_status") != 200]
    posted = Counter(h.get("message_id") for h in hooks)
    run.expect(
        "Chatwoot webhooks were refused during the outage and never posted again",
        bool(refused) and max(posted.values(), default=0) == 1,
        f"{len(refused)} of {len(hooks)} customer webhooks answered other than 200;"
        f" at most {max(posted.values(), default=0)} post(s) of one message",
    )
    taken = stats.get("catchup_messages", 0)
    after_s = run.notes.get("catch_up_after_s", -1.0)
    run.expect(
        "the catch-up took the refused messages in, soon after Redis was back",
        taken >= 1 and 0 <= after_s < CATCH_UP_WAIT_S,
        f"catchup_messages={taken}, {len(refused)} webhooks refused; the catch-up had run"
        f" {after_s:.1f}s after Redis was back",
    )
