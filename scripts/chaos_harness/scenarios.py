"""The scenarios, and `run_scenario`: start the stack, write, inject, drain, check, report.

Each scenario is the same workload with one kind of fault injected while it runs:

- `kill`: SIGKILL of a worker that holds a turn right now (read from the lock tokens), several
  times, each replaced at once; short leases so its batches come back within the run.
- `redis_restart`: Redis crashes (SIGKILL) and restarts from its AOF (`appendfsync always`)
  while traffic flows.
- `redis_stall`: Redis stops answering for a few seconds (`CLIENT PAUSE ... ALL`): the receiver
  holds what it could not store yet (`WEBHOOK_HOLD_S`, longer than the stall) and answers 200
  once Redis is back; anything refused is completed by the workload's retries.
- `graph_faults`: the Graph API fails 30% of sends with retryable codes, and answers 131047
  (window closed) to every send to some people, whose batches must all go to review.
- `slow_ai`: every AI call takes 1.5 leases: only lease renewal keeps the turn its own.
- `chatwoot_outage`: Redis is down for 8 s (twice the receiver's hold) while Chatwoot customers
  write beside the WhatsApp traffic; Chatwoot never resends what was refused, so the catch-up
  must bring it in: every Chatwoot message answered exactly once (chatwoot_outage.py).
- `ai_outage`: every AI call fails with 529 (retry-after 1 s) for 60 s (half the traffic in a
  short run), then the AI answers again: batches wait out the outage, their attempts not
  counted, the fleet (default AI pause settings) probing once per pause, never less often than
  `AI_OUTAGE_MAX_PAUSE_S`, and are answered soon after recovery.
- `redis_freeze`: Redis is frozen (SIGSTOP) for two lease renewal intervals, once: the turns
  running then keep their leases and the batches due meanwhile are claimed once it answers
  again, so everything waiting at the freeze is answered within seconds of its end, and no
  lease expires (a claim Redis ran after its worker gave up on it must not lock a batch for
  the whole lease).

Besides the invariants (checks.py), each scenario checks that its fault really happened and
had its effect (a kill mid-turn and a lease recovered, a 503 answered, ...): a fault that
silently did nothing would make a green run meaningless.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.chaos_harness import chatwoot_outage, observe
from scripts.chaos_harness.checks import Observation, Policy, Violation, check, review_key
from scripts.chaos_harness.stack import APP_SECRET, Stack
from scripts.chaos_harness.workload import TENANTS, Workload
from shared.settings import Settings

WINDOW_S = 0.4
MAX_WAIT_S = 4.0
BASE_ENV = {
    "DEBOUNCE_WINDOW_S": str(WINDOW_S),
    "MAX_WAIT_S": str(MAX_WAIT_S),
    "LEASE_S": "3",
    "LEASE_RENEW_S": "0.5",
    "RETRY_BASE_S": "0.2",
    "MAX_ATTEMPTS": "5",
    "WORKER_CONCURRENCY": "20",
    "POLL_INTERVAL_S": "1",
    "REDIS_TIMEOUT_S": "1",
    # A batch parked as delivery_unknown or max_attempts pauses its person for a human
    # (shared/ops/takeover.py); no human acts here, so the pause is short: the person's later
    # messages wait it out and are answered, and every check still holds them to it.
    "HUMAN_PAUSE_S": "1",
}


@dataclass
class Run:
    """What a scenario's fault injector works with, and what it writes down."""

    stack: Stack
    workload: Workload
    duration_s: float
    rng: random.Random
    faults: list[tuple[float, str, str]] = field(default_factory=list)  # (time, kind, detail)
    kills: list[float] = field(default_factory=list)
    expectations: list[tuple[str, bool, str]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)  # a scenario's own records

    def fault(self, kind: str, detail: str = "") -> None:
        self.faults.append((time.time(), kind, detail))

    def expect(self, what: str, ok: bool, detail: str) -> None:
        self.expectations.append((what, ok, detail))


