"""The chaos suite's checks, each fed records made to break exactly one invariant.

A chaos run that finds nothing proves something only if the checks can find something: every
invariant here is shown to fail, naming itself and the person, on records that break it, and
to pass on the same records unbroken. Pure logic, no processes.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, cast

import pytest

from scripts.chaos_harness.checks import (
    Call,
    LeftKey,
    Observation,
    Policy,
    Violation,
    check,
)
from scripts.chaos_harness.observe import classify
from scripts.chaos_harness.scenarios import (
    FREEZE_ANSWERED_WITHIN_S,
    FREEZE_ENV,
    OUTAGE_ANSWERED_WITHIN_S,
    SCENARIOS,
    Run,
)
from scripts.chaos_harness.workload import TENANTS, Burst, Message, Person, tokens_in
from shared.keys import Keys

WINDOW_S = 0.4
MAX_WAIT_S = 4.0
ALICE, BOB = 0, 1


def people() -> list[Person]:
    return [Person(ALICE, "5491100000000", TENANTS[0]), Person(BOB, "5491100000001", TENANTS[1])]


def message(person: int, seq: int, sent: float, acked: float | None = None) -> Message:
    return Message(
        person,
        seq,
        burst=0,
        wamid=f"wamid.t.{person}.{seq}",
        body=b"",
        first_sent=sent,
        acked=sent + 0.01 if acked is None else acked,
        attempts=1,
        stored=1,
    )


def turn(person: int, seqs: list[int], start: float, *, sent: bool = True) -> list[Call]:
    """A turn as the stand-ins see it: read receipt, AI call, then the reply's send."""
    tokens = tuple((person, s) for s in seqs)
    text = "stand-in reply to: " + "\n".join(f"c{person}x{s} hola" for s in seqs)
    return [
        Call("read", person, start, start + 0.01, True, tokens[-1:]),
        Call("ai", person, start + 0.02, start + 0.1, True, tokens),
        Call("send", person, start + 0.11, start + 0.15, sent, tokens, text),
    ]


def clean() -> Observation:
    """Alice writes a burst of two then one message; Bob one. Each burst is one turn."""
    messages = [
        message(ALICE, 0, 10.0),
        message(ALICE, 1, 10.1),
        message(ALICE, 2, 12.0),
        message(BOB, 0, 10.05),
    ]
    return Observation(
        people=people(),
        messages={m.token: m for m in messages},
        bursts=[Burst(ALICE, 0, [0, 1]), Burst(ALICE, 1, [2]), Burst(BOB, 2, [0])],
        calls=turn(ALICE, [0, 1], 10.6) + turn(ALICE, [2], 12.5) + turn(BOB, [0], 10.5),
        review=[],
        left=[],
        kills=[],
        window_s=WINDOW_S,
        max_wait_s=MAX_WAIT_S,
    )


def violations(obs: Observation) -> list[Violation]:
    return check(obs).violations


def only(obs: Observation, invariant: str) -> Violation:
    found = violations(obs)
    assert [v.invariant for v in found] == [invariant], found
    return found[0]


def test_clean_records_pass() -> None:
    outcome = check(clean())
    assert outcome.violations == []
    assert outcome.figures["batches_answered"] == 3
    assert outcome.figures["bursts_held_to_one_turn"] == 1


def test_a_message_never_acknowledged() -> None:
    obs = clean()
    obs.messages[(BOB, 0)].acked = None
    obs.calls = [c for c in obs.calls if c.person != BOB]
    v = only(obs, "acknowledged")
    assert "5491100000001" in v.person and "never got a 200" in v.detail


def test_a_message_stored_twice() -> None:
    obs = clean()
    obs.messages[(ALICE, 2)].stored = 2
    assert "stored 2 times" in only(obs, "acknowledged").detail


def test_an_acknowledged_message_that_is_lost() -> None:
    obs = clean()
    obs.calls = [c for c in obs.calls if c.person != BOB]
    v = only(obs, "exactly_once")
    assert "5491100000001" in v.person and "lost" in v.detail


def test_a_batch_asked_but_neither_answered_nor_in_review() -> None:
    obs = clean()
    obs.calls = [c for c in obs.calls if not (c.person == BOB and c.kind == "send")]
    assert "neither answered nor put in review" in only(obs, "exactly_once").detail


