"""The invariants, checked after a run from what the stand-ins recorded and what Redis holds.

Pure functions over an `Observation`: no I/O, so each check is tested on its own with records
made to break it (tests/chaos/test_checks.py). What "a batch" is, from the outside: the set of
message tokens named by one AI request (the batch's text), by one reply sent (the stand-in's
reply quotes that text) or by one review item (its messages). A message "is in a turn" when the
batch holding it was answered (a send the Graph API accepted) and "in review" when a review
item holds it.

What is checked (each violation names its invariant and the person):
- `acknowledged`: every message was acknowledged with 200 in the end, and no two deliveries of
  one message were both stored (the receiver's `x-stored` count).
- `exactly_once`: every acknowledged message is in exactly one batch, and that batch was
  either answered or is in review, not both and not neither.
- `one_turn_at_a_time`: no two stand-in requests of one person (AI call, read receipt, send)
  were in flight at once. A worker makes a turn's requests one after the other, so two at once
  means two turns of that person overlapped.
- `order`: a person's batches, in the order their AI requests arrived, hold increasing message
  numbers, each batch's messages in the order written, and no batch comes back after a later one.
- `burst_one_turn`: a burst whose messages were each stored within one window of the previous
  one, and its last within `max_wait` of the first message of its batch, is one batch. From the
  client's side that is certain when `ack(m[i+1]) - first_send(m[i]) < window` for each pair and
  `ack(last) - first_send(f) < max_wait`, f being the first message of the batch that holds the
  burst's first message (a message is stored after its first send started and before its 200
  came back; a batch is claimed no earlier than a window after its latest message was stored,
  nor than `max_wait` after its first, which may belong to an earlier burst still waiting, e.g.
  behind a killed worker's lease). Bursts that a fault delayed past that (a 503 and its retry,
  say) are not held to it: the condition is computed per burst.
- `reply_once`: no reply was accepted twice by the Graph API. The one excused case is a part in
  flight at a SIGKILL, before its id was recorded (Meta has no idempotency key): allowed only
  when the scenario kills workers and a kill fell within a second of that send (before its
  arrival at the stand-in, or after its answer); counted as `resent_after_kill`.
- `ai_not_asked_again`: no AI request for a batch after its reply was accepted; in scenarios
  where nothing can lose a stored reply's turn, not more than one AI request per batch at all.
- `nothing_in_flight`: no inbox entries, due/running/burst entries, pending, batch or lock keys
  are left; nothing unroutable or dead-lettered; every leftover key of an expiring kind (dedupe
  markers, window markers, memories, outbound records) has a TTL.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from scripts.chaos_harness.workload import Burst, Message, Person, tokens_in

Token = tuple[int, int]
BatchKey = tuple[Token, ...]

# "catchup_wanted": a Chatwoot catch-up asked for and never run (worker/fleet/chatwoot_catchup.py)
IN_FLIGHT_KINDS = frozenset(
    {"inbox", "due", "running", "burst", "pending", "batch", "lock", "catchup_wanted"}
)
# "sweep": the fleet's safety-sweep guard (SET NX PX, worker/fleet/sweep.py); "ai_pause": the
# fleet's AI pause and probe token (PX, worker/brains/ai_pause.py); "human": a person's pause after
# a review that needs a person (PX HUMAN_PAUSE_S, shared/ops/takeover.py); "sent", "late": what late
# delivery failures need (shared/conversation/late_failure_codes.py); "catchup_guard": the
# Chatwoot catch-up's lock and periodic guard (PX)
EXPIRING_KINDS = frozenset(
    {
        *("seen", "out", "lastin", "memory", "context", "sweep", "ai_pause", "human", "sent"),
        *("late", "catchup_guard"),
    }
)
# "workers": the live workers' heartbeats (shared/fleet/heartbeats.py), pruned by the workers;
# "users" (user id -> number) is kept like a contact list; the rest for people to read and empty
# "catchup": the Chatwoot catch-up's cursor per inbox (kept, like the registry); "convs": the
# ops inbox's index of conversations by last activity (bounded by count and age when written)
KEPT_KINDS = frozenset(
    {"tenants", "stats", "review", "workers", "users", "catchup", "convs", "functions"}
)
FORBIDDEN_KINDS = frozenset({"unroutable", "deadletter", "outbox", "other"})
OVERLAP_TOLERANCE_S = 0.001
# A send counts as in flight at a kill that fell within this long of it: before its arrival
# (a loaded stand-in reads a request well after the client wrote it: 90 ms seen) or after its
# answer (before the finish recorded its id).
KILL_EXCUSE_S = 1.0
BURST_MARGIN_S = 0.05


@dataclass(frozen=True)
class Violation:
    invariant: str
    person: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] person {self.person}: {self.detail}"


@dataclass(frozen=True)
class Call:
    """One request a stand-in received on behalf of a turn."""

    kind: str  # "ai", "read" or "send"
    person: int
    start: float
    end: float | None
    ok: bool
    tokens: BatchKey
    text: str = ""


@dataclass(frozen=True)
class LeftKey:
    key: str
    kind: str
    person: str | None
    ttl_s: int  # -1 no expiry, -2 gone


@dataclass
class Policy:
    """What a scenario allows or demands beyond the invariants every scenario checks."""

    resend_after_kill: bool = False
    ai_once_per_batch: bool = False


@dataclass
class Observation:
    people: list[Person]
    messages: dict[Token, Message]
    bursts: list[Burst]
    calls: list[Call]
    review: list[dict[str, Any]]
    left: list[LeftKey]
    kills: list[float]
    window_s: float
    max_wait_s: float
    policy: Policy = field(default_factory=Policy)


@dataclass
class Outcome:
    violations: list[Violation] = field(default_factory=list)
    figures: dict[str, int] = field(default_factory=dict)


def check(obs: Observation) -> Outcome:
    out = Outcome()
    _acknowledged(obs, out)
    batches = _exactly_once(obs, out)
    _one_turn_at_a_time(obs, out)
    _order(obs, out)
    _bursts(obs, out, batches)
    _reply_once(obs, out)
    _ai_not_asked_again(obs, out)
    _nothing_in_flight(obs, out)
    return out


def _name(obs: Observation, person: int) -> str:
    return f"{obs.people[person].phone} (#{person})" if person < len(obs.people) else f"#{person}"


def _acknowledged(obs: Observation, out: Outcome) -> None:
    for message in obs.messages.values():
        if message.acked is None:
            out.violations.append(
                Violation(
                    "acknowledged",
                    _name(obs, message.person),
                    f"message {message.seq} never got a 200 ({message.attempts} attempts)",
                )
            )
        if message.stored > 1:
            out.violations.append(
                Violation(
                    "acknowledged",
                    _name(obs, message.person),
                    f"message {message.seq} was stored {message.stored} times (dedupe failed)",
                )
            )


def review_key(item: dict[str, Any]) -> BatchKey:
    """The tokens of a review item's messages, in order."""
    found: list[Token] = []
    for event in item.get("messages") or []:
        if isinstance(event, dict):
            found += tokens_in(str(event.get("text", "")))
    return tuple(found)