Injector = Callable[[Run], Coroutine[Any, Any, None]]
Verifier = Callable[[Run, Observation, dict[str, int]], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    inject: Injector
    verify: Verifier
    env: dict[str, str] = field(default_factory=dict)
    policy: Policy = field(default_factory=Policy)
    window_closed_people: int = 0
    chatwoot: bool = False  # the Chatwoot API stand-in runs, the workers answer through it


# --- kill ---------------------------------------------------------------------------------------
async def _kill_workers(run: Run) -> None:
    # Turns that take a moment (AI, then the send), so a kill lands in the middle of one.
    await run.stack.ai_control({"op": "latency", "seconds": 0.2})
    await run.stack.graph_control({"op": "latency", "seconds": 0.05})
    kills = max(2, int(run.duration_s / 2))
    every = run.duration_s / (kills + 1)
    for _ in range(kills):
        await asyncio.sleep(every * run.rng.uniform(0.7, 1.3))
        victim, people = await _busy_worker(run)
        run.kills.append(time.time())
        replacement = run.stack.kill_worker(victim)
        run.fault(
            "sigkill", f"pid {victim} holding {len(people)} turn(s); new pid {replacement.pid}"
        )


async def _busy_worker(run: Run) -> tuple[int, list[str]]:
    """A live worker holding at least one turn now (waits up to 2 s for one), else any."""
    live = {w.pid for w in run.stack.live_workers}
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        holders = await run.stack.lock_holders(list(TENANTS))
        busy = sorted(pid for pid in holders if pid in live)
        if busy:
            pid = run.rng.choice(busy)
            return pid, holders[pid]
        await asyncio.sleep(0.02)
    return run.rng.choice(sorted(live)), []


def _verify_kill(run: Run, obs: Observation, stats: dict[str, int]) -> None:
    mid_turn = sum(
        1 for _, kind, detail in run.faults if kind == "sigkill" and "holding 0" not in detail
    )
    run.expect("a worker was killed mid-turn", mid_turn >= 1, f"{mid_turn} kills mid-turn")
    expired = stats.get("leases_expired", 0)
    run.expect(
        "a killed worker's batch came back after its lease",
        expired >= 1,
        f"leases_expired={expired}",
    )


# --- redis restart ------------------------------------------------------------------------------
async def _evenly(run: Run, period_s: float) -> AsyncIterator[int]:
    """Yield about once per `period_s` of the run (at least once), evenly spaced from its
    start; the values count 0, 1, ..."""
    times = max(1, int(run.duration_s / period_s))
    every = run.duration_s / (times + 1)
    began = time.monotonic()
    for i in range(times):
        await asyncio.sleep(max(0.0, began + (i + 1) * every - time.monotonic()))
        yield i


async def _restart_redis(run: Run) -> None:
    async for _ in _evenly(run, 4.0):
        started = time.time()
        await run.stack.redis_restart(down_s=0.5)
        run.fault("redis_restart", f"down {time.time() - started:.2f}s, back from the AOF")


def _verify_restart(run: Run, obs: Observation, stats: dict[str, int]) -> None:
    restarts = sum(1 for _, kind, _ in run.faults if kind == "redis_restart")
    run.expect("Redis was restarted while traffic flowed", restarts >= 1, f"{restarts} restarts")


# --- redis stall --------------------------------------------------------------------------------
STALL_S = 2.0


async def _stall_redis(run: Run) -> None:
    async for _ in _evenly(run, 4.0):
        await run.stack.redis_pause(STALL_S)  # returns at once; Redis ends the pause itself
        run.fault("redis_stall", f"CLIENT PAUSE {STALL_S:g}s ALL")


def _verify_stall(run: Run, obs: Observation, stats: dict[str, int]) -> None:
    # The stall is shorter than the receiver's hold (WEBHOOK_HOLD_S, 4 s): what arrived during
    # it waits for Redis and is answered 200 on its first delivery, late.
    held = sum(
        1
        for m in run.workload.messages.values()
        if m.acked is not None and not m.rejected and m.acked - m.first_sent >= STALL_S / 2
    )
    refused = run.workload.tally.statuses.get(503, 0)
    run.expect(
        "the receiver held webhooks through the stall and stored them",
        held >= 1,
        f"{held} messages answered 200 at the first delivery after >= {STALL_S / 2:g}s;"
        f" {refused} answers 503",
    )


# --- graph faults -------------------------------------------------------------------------------
RETRYABLE_CODES = (131000, 130429, 131056)


async def _graph_faults(run: Run) -> None:
    for person in run.workload.people:
        if person.window_closed:
            await run.stack.graph_control(
                {"op": "fail", "code": 131047, "to": person.phone, "count": None}
            )
    # Three rules tried in turn: 0.1, then 0.1/0.9, then 0.1/0.8 of what is left = 30% in all.
    for i, code in enumerate(RETRYABLE_CODES):
        p = 0.1 / (1 - 0.1 * i)
        await run.stack.graph_control(
            {
                "op": "fail",
                "code": code,
                "probability": p,
                "count": None,
                "seed": 7 if i == 0 else None,
            }
        )
    run.fault("graph_failures", f"30% of sends fail with {RETRYABLE_CODES}; 131047 for some people")


def _verify_graph(run: Run, obs: Observation, stats: dict[str, int]) -> None:
    failed = sum(1 for c in obs.calls if c.kind == "send" and not c.ok)
    sends = sum(1 for c in obs.calls if c.kind == "send")
    run.expect("the Graph API refused sends", failed >= 1, f"{failed} of {sends} sends refused")
    closed = {p.index for p in obs.people if p.window_closed}
    accepted = {c.person for c in obs.calls if c.kind == "send" and c.ok}
    run.expect(
        "nothing was accepted for people whose window is closed",
        not closed & accepted,
        f"{len(closed)} such people; sends accepted for {sorted(closed & accepted) or 'none'}",
    )
    reasons: dict[int, set[str]] = {}
    for item in obs.review:
        for person in {p for p, _ in review_key(item)}:
            reasons.setdefault(person, set()).add(str(item.get("reason")))
    wrong = sorted(
        p for p in closed if reasons.get(p, set()) - {"window_closed"} or p not in reasons
    )
    run.expect(
        "people with a closed window are in review as window_closed",
        not wrong,
        f"{len(closed) - len(wrong)} of {len(closed)}; not so for {wrong or 'none'}",
    )
    others = sorted(p for p, r in reasons.items() if p not in closed and "window_closed" in r)
    run.expect(
        "nobody else is in review as window_closed", not others, f"others: {others or 'none'}"
    )


# --- slow AI ------------------------------------------------------------------------------------
SLOW_LEASE_S = 1.2
SLOW_AI_S = 1.8


async def _slow_ai(run: Run) -> None:
    await run.stack.ai_control({"op": "latency", "seconds": SLOW_AI_S})
    run.fault("slow_ai", f"every AI call takes {SLOW_AI_S}s, the lease is {SLOW_LEASE_S}s")


def _verify_slow(run: Run, obs: Observation, stats: dict[str, int]) -> None:
    longer = sum(
        1
        for c in obs.calls
        if c.kind == "ai" and c.end is not None and c.end - c.start > SLOW_LEASE_S
    )
    run.expect("AI calls outlasted the lease", longer >= 1, f"{longer} calls longer than the lease")
    expired = stats.get("leases_expired", 0)
    run.expect("renewal kept every lease", expired == 0, f"leases_expired={expired}")


# --- AI outage ---------------------------------------------------------------------------------
OUTAGE_S = 60.0  # a run this long or longer gets the whole outage; a shorter one half its time
OUTAGE_RETRY_AFTER_S = 1.0
# The workers run with the default AI pause (AI_OUTAGE_PAUSE_S, AI_OUTAGE_MAX_PAUSE_S unset):
# the checks hold those defaults to what docs/configuration.md promises.
OUTAGE_PAUSE_S = Settings().ai_outage_pause_s
OUTAGE_MAX_PAUSE_S = Settings().ai_outage_max_pause_s
# The shortest pause: no two probes closer than this.
OUTAGE_MIN_PAUSE_S = max(OUTAGE_PAUSE_S, OUTAGE_RETRY_AFTER_S)
# A probe comes this late at most after its pause ends on a loaded machine (the batch's claim,
# the gate's reads, the call itself).
OUTAGE_PROBE_SLACK_S = 2.0
# Answered "soon" after recovery: within the longest pause, a batch's own jitter, a probe and a
# turn, with room for a loaded machine.
OUTAGE_ANSWERED_WITHIN_S = OUTAGE_MAX_PAUSE_S + OUTAGE_PAUSE_S + 5.0


def outage_span(duration_s: float) -> tuple[float, float]:
    """(seconds into the run the outage starts, how long it lasts)."""
    length = OUTAGE_S if duration_s >= OUTAGE_S else duration_s / 2
    return min(duration_s / 4, 5.0), length


async def _ai_outage(run: Run) -> None:
    start, length = outage_span(run.duration_s)
    await asyncio.sleep(start)
    await run.stack.ai_control(
        {
            "op": "outage",
            "seconds": length,
            "error": "overloaded",
            "retry_after": OUTAGE_RETRY_AFTER_S,
        }
    )
    began = time.monotonic()
    run.fault("ai_outage", f"every AI call 529 (retry-after {OUTAGE_RETRY_AFTER_S:g}s)")
    while time.monotonic() - began < length:  # when a worker paused the fleet
        if await run.stack.redis.exists(run.stack.keys.ai_paused):
            run.fault("ai_paused", f"{time.monotonic() - began:.2f}s into the outage")
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(max(0.0, began + length - time.monotonic()))
    run.fault("ai_recovered", f"after {length:g}s")


def _verify_outage(run: Run, obs: Observation, stats: dict[str, int]) -> None:
    began = next(t for t, kind, _ in run.faults if kind == "ai_outage")
    ended = next(t for t, kind, _ in run.faults if kind == "ai_recovered")
    paused = [t for t, kind, _ in run.faults if kind == "ai_paused"]
    failed = sorted(c.start for c in obs.calls if c.kind == "ai" and not c.ok)
    run.expect("AI calls failed during the outage", len(failed) >= 1, f"{len(failed)} failed")
    run.expect(
        "a worker paused the fleet",
        bool(paused),
        f"{paused[0] - began:.2f}s in" if paused else "never",
    )
    # A second after the pause was set (calls in flight then, or started on a view of the
    # pause up to REFRESH_S old), only the probes: at most one per pause, each pause at least
    # the retry-after and AI_OUTAGE_PAUSE_S.
    since = (paused[0] if paused else began) + 1.0
    probes = [t for t in failed if since < t < ended]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    run.expect(
        "the fleet probed at most once per pause",
        min(gaps, default=OUTAGE_MIN_PAUSE_S) >= OUTAGE_MIN_PAUSE_S - 0.05,
        f"{len(probes)} calls from a second after the pause was set, the closest"
        f" {min(gaps, default=0):.2f}s apart (at least {OUTAGE_MIN_PAUSE_S:g}s);"
        f" {len(failed)} failed in all",
    )
    # ...and at least once per longest pause, the first call after recovery included: the AI
    # is asked again within AI_OUTAGE_MAX_PAUSE_S of its return.
    after = [c.start for c in obs.calls if c.kind == "ai" and c.ok and c.start >= began]
    asked = [t for t in failed if t >= began] + sorted(after)[:1]
    longest = max((b - a for a, b in itertools.pairwise(asked)), default=0.0)
    run.expect(
        "the fleet probed at least once per longest pause",
        bool(after) and longest <= OUTAGE_MAX_PAUSE_S + OUTAGE_PROBE_SLACK_S,
        f"the longest gap between calls {longest:.2f}s (at most {OUTAGE_MAX_PAUSE_S:g}s"
        f" + {OUTAGE_PROBE_SLACK_S:g}s); the first call "
        + (f"{min(after) - ended:.2f}s after recovery" if after else "never came"),
    )
    waits, retries = stats.get("ai_waits", 0), stats.get("retries", 0)
    run.expect(
        "batches waited without using up attempts",
        waits >= 1 and retries == 0,
        f"ai_waits={waits} retries={retries}",
    )
    run.expect("nothing went to review", not obs.review, f"{len(obs.review)} items")
    answered: dict[tuple[int, int], float] = {}
    for call in obs.calls:
        if call.kind == "send" and call.ok and call.end is not None:
            for token in call.tokens:
                answered[token] = min(call.end, answered.get(token, call.end))
    waiting = [
        answered[t] - ended
        for t, m in obs.messages.items()
        if m.acked is not None and m.acked < ended and t in answered and answered[t] > ended
    ]
    late = max(waiting, default=0.0)
    run.expect(
        "every conversation waiting at recovery was answered soon after",
        late <= OUTAGE_ANSWERED_WITHIN_S,
        f"{len(waiting)} messages answered after recovery, the last {late:.1f}s after it"
        f" (at most {OUTAGE_ANSWERED_WITHIN_S:g}s)",
    )


# --- redis freeze -------------------------------------------------------------------------------
# Leases as at the defaults (LEASE_S 120, LEASE_RENEW_S 30: four renewals a lease), scaled down
# so that a run of a few seconds holds a freeze and its recovery. `scripts/chaos --set` can put
# the defaults back (the freeze then lasts 60 s).
FREEZE_ENV = {"LEASE_S": "12", "LEASE_RENEW_S": "2"}
FREEZE_RENEWALS = 2  # the freeze lasts this many renewal intervals
# Answered "within seconds" of the freeze's end: a claim, an AI call and a send on a loaded
# machine, or a quarter of the lease if that is longer. The old code took the whole lease.
FREEZE_ANSWERED_WITHIN_S = 5.0


def freeze_span(worker_env: dict[str, str]) -> tuple[float, float]:
    """(how long Redis is frozen, within how long of its end everything waiting is answered)
    for workers running with `worker_env`."""
    lease_s, renew_s = float(worker_env["LEASE_S"]), float(worker_env["LEASE_RENEW_S"])
    return FREEZE_RENEWALS * renew_s, max(FREEZE_ANSWERED_WITHIN_S, lease_s / 4)


async def _freeze_redis(run: Run) -> None:
    frozen_s, _ = freeze_span(run.stack.worker_env)
    await asyncio.sleep(min(run.duration_s / 4, 5.0))
    run.fault("redis_freeze", f"SIGSTOP for {frozen_s:g}s")
    await run.stack.redis_freeze(frozen_s)
    run.fault("redis_thawed", f"after {frozen_s:g}s")


def _verify_freeze(run: Run, obs: Observation, stats: dict[str, int]) -> None:
    froze = next((t for t, kind, _ in run.faults if kind == "redis_freeze"), None)
    thawed = next((t for t, kind, _ in run.faults if kind == "redis_thawed"), None)
    run.expect(
        "Redis was frozen",
        froze is not None and thawed is not None,
        f"for {thawed - froze:.1f}s" if froze and thawed else "never",
    )
    if froze is None or thawed is None:
        return
    _, within_s = freeze_span(run.stack.worker_env)
    answered: dict[tuple[int, int], float] = {}
    for call in obs.calls:
        if call.kind == "send" and call.ok and call.end is not None:
            for token in call.tokens:
                answered[token] = min(call.end, answered.get(token, call.end))
    reviewed = {t for item in obs.review for t in review_key(item)}  # no answer to wait for
    # Stored before the freeze and not answered by then: running or due at the freeze.
    waiting = [
        answered.get(t, math.inf) - thawed
        for t, m in obs.messages.items()
        if m.acked is not None
        and m.acked < froze
        and t not in reviewed
        and answered.get(t, math.inf) > froze
    ]
    late = max(waiting, default=0.0)
    run.expect(
        "what waited at the freeze was answered within seconds of its end",
        bool(waiting) and late <= within_s,
        f"{len(waiting)} messages stored before the freeze answered after it, the last"
        f" {late:.1f}s after Redis answered again (at most {within_s:g}s)",
    )
    expired = stats.get("leases_expired", 0)
    run.expect("no lease expired", expired == 0, f"leases_expired={expired}")


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "kill",
            "SIGKILL of a worker mid-turn, several times",
            _kill_workers,
            _verify_kill,
            env={"LEASE_S": "1.5", "LEASE_RENEW_S": "0.3"},
            policy=Policy(resend_after_kill=True),
        ),
        Scenario(
            "redis_restart", "Redis crash + restart from AOF", _restart_redis, _verify_restart
        ),
        Scenario(
            "redis_stall",
            f"Redis stalled {STALL_S:g}s (CLIENT PAUSE)",
            _stall_redis,
            _verify_stall,
            env={"LEASE_S": "5", "LEASE_RENEW_S": "0.5"},
        ),
        Scenario(
            "graph_faults",
            "30% retryable send failures, 131047 for some people",
            _graph_faults,
            _verify_graph,
            env={"MAX_ATTEMPTS": "6", "RETRY_BASE_S": "0.1"},
            policy=Policy(ai_once_per_batch=True),
            window_closed_people=-1,  # about one in eight
        ),
        Scenario(
            "slow_ai",
            f"AI calls of {SLOW_AI_S:g}s, lease {SLOW_LEASE_S:g}s",
            _slow_ai,
            _verify_slow,
            env={"LEASE_S": str(SLOW_LEASE_S), "LEASE_RENEW_S": "0.25", "WORKER_CONCURRENCY": "40"},
            policy=Policy(ai_once_per_batch=True),
        ),
        Scenario(
            "chatwoot_outage",
            f"Redis down {chatwoot_outage.OUTAGE_S:g}s while Chatwoot customers write",
            chatwoot_outage.inject,
            chatwoot_outage.verify,
            # A lease longer than the outage: a turn whose finish Redis could not take keeps
            # its lease and records what it sent once Redis is back. With a shorter lease the
            # batch is taken over and its reply sent again (WhatsApp's too): a limit of the
            # leases under a long outage, not of the catch-up (see chatwoot_outage.py).
            env={"LEASE_S": str(chatwoot_outage.LEASE_S), "LEASE_RENEW_S": "0.5"},
            chatwoot=True,
        ),
        Scenario(
            "ai_outage",
            f"AI calls 529 for {OUTAGE_S:g}s (half a short run), then answered",
            _ai_outage,
            _verify_outage,
            # Three attempts survive 0.6 s of failures if outages were counted: every outage
            # here is longer. The AI pause runs with its defaults.
            env={"MAX_ATTEMPTS": "3"},
        ),
        Scenario(
            "redis_freeze",
            "Redis frozen (SIGSTOP) for two lease renewals, once",
            _freeze_redis,
            _verify_freeze,
            env=FREEZE_ENV,
        ),
    )
}