def test_a_batch_in_review_counts_as_handled() -> None:
    obs = clean()
    obs.calls = [c for c in obs.calls if not (c.person == BOB and c.kind == "send")]
    obs.review = [{"reason": "window_closed", "messages": [{"text": "c1x0 hola"}]}]
    assert violations(obs) == []


def test_a_batch_answered_and_in_review() -> None:
    obs = clean()
    obs.review = [{"reason": "max_attempts", "messages": [{"text": "c1x0 hola"}]}]
    assert "answered and is in review" in only(obs, "exactly_once").detail


def test_a_send_accepted_whose_answer_was_lost_is_answered_and_in_review() -> None:
    """delivery_unknown: the stand-in accepted the part, the worker never heard so and told a
    person instead of sending it again. Not a violation; counted."""
    obs = clean()
    obs.review = [{"reason": "delivery_unknown", "messages": [{"text": "c1x0 hola"}]}]
    outcome = check(obs)
    assert outcome.violations == []
    assert outcome.figures["delivery_unknown_answered"] == 1


def test_a_message_in_two_batches() -> None:
    obs = clean()
    # Alice's message 2 answered alone, and again together with a message 1 answered before.
    obs.calls += turn(ALICE, [1, 2], 14.0)
    found = violations(obs)
    assert {v.invariant for v in found} >= {"exactly_once"}
    assert any("in 2 batches" in v.detail and "5491100000000" in v.person for v in found)


def test_two_turns_of_one_person_at_once() -> None:
    obs = clean()
    second = turn(ALICE, [2], 12.5)
    # Alice's second turn's AI call starts while her first turn's send is still in flight.
    obs.calls = turn(ALICE, [0, 1], 10.6) + [replace(c, start=c.start - 1.84) for c in second]
    obs.calls += turn(BOB, [0], 10.5)
    found = [v for v in violations(obs) if v.invariant == "one_turn_at_a_time"]
    assert found and "5491100000000" in found[0].person
    assert "in flight" in found[0].detail


def test_turns_of_different_people_may_overlap() -> None:
    obs = clean()
    obs.calls = turn(ALICE, [0, 1], 10.6) + turn(ALICE, [2], 12.5) + turn(BOB, [0], 10.6)
    assert violations(obs) == []


def test_batches_out_of_order() -> None:
    obs = clean()
    obs.calls = turn(ALICE, [2], 10.6) + turn(ALICE, [0, 1], 12.5) + turn(BOB, [0], 10.5)
    v = only(obs, "order")
    assert "5491100000000" in v.person and "came after batch [2]" in v.detail


def test_a_batch_coming_back_after_a_later_one() -> None:
    obs = clean()
    ai_again = Call("ai", ALICE, 13.0, 13.1, True, ((ALICE, 0), (ALICE, 1)))
    obs.calls.append(ai_again)
    found = [v for v in violations(obs) if v.invariant == "order"]
    assert found and "came back after batch [2]" in found[0].detail


def test_a_burst_split_in_two_turns() -> None:
    obs = clean()
    obs.calls = (
        turn(ALICE, [0], 10.6)
        + turn(ALICE, [1], 11.0)
        + turn(ALICE, [2], 12.5)
        + turn(BOB, [0], 10.5)
    )
    v = only(obs, "burst_one_turn")
    assert "5491100000000" in v.person and "burst [0, 1] was split" in v.detail


def test_a_burst_a_fault_delayed_is_not_held_to_one_turn() -> None:
    obs = clean()
    # Message 1 was only acknowledged a window after message 0 was first sent (a 503 and its
    # retry): its batch may rightly have been claimed before it was stored.
    obs.messages[(ALICE, 1)].acked = 10.0 + WINDOW_S
    obs.calls = (
        turn(ALICE, [0], 10.6)
        + turn(ALICE, [1], 11.0)
        + turn(ALICE, [2], 12.5)
        + turn(BOB, [0], 10.5)
    )
    outcome = check(obs)
    assert outcome.violations == []
    assert outcome.figures["bursts_held_to_one_turn"] == 0


def test_a_burst_longer_than_max_wait_is_not_held_to_one_turn() -> None:
    obs = clean()
    obs.max_wait_s = 0.1
    obs.calls = (
        turn(ALICE, [0], 10.6)
        + turn(ALICE, [1], 11.0)
        + turn(ALICE, [2], 12.5)
        + turn(BOB, [0], 10.5)
    )
    assert violations(obs) == []