def _exactly_once(obs: Observation, out: Outcome) -> dict[Token, set[BatchKey]]:
    answered = {c.tokens for c in obs.calls if c.kind == "send" and c.ok and c.tokens}
    reviewed = {k for k in (review_key(i) for i in obs.review) if k}
    # A send that reached the stand-in but whose answer the worker never got is in review as
    # delivery_unknown on purpose (never sent again, a person told): answered AND in review.
    unknown = {review_key(i) for i in obs.review if i.get("reason") == "delivery_unknown"}
    out.figures["delivery_unknown_answered"] = 0
    seen = {c.tokens for c in obs.calls if c.kind == "ai" and c.tokens} | answered | reviewed
    batches: dict[Token, set[BatchKey]] = defaultdict(set)
    for key in seen:
        owners = {person for person, _ in key}
        if len(owners) > 1:
            out.violations.append(
                Violation(
                    "exactly_once",
                    ", ".join(_name(obs, p) for p in sorted(owners)),
                    f"one batch holds messages of several people: {list(key)}",
                )
            )
        for token in key:
            batches[token].add(key)
    for token, message in sorted(obs.messages.items()):
        if message.acked is None:
            continue
        keys = batches.get(token, set())
        who = _name(obs, message.person)
        if len(keys) > 1:
            out.violations.append(
                Violation(
                    "exactly_once",
                    who,
                    f"message {message.seq} is in {len(keys)} batches: {sorted(map(_seqs, keys))}",
                )
            )
            continue
        if not keys:
            out.violations.append(
                Violation(
                    "exactly_once", who, f"message {message.seq} was acknowledged but is lost"
                )
            )
            continue
        (key,) = keys
        if key in answered and key in unknown:
            out.figures["delivery_unknown_answered"] += 1
        elif key in answered and key in reviewed:
            out.violations.append(
                Violation("exactly_once", who, f"batch {_seqs(key)} was answered and is in review")
            )
        elif key not in answered and key not in reviewed:
            out.violations.append(
                Violation(
                    "exactly_once",
                    who,
                    f"batch {_seqs(key)} (message {message.seq}) was neither answered nor "
                    "put in review",
                )
            )
    out.figures["batches_answered"] = len(answered)
    out.figures["batches_in_review"] = len(reviewed)
    return batches