@dataclass
class Report:
    scenario: str
    duration_s: float
    figures: dict[str, Any]
    faults: list[tuple[float, str, str]]
    violations: list[Violation]
    run_dir: Path
    effects: list[tuple[str, bool, str]] = field(default_factory=list)
    logs: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        f = self.figures
        lines = [
            f"scenario {self.scenario}: {self.duration_s:.0f}s of traffic, {f['people']} people, "
            f"{f['workers']} workers",
            f"  messages {f['messages']} ({f['deliveries']} deliveries, "
            f"{f['duplicate_deliveries']} duplicates, {f['answers_not_200']} answers not 200), "
            f"acknowledged {f['acknowledged']}",
            f"  turns {f['batches_answered']} answered, {f['batches_in_review']} in review "
            f"{f['review_reasons']}; AI calls {f['ai_calls']} ({f['ai_calls_repeated']} repeated), "
            f"sends accepted {f['sends_accepted']} of {f['sends']}",
            f"  bursts {f['bursts']} ({f['bursts_held_to_one_turn']} held to one turn); "
            f"retries {f['retries']}, waits for the AI {f['ai_waits']}, "
            f"leases expired {f['leases_expired']}, "
            f"resent after kill {f['resent_after_kill']}",
            "  faults injected: "
            + (", ".join(f"{n} {k}" for k, n in Counter(k for _, k, _ in self.faults).items())),
            *(f"  fault effect: {what}: {detail}" for what, _, detail in self.effects),
            f"  drained in {f['drain_s']:.1f}s{_timeout_note(f)}; keys left {f['keys_left']}, "
            f"{f['bytes_left_total']} B (MEMORY USAGE)",
            f"  redis used_memory {f['memory_baseline']['used_memory']} B before traffic, "
            f"{f['memory_after']['used_memory']} B after; restarted from its AOF alone: "
            f"{f['reloaded']['keys']} keys, dataset {f['reloaded']['dataset_bytes']} B",
            f"violations: {len(self.violations)}",
        ]
        lines += [f"  {v}" for v in self.violations[:50]]
        return "\n".join(lines)