def test_a_burst_cut_by_the_max_wait_of_an_earlier_waiting_message_is_not_held() -> None:
    obs = clean()
    # Alice's message 0 waited (a slow turn before it, say) and formed one batch with the
    # first message of the next burst; max wait from message 0 ended before message 2 came.
    obs.messages[(ALICE, 2)] = message(ALICE, 2, 10.0 + MAX_WAIT_S - 0.2)
    obs.messages[(ALICE, 3)] = message(ALICE, 3, 10.0 + MAX_WAIT_S)
    obs.bursts = [Burst(ALICE, 0, [0]), Burst(ALICE, 1, [1, 2, 3]), Burst(BOB, 2, [0])]
    obs.calls = (
        turn(ALICE, [0, 1, 2], 10.0 + MAX_WAIT_S + 0.001)
        + turn(ALICE, [3], 15.0)
        + turn(BOB, [0], 10.5)
    )
    obs.messages[(ALICE, 1)].first_sent = 10.0 + MAX_WAIT_S - 0.35
    obs.messages[(ALICE, 1)].acked = 10.0 + MAX_WAIT_S - 0.34
    outcome = check(obs)
    assert outcome.violations == []
    # The same burst in a batch of its own is held to one turn.
    obs.calls = (
        turn(ALICE, [0], 10.5) + turn(ALICE, [1, 2], 14.3) + turn(ALICE, [3], 15.0)
    ) + turn(BOB, [0], 10.5)
    assert "burst [1, 2, 3] was split" in only(obs, "burst_one_turn").detail


def resent(obs: Observation, at: float) -> Observation:
    (send,) = [c for c in obs.calls if c.person == BOB and c.kind == "send"]
    obs.calls.append(replace(send, start=at, end=at + 0.04))
    return obs


def test_a_reply_sent_twice() -> None:
    v = only(resent(clean(), 14.0), "reply_once")
    assert "5491100000001" in v.person and "accepted 2 times" in v.detail


def test_a_reply_in_flight_at_a_kill_is_excused_only_in_the_kill_scenario() -> None:
    obs = resent(clean(), 14.0)
    obs.kills = [10.62 + 0.5]  # Bob's send was answered at 10.65; killed before its record
    assert only(obs, "reply_once")  # no policy: still a violation
    obs.policy = Policy(resend_after_kill=True)
    outcome = check(obs)
    assert outcome.violations == []
    assert outcome.figures["resent_after_kill"] == 1


def test_a_kill_just_before_the_send_reached_the_stand_in_excuses_it() -> None:
    # The worker wrote the request and died; the loaded stand-in read it 90 ms later.
    obs = resent(clean(), 14.0)
    obs.kills = [10.61 - 0.09]
    obs.policy = Policy(resend_after_kill=True)
    assert check(obs).figures["resent_after_kill"] == 1


def test_a_kill_long_after_the_send_excuses_nothing() -> None:
    obs = resent(clean(), 14.0)
    obs.kills = [13.0]
    obs.policy = Policy(resend_after_kill=True)
    assert only(obs, "reply_once")


def test_the_ai_asked_again_after_the_reply_was_accepted() -> None:
    obs = clean()
    obs.calls.append(Call("ai", BOB, 11.0, 11.1, True, ((BOB, 0),)))
    v = only(obs, "ai_not_asked_again")
    assert "5491100000001" in v.person and "after its reply was accepted" in v.detail


def test_the_ai_asked_twice_where_nothing_excuses_it() -> None:
    obs = clean()
    obs.calls.insert(0, Call("ai", BOB, 10.3, 10.35, True, ((BOB, 0),)))
    assert violations(obs) == []  # a repeat before any send: fine after a crash
    obs.policy = Policy(ai_once_per_batch=True)
    assert "AI asked 2 times" in only(obs, "ai_not_asked_again").detail


@pytest.mark.parametrize("kind", ["inbox", "due", "running", "burst", "pending", "batch", "lock"])
def test_work_left_in_flight(kind: str) -> None:
    obs = clean()
    obs.left = [LeftKey(f"k:{kind}", kind, "5491100000000", -1)]
    v = only(obs, "nothing_in_flight")
    assert kind in v.detail


@pytest.mark.parametrize("kind", ["unroutable", "deadletter", "outbox", "other"])
def test_keys_that_should_not_exist(kind: str) -> None:
    obs = clean()
    obs.left = [LeftKey(f"k:{kind}", kind, None, -1)]
    assert "unexpected" in only(obs, "nothing_in_flight").detail