def _seqs(key: BatchKey) -> list[int]:
    return [seq for _, seq in key]


def _per_person(calls: list[Call], kinds: frozenset[str]) -> dict[int, list[Call]]:
    grouped: dict[int, list[Call]] = defaultdict(list)
    for call in calls:
        if call.kind in kinds:
            grouped[call.person].append(call)
    for person_calls in grouped.values():
        person_calls.sort(key=lambda c: c.start)
    return grouped


def _one_turn_at_a_time(obs: Observation, out: Outcome) -> None:
    for person, calls in _per_person(obs.calls, frozenset({"ai", "read", "send"})).items():
        busy_until, busy_with = float("-inf"), None
        for call in calls:
            if busy_with is not None and call.start < busy_until - OVERLAP_TOLERANCE_S:
                out.violations.append(
                    Violation(
                        "one_turn_at_a_time",
                        _name(obs, person),
                        f"{call.kind} for batch {_seqs(call.tokens)} started at "
                        f"{call.start:.3f} while {busy_with.kind} for batch "
                        f"{_seqs(busy_with.tokens)} was in flight until {busy_until:.3f}",
                    )
                )
            end = call.end if call.end is not None else call.start
            if end > busy_until:
                busy_until, busy_with = end, call


def _order(obs: Observation, out: Outcome) -> None:
    for person, calls in _per_person(obs.calls, frozenset({"ai"})).items():
        who = _name(obs, person)
        done: list[BatchKey] = []
        for call in calls:
            seqs = _seqs(call.tokens)
            if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
                out.violations.append(
                    Violation("order", who, f"batch messages out of order: {seqs}")
                )
            if done and call.tokens == done[-1]:
                continue  # the same batch asked again (a retry): not a new position
            if call.tokens in done:
                out.violations.append(
                    Violation("order", who, f"batch {seqs} came back after batch {_seqs(done[-1])}")
                )
            elif done and seqs and max(_seqs(done[-1])) >= min(seqs):
                out.violations.append(
                    Violation("order", who, f"batch {seqs} came after batch {_seqs(done[-1])}")
                )
            done.append(call.tokens)


def must_be_one_turn(
    burst: Burst,
    messages: dict[Token, Message],
    window_s: float,
    max_wait_s: float,
    batch_first: Message | None = None,
) -> bool:
    """Whether the client's timings prove every message of the burst was stored before its
    batch could be claimed (see the module docstring). `batch_first` is the first message of
    the batch holding the burst's first message: when earlier messages were still waiting,
    the batch's max wait runs from that one."""
    ms = [messages[(burst.person, seq)] for seq in burst.seqs]
    if any(m.acked is None for m in ms):
        return False
    for before, after in itertools.pairwise(ms):
        assert after.acked is not None
        if after.acked - before.first_sent >= window_s - BURST_MARGIN_S:
            return False
    last = ms[-1].acked
    assert last is not None
    first = min(ms[0].first_sent, batch_first.first_sent if batch_first else ms[0].first_sent)
    return last - first < max_wait_s - BURST_MARGIN_S