def _timeout_note(figures: dict[str, Any]) -> str:
    still = figures["in_flight_at_drain_timeout"]
    return f" (timed out, still in flight: {still})" if still else ""


async def run_scenario(
    name: str,
    *,
    duration_s: float = 5.0,
    people: int = 24,
    workers: int = 3,
    seed: int = 1,
    run_dir: Path | None = None,
    drain_timeout_s: float = 30.0,
    worker_env: dict[str, str] | None = None,
) -> Report:
    """`worker_env`: settings of the workers over the scenario's own (`scripts/chaos --set`)."""
    scenario = SCENARIOS[name]
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix=f"chaos-{name}-"))
    env = {**BASE_ENV, **scenario.env, **(worker_env or {})}
    stack = Stack(run_dir, workers=workers, worker_env=env, chatwoot=scenario.chatwoot)
    closed = scenario.window_closed_people
    if closed < 0:
        closed = max(1, people // 8)
    workload = Workload(
        stack.receiver_url, APP_SECRET, people, WINDOW_S, seed=seed, window_closed_people=closed
    )
    run = Run(stack, workload, duration_s, random.Random(seed))
    try:
        await stack.start()
        baseline = await observe.memory(stack)
        injector = asyncio.create_task(scenario.inject(run))
        await workload.run(duration_s)
        await injector
        drain_s, still = await observe.drain(stack, drain_timeout_s)
        return await _report(scenario, run, baseline, (drain_s, still), run_dir)
    finally:
        await stack.close()


async def _report(
    scenario: Scenario,
    run: Run,
    baseline: dict[str, int],
    drained: tuple[float, dict[str, int]],
    run_dir: Path,
) -> Report:
    stack, workload = run.stack, run.workload
    after = await observe.memory(stack)
    ai_records, graph_records = await stack.ai_records(), await stack.graph_records()
    calls = observe.calls_from(workload, ai_records, graph_records)
    left, bytes_by_kind = await observe.leftover_keys(stack)
    review = await observe.review_items(stack)
    stats = await observe.stats(stack)
    if stack.chatwoot:
        run.notes["chatwoot"] = await stack.chatwoot_records()
    obs = Observation(
        people=workload.people,
        messages=workload.messages,
        bursts=workload.bursts,
        calls=calls,
        review=review,
        left=left,
        kills=run.kills,
        window_s=WINDOW_S,
        max_wait_s=MAX_WAIT_S,
        policy=scenario.policy,
    )
    outcome = check(obs)
    scenario.verify(run, obs, stats)
    violations = list(outcome.violations)
    for what, ok, detail in run.expectations:
        if not ok:
            violations.append(
                Violation(f"fault:{scenario.name}", "-", f"{what}: not so ({detail})")
            )
    tally = workload.tally
    reasons: dict[str, int] = {}
    for item in review:
        reasons[str(item.get("reason"))] = reasons.get(str(item.get("reason")), 0) + 1
    figures: dict[str, Any] = {
        "people": len(workload.people),
        "workers": stack.worker_count,
        "messages": len(workload.messages),
        "acknowledged": sum(1 for m in workload.messages.values() if m.acked is not None),
        "deliveries": tally.deliveries,
        "duplicate_deliveries": tally.duplicate_deliveries,
        "answers_not_200": sum(n for s, n in tally.statuses.items() if s != 200)
        + tally.connection_errors,
        "ai_calls": sum(1 for c in calls if c.kind == "ai"),
        "sends": sum(1 for c in calls if c.kind == "send"),
        "sends_accepted": sum(1 for c in calls if c.kind == "send" and c.ok),
        "review_reasons": reasons,
        "retries": stats.get("retries", 0),
        "ai_waits": stats.get("ai_waits", 0),
        "leases_expired": stats.get("leases_expired", 0),
        "turns_counted": stats.get("turns", 0),
        "drain_s": drained[0],
        "in_flight_at_drain_timeout": drained[1],
        "memory_baseline": baseline,
        "memory_after": after,
        "keys_left": {
            k.removeprefix("keys_left_"): v
            for k, v in outcome.figures.items()
            if k.startswith("keys_left_") and v
        },
        "bytes_left": bytes_by_kind,
        "bytes_left_total": sum(bytes_by_kind.values()),
        **outcome.figures,
    }
    (run_dir / "faults.json").write_text(json.dumps(run.faults, indent=1))
    logs = stack.dump() if violations else ""
    figures["reloaded"] = await observe.reloaded_dataset(stack)
    return Report(
        scenario.name,
        run.duration_s,
        figures,
        run.faults,
        violations,
        run_dir,
        effects=run.expectations,
        logs=logs,
    )