def test_expiring_keys_must_expire() -> None:
    obs = clean()
    obs.left = [LeftKey("k:seen", "seen", None, 600), LeftKey("k:review", "review", None, -1)]
    assert violations(obs) == []
    obs.left.append(LeftKey("k:memory", "memory", "5491100000000", -1))
    assert "never expires" in only(obs, "nothing_in_flight").detail


def test_key_kinds_follow_the_key_layout() -> None:
    keys = Keys("chaos")
    k = keys.tenant(TENANTS[1])
    assert classify(keys.tenants, keys) == ("tenants", None)
    assert classify(keys.deadletter, keys) == ("deadletter", None)
    assert classify(keys.ai_paused, keys) == ("ai_pause", None)
    assert classify(keys.ai_probe, keys) == ("ai_pause", None)
    assert classify(k.inbox, keys) == ("inbox", None)
    assert classify(k.due, keys) == ("due", None)
    assert classify(k.seen("whatsapp:wamid.X"), keys) == ("seen", None)
    assert classify(k.seen_shard("1796304483", "7"), keys) == ("seen", None)
    assert classify(k.outbound("wamid.Y"), keys) == ("out", None)
    assert classify(k.outbound_gens, keys) == ("out", None)
    assert classify(k.last_inbound("549"), keys) == ("lastin", "549")
    assert classify(k.lastin_gens, keys) == ("lastin", None)
    assert classify(f"{k.lastin_book}1796304483:3", keys) == ("lastin", None)
    assert classify(k.lock("549"), keys) == ("lock", "549")
    assert classify(k.pending("549"), keys) == ("pending", "549")
    assert classify(k.memory("549"), keys) == ("memory", "549")
    assert classify("chaos:something:else", keys) == ("other", None)
    assert classify(keys.chatwoot_catchup_cursor, keys) == ("catchup", None)
    assert classify(keys.chatwoot_catchup_lock, keys) == ("catchup_guard", None)
    assert classify(keys.chatwoot_catchup_wanted, keys) == ("catchup_wanted", None)
    assert classify(keys.tenant("cw-1-3").lock("9001"), keys) == ("lock", "9001")


def test_tokens_name_person_and_message() -> None:
    assert tokens_in("stand-in reply to: c3x0 hola\nc3x12 dale") == [(3, 0), (3, 12)]
    assert tokens_in("xc3x0 nothing") == []


# --- the ai_outage scenario's own checks ---------------------------------------------------------
OUTAGE_FROM, OUTAGE_TO = 11.9, 14.0


def outage_records() -> tuple[Run, Observation, dict[str, int]]:
    """Alice's third message (12 s) waits out an outage from 11.9 s to 14 s: its AI call fails
    at once, one probe fails, and it is answered half a second after recovery."""
    run = Run(cast(Any, None), cast(Any, None), 4.0, random.Random(1))
    run.faults = [
        (OUTAGE_FROM, "ai_outage", ""),
        (OUTAGE_FROM + 0.2, "ai_paused", ""),
        (OUTAGE_TO, "ai_recovered", ""),
    ]
    obs = clean()
    waiting = ((ALICE, 2),)
    obs.calls = [c for c in obs.calls if c.tokens != waiting and c.tokens[-1:] != waiting]
    obs.calls += [Call("ai", ALICE, t, t + 0.01, False, waiting) for t in (12.05, 13.2)]
    obs.calls += turn(ALICE, [2], 14.3)
    return run, obs, {"ai_waits": 3}


def failed_expectations(run: Run, obs: Observation, stats: dict[str, int]) -> list[str]:
    assert violations(obs) == []
    SCENARIOS["ai_outage"].verify(run, obs, stats)
    return [what for what, ok, _ in run.expectations if not ok]


def test_an_outage_waited_out_passes_the_scenarios_checks() -> None:
    assert failed_expectations(*outage_records()) == []


def test_an_outage_probed_too_often_fails() -> None:
    run, obs, stats = outage_records()
    obs.calls += [Call("ai", ALICE, t, t + 0.01, False, ((ALICE, 2),)) for t in (13.4, 13.6)]
    assert failed_expectations(run, obs, stats) == ["the fleet probed at most once per pause"]


def test_an_outage_probed_too_seldom_fails() -> None:
    """Recovery at 20 s, the last probe at 13.2 s: the AI was back for a while before anyone
    asked (the longest pause is 4 s by default)."""
    run, obs, stats = outage_records()
    run.faults[-1] = (20.0, "ai_recovered", "")
    obs.calls = [c for c in obs.calls if c.tokens != ((ALICE, 2),) or not c.ok]
    obs.calls += turn(ALICE, [2], 20.3)
    assert failed_expectations(run, obs, stats) == [
        "the fleet probed at least once per longest pause"
    ]