def _bursts(obs: Observation, out: Outcome, batches: dict[Token, set[BatchKey]]) -> None:
    held = split = 0
    for burst in obs.bursts:
        first = (burst.person, burst.seqs[0])
        holding = sorted(batches.get(first, set()))
        batch_first = obs.messages.get(holding[0][0]) if holding else None
        if len(burst.seqs) < 2 or not must_be_one_turn(
            burst, obs.messages, obs.window_s, obs.max_wait_s, batch_first
        ):
            continue
        held += 1
        wanted = {(burst.person, s) for s in burst.seqs}
        if not any(wanted <= set(key) for key in batches.get(first, set())):
            split += 1
            found = sorted({k for t in wanted for k in batches.get(t, set())})
            out.violations.append(
                Violation(
                    "burst_one_turn",
                    _name(obs, burst.person),
                    f"burst {burst.seqs} was split: batches {[_seqs(k) for k in found]}",
                )
            )
    out.figures["bursts"] = len(obs.bursts)
    out.figures["bursts_held_to_one_turn"] = held


def _reply_once(obs: Observation, out: Outcome) -> None:
    sends: dict[tuple[int, str], list[Call]] = defaultdict(list)
    for call in obs.calls:
        if call.kind == "send" and call.ok:
            sends[(call.person, call.text)].append(call)
    excused = 0
    for (person, _), calls in sends.items():
        calls.sort(key=lambda c: c.start)
        first = calls[0]
        for again in calls[1:]:
            end = first.end if first.end is not None else first.start
            in_flight_at_kill = any(
                first.start - KILL_EXCUSE_S <= t <= end + KILL_EXCUSE_S and t <= again.start
                for t in obs.kills
            )
            if obs.policy.resend_after_kill and in_flight_at_kill:
                excused += 1
                continue
            out.violations.append(
                Violation(
                    "reply_once",
                    _name(obs, person),
                    f"reply to batch {_seqs(first.tokens)} accepted {len(calls)} times "
                    f"(at {', '.join(f'{c.start:.3f}' for c in calls)})",
                )
            )
            break
    out.figures["resent_after_kill"] = excused


def _ai_not_asked_again(obs: Observation, out: Outcome) -> None:
    sent_at: dict[BatchKey, float] = {}
    for call in obs.calls:
        if call.kind == "send" and call.ok and call.end is not None:
            sent_at[call.tokens] = min(call.end, sent_at.get(call.tokens, call.end))
    asked: Counter[BatchKey] = Counter()
    for call in obs.calls:
        if call.kind != "ai":
            continue
        asked[call.tokens] += 1
        if call.tokens in sent_at and call.start > sent_at[call.tokens]:
            out.violations.append(
                Violation(
                    "ai_not_asked_again",
                    _name(obs, call.person),
                    f"AI asked for batch {_seqs(call.tokens)} after its reply was accepted",
                )
            )
    repeated = sum(n - 1 for n in asked.values())
    out.figures["ai_calls_repeated"] = repeated
    if obs.policy.ai_once_per_batch:
        for key, n in sorted(asked.items()):
            if n > 1:
                out.violations.append(
                    Violation(
                        "ai_not_asked_again",
                        _name(obs, key[0][0]) if key else "?",
                        f"AI asked {n} times for batch {_seqs(key)}",
                    )
                )


def _nothing_in_flight(obs: Observation, out: Outcome) -> None:
    for left in obs.left:
        who = left.person or "-"
        if left.kind in IN_FLIGHT_KINDS:
            out.violations.append(
                Violation("nothing_in_flight", who, f"{left.kind} key left: {left.key}")
            )
        elif left.kind in FORBIDDEN_KINDS:
            out.violations.append(
                Violation("nothing_in_flight", who, f"unexpected {left.kind} key: {left.key}")
            )
        elif left.kind in EXPIRING_KINDS and left.ttl_s == -1:
            out.violations.append(
                Violation("nothing_in_flight", who, f"{left.kind} key never expires: {left.key}")
            )
    counts = Counter(left.kind for left in obs.left)
    for kind in sorted(EXPIRING_KINDS | KEPT_KINDS):
        out.figures[f"keys_left_{kind}"] = counts.get(kind, 0)