def test_an_outage_that_counted_attempts_or_parked_batches_fails() -> None:
    run, obs, stats = outage_records()
    stats["retries"] = 1
    assert failed_expectations(run, obs, stats) == ["batches waited without using up attempts"]
    run, obs, stats = outage_records()
    obs.review = [{"reason": "too_old", "messages": []}]
    assert failed_expectations(run, obs, stats) == ["nothing went to review"]


def test_an_outage_answered_long_after_recovery_fails() -> None:
    run, obs, stats = outage_records()
    obs.calls = [c for c in obs.calls if c.kind != "send" or c.tokens != ((ALICE, 2),)]
    obs.calls += turn(ALICE, [2], OUTAGE_TO + OUTAGE_ANSWERED_WITHIN_S + 1)[2:]
    assert failed_expectations(run, obs, stats) == [
        "every conversation waiting at recovery was answered soon after"
    ]


def test_an_outage_nobody_noticed_fails() -> None:
    run, obs, stats = outage_records()
    obs.calls = [c for c in obs.calls if c.ok or c.kind != "ai"]
    run.faults = [f for f in run.faults if f[1] != "ai_paused"]
    assert failed_expectations(run, obs, stats) == [
        "AI calls failed during the outage",
        "a worker paused the fleet",
    ]


# --- the redis_freeze scenario's own checks ------------------------------------------------------
FROZE, THAWED = 12.2, 16.2


def freeze_records() -> tuple[Run, Observation, dict[str, int]]:
    """Redis frozen from 12.2 s to 16.2 s: Alice's third message (12 s) was due then, and is
    answered a second after Redis answers again."""
    stack = cast(Any, type("Stack", (), {"worker_env": dict(FREEZE_ENV)}))
    run = Run(stack, cast(Any, None), 4.0, random.Random(1))
    run.faults = [(FROZE, "redis_freeze", ""), (THAWED, "redis_thawed", "")]
    obs = clean()
    obs.calls = [c for c in obs.calls if c.tokens[-1:] != ((ALICE, 2),)]
    obs.calls += turn(ALICE, [2], THAWED + 0.85)
    return run, obs, {"leases_expired": 0}


def failed_freeze_expectations(run: Run, obs: Observation, stats: dict[str, int]) -> list[str]:
    assert violations(obs) == []
    SCENARIOS["redis_freeze"].verify(run, obs, stats)
    return [what for what, ok, _ in run.expectations if not ok]


def test_a_freeze_recovered_within_seconds_passes_the_scenarios_checks() -> None:
    assert failed_freeze_expectations(*freeze_records()) == []


def test_a_freeze_answered_only_after_a_lease_fails() -> None:
    """What the old code did: a claim Redis ran after the worker gave up on it held the batch
    for the whole lease (12 s here)."""
    run, obs, stats = freeze_records()
    obs.calls = [c for c in obs.calls if c.tokens[-1:] != ((ALICE, 2),)]
    obs.calls += turn(ALICE, [2], THAWED + 12.0)
    stats["leases_expired"] = 1
    assert failed_freeze_expectations(run, obs, stats) == [
        "what waited at the freeze was answered within seconds of its end",
        "no lease expired",
    ]
    run, obs, stats = freeze_records()
    obs.calls = [c for c in obs.calls if c.tokens[-1:] != ((ALICE, 2),)]
    obs.calls += turn(ALICE, [2], THAWED + FREEZE_ANSWERED_WITHIN_S + 0.5)
    assert failed_freeze_expectations(run, obs, stats) == [
        "what waited at the freeze was answered within seconds of its end"
    ]


def test_a_freeze_that_caught_nothing_waiting_or_never_happened_fails() -> None:
    run, obs, stats = freeze_records()
    obs.calls = [c for c in obs.calls if c.tokens[-1:] != ((ALICE, 2),)]
    obs.calls += turn(ALICE, [2], 12.02)  # answered just before the freeze: nothing waited
    assert failed_freeze_expectations(run, obs, stats) == [
        "what waited at the freeze was answered within seconds of its end"
    ]
    run, obs, stats = freeze_records()
    run.faults = []
    assert failed_freeze_expectations(run, obs, stats) == ["Redis was frozen"]
