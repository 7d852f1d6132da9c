"""Outages of the AI are waited out, not counted (worker/brains/ai_pause.py,
worker/brains/ai_errors.py).

Real `python -m worker` processes with the real `anthropic` brain and `whatsapp` sender against
the stand-ins: an outage is the Messages API stand-in answering 529 to every call for a few
seconds (`fail_for`), then answering again. The workers run with `MAX_ATTEMPTS=4` and
`RETRY_BASE_S=0.1`: counted as failures, 0.7 s of outage would send a batch to review. Also
here, on the test Redis without processes: the pause's arithmetic (level, retry-after, cap)
and its probe token between two workers; and what `retry-after` headers are read as.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.conversation.errors import AIUnavailable
from shared.fleet.ai_pause import Pause
from shared.keys import Keys
from shared.settings import Settings
from tests.delivery.support import ai_requests
from tests.worker.support import WorkerFleet, in_review, push_message, review_items, stats, wait_for
from worker.brains.ai_errors import retry_after
from worker.brains.ai_pause import GO, REFRESH_S, WAIT_MARGIN_S, AIPause

# 0.7 s: what MAX_ATTEMPTS=4 retries at RETRY_BASE_S=0.1 would survive (tests/delivery/support.py).
COUNTED_RETRIES_SURVIVE_S = 0.1 + 0.2 + 0.4


def people(n: int, base: int = 0) -> list[str]:
    return [f"54911555{base + i:05d}" for i in range(n)]


def reply_to(text: str) -> str:
    return f"stand-in reply to: {text}"


async def all_answered(graph: GraphApiStandIn, texts: dict[str, str], timeout_s: float) -> None:
    async def answered() -> bool:
        return all(graph.sent_texts(person) for person in texts)

    await wait_for(answered, f"{len(texts)} people answered", timeout_s=timeout_s)
    for person, text in texts.items():
        assert [m.body for m in graph.sent_texts(person)] == [reply_to(text)], person


async def turns_done(redis: Redis, prefix: str, count: int) -> dict[str, int]:
    """The counters once `count` turns finished (a send is accepted before its finish runs)."""

    async def done() -> dict[str, int] | None:
        counts = await stats(redis, prefix)
        return counts if counts.get("turns", 0) >= count else None

    return await wait_for(done, f"{count} turns finished")


async def fleet_paused(redis: Redis, prefix: str) -> float:
    """When the fleet's pause was first seen set: a worker's call failed and it paused the
    fleet (on a loaded machine that may come a second or more after the stand-in's 529)."""

    async def paused() -> bool:
        return bool(await redis.exists(Keys(prefix).ai_paused))

    await wait_for(paused, "the fleet paused", timeout_s=15, every_s=0.01)
    return time.time()


def fault_end(fault: Any) -> float:
    assert fault.until is not None
    return float(fault.until)


@pytest.mark.slow
async def test_an_outage_longer_than_every_retry_is_waited_out_and_answered_after_it(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Before: every batch in review as max_attempts, none answered. Now: every batch waits,
    its attempts not counted, and is answered once the AI answers again."""
    await fleet.start(2, **env)
    outage = ai.fail_for(COUNTED_RETRIES_SURVIVE_S + 2.5, "overloaded")
    texts = {person: f"hola {i}" for i, person in enumerate(people(6))}
    for i, (person, text) in enumerate(texts.items()):
        await push_message(redis, prefix, person, f"wamid.o{i}", text)

    await all_answered(graph, texts, timeout_s=40)
    recovered = fault_end(outage)
    counts = await turns_done(redis, prefix, len(texts))
    assert await review_items(redis, prefix) == []
    assert counts["turns"] == len(texts) and "retries" not in counts, counts
    assert counts["ai_waits"] >= len(texts), "every batch waited at least once"
    calls = ai_requests(ai)
    assert [r for r in calls if r.status == 529], "the outage was hit"
    answered = [r for r in calls if r.ok]
    assert len(answered) == len(texts), "one answer per batch"
    # (A request's arrival is recorded a moment before the stand-in looks at the outage.)
    assert all(r.time >= recovered - 0.05 for r in answered)
    # Soon after: the longest pause (1 s, +20 %), a batch's jitter (0.1 s), the probe and a
    # turn, with room for a loaded machine.
    last_send = max(r.time for r in graph.requests if r.kind == "text" and r.ok)
    assert last_send - recovered < 8.0, last_send - recovered
    assert not await redis.exists(Keys(prefix).ai_paused), "the recovery lifted the pause"


RETRY_AFTER_S = 1.5
PROBED_OUTAGE_S = 8.0


@pytest.mark.slow
async def test_a_fleet_of_three_probes_the_ai_once_per_pause_honouring_retry_after(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """One person's failed call pauses the fleet; eleven more people write during the pause.
    Three workers hold their batches and only one asks the AI again when a pause ends: the
    stand-in sees one call per pause, each at least the retry-after (1.5 s) after the last,
    although AI_OUTAGE_PAUSE_S is 0.2 s. Without the shared pause the twelve batches would
    each call on their own backoff."""
    await fleet.start(3, **{**env, "AI_OUTAGE_PAUSE_S": "0.2", "AI_OUTAGE_MAX_PAUSE_S": "5"})
    outage = ai.fail_for(PROBED_OUTAGE_S, "overloaded", retry_after=RETRY_AFTER_S)
    first, *others = people(12, base=100)
    texts = {person: f"consulta {i}" for i, person in enumerate([first, *others])}
    await push_message(redis, prefix, first, "wamid.p0", texts[first])
    await fleet_paused(redis, prefix)
    for i, person in enumerate(others, start=1):
        await push_message(redis, prefix, person, f"wamid.p{i}", texts[person])

    await all_answered(graph, texts, timeout_s=60)
    during = [r for r in ai_requests(ai) if r.time < fault_end(outage) - 0.05]
    assert all(r.status == 529 for r in during)
    # The first person's call, then only probes: nobody else called before the pause was set.
    starts = sorted(r.time for r in during)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(starts)]
    assert len(starts) >= 3, f"the outage was probed: {gaps}"
    assert min(gaps) >= RETRY_AFTER_S - 0.05, f"a call before its pause ended: {gaps}"
    assert len(starts) <= int(PROBED_OUTAGE_S / RETRY_AFTER_S) + 1, gaps
    assert "retries" not in await turns_done(redis, prefix, len(texts))
    assert await review_items(redis, prefix) == []


DEFAULTS = Settings()
DEFAULT_PAUSE = {
    "AI_OUTAGE_PAUSE_S": str(DEFAULTS.ai_outage_pause_s),
    "AI_OUTAGE_MAX_PAUSE_S": str(DEFAULTS.ai_outage_max_pause_s),
}
LONG_OUTAGE_S = 14.0
# How late a probe or a waiting batch may come on a loaded 2-core machine: its claim, the
# gate's reads, the turn itself.
SLACK_S = 2.5


@pytest.mark.slow
async def test_with_the_default_pause_the_ai_is_asked_every_few_seconds_and_answers_resume_soon(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """Default AI_OUTAGE_PAUSE_S / AI_OUTAGE_MAX_PAUSE_S, two workers, a 14 s outage
    (retry-after 1 s); people write as it starts and in its middle. While it fails, one call at
    a time, never two within the shortest pause, never more than the longest pause (4 s) apart:
    the fleet learns the AI is back within about 4 s of it (the doubling up to 30 s of before:
    2, 4, 8 s pauses left the AI unasked from about 7 s to 16 s into such an outage).
    Then the probe's answer alone, and every waiting batch soon after it, not a pause later."""
    await fleet.start(2, **{**env, **DEFAULT_PAUSE})
    outage = ai.fail_for(LONG_OUTAGE_S, "overloaded", retry_after=1)
    first, *others = people(11, base=500)
    texts = {person: f"pregunta {i}" for i, person in enumerate([first, *others])}
    await push_message(redis, prefix, first, "wamid.d0", texts[first])
    await fleet_paused(redis, prefix)
    for i, person in enumerate(others, start=1):
        if i == 6:  # the rest write in the middle of the outage
            await asyncio.sleep(LONG_OUTAGE_S / 2)
        await push_message(redis, prefix, person, f"wamid.d{i}", texts[person])

    await all_answered(graph, texts, timeout_s=60)
    recovered = fault_end(outage)
    calls = ai_requests(ai)
    failed = sorted(r.time for r in calls if not r.ok)
    assert all(r.time < recovered for r in calls if not r.ok), "only the outage failed"
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(failed)]
    shortest = max(DEFAULTS.ai_outage_pause_s, 1.0)  # the first pause: 1 s, retry-after 1 s
    assert len(failed) >= 4, f"the outage probed too seldom: {gaps}"
    assert min(gaps) >= shortest - 0.05, f"a call too soon: {gaps}"
    assert max(gaps) <= DEFAULTS.ai_outage_max_pause_s + SLACK_S, f"a probe too late: {gaps}"
    # After recovery: the first call is the probe, the next one starts once it is answered.
    answered = sorted((r for r in calls if r.ok), key=lambda r: r.time)
    assert len(answered) == len(texts), "one answer per batch"
    probe, *rest = answered
    assert probe.time - failed[-1] <= DEFAULTS.ai_outage_max_pause_s + SLACK_S, gaps
    assert probe.time - recovered <= DEFAULTS.ai_outage_max_pause_s + SLACK_S
    assert probe.answered is not None and all(r.time >= probe.answered for r in rest)
    # Every waiting batch within a batch's jitter and a look again (1 s each by default) of
    # the probe's answer, not at the pause after.
    sends = [r.time for r in graph.requests if r.kind == "text" and r.ok]
    assert max(sends) - probe.answered <= 2 * DEFAULTS.ai_outage_pause_s + SLACK_S, (
        max(sends) - probe.answered
    )
    assert "retries" not in await turns_done(redis, prefix, len(texts))
    assert await review_items(redis, prefix) == []


@pytest.mark.slow
async def test_no_read_receipt_or_typing_indicator_while_the_ai_is_paused(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """The first person's turn showed typing before its call failed (nobody knew yet); from
    then on until the AI answers again nobody is shown typing, the probes included (a probe
    shows it once its answer is in). After recovery everyone gets read receipt + typing."""
    await fleet.start(2, **env)
    outage = ai.fail_for(4.0, "overloaded")
    first, *others = people(4, base=200)
    texts = {person: f"hola {i}" for i, person in enumerate([first, *others])}
    wamids = {person: f"wamid.t{i}" for i, person in enumerate(texts)}
    await push_message(redis, prefix, first, wamids[first], texts[first])
    paused_at = await fleet_paused(redis, prefix)
    for person in others:
        await push_message(redis, prefix, person, wamids[person], texts[person])

    await all_answered(graph, texts, timeout_s=40)
    recovered = fault_end(outage)
    reads = [r for r in graph.requests if r.kind == "read" and r.ok]
    shown = {
        person: [r.time for r in reads if r.body.get("message_id") == wamid]
        for person, wamid in wamids.items()
    }
    paused = [t for times in shown.values() for t in times if paused_at < t < recovered]
    assert paused == [], f"typing shown while paused: {shown}"
    assert len(shown[first]) == 2 and shown[first][0] < paused_at < recovered < shown[first][1]
    for person in others:
        assert len(shown[person]) == 1 and shown[person][0] >= recovered, shown
    assert all(r.body.get("typing_indicator") == {"type": "text"} for r in reads)


@pytest.mark.slow
async def test_a_batch_that_waited_past_review_after_s_goes_to_review_as_too_old(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """An outage longer than REVIEW_AFTER_S (4 s): the waits end there, as too_old, with no
    attempt counted; nothing is sent and nobody was shown typing after the first call."""
    await fleet.start(1, **{**env, "REVIEW_AFTER_S": "4"})
    ai.fail_for(60.0, "overloaded")
    first, second = people(2, base=300)
    await push_message(redis, prefix, first, "wamid.a0", "hola")
    await fleet_paused(redis, prefix)
    await push_message(redis, prefix, second, "wamid.a1", "¿hay alguien?")

    items = await in_review(redis, prefix, count=2, what="both batches in review", timeout_s=20)
    for item in items:
        assert item["reason"] == "too_old" and item["attempts"] == 0, item
        oldest_ms = min(m["ts"] for m in item["messages"]) * 1000
        assert item["reviewed_ms"] - oldest_ms >= 4000 - 1000, item  # ts has whole seconds
    counts = await stats(redis, prefix)
    assert counts["review:too_old"] == 2 and "retries" not in counts, counts
    assert counts["ai_waits"] >= 2, counts
    assert graph.sent_messages() == []
    reads = [r for r in graph.requests if r.kind == "read"]
    assert [r.body["message_id"] for r in reads] == ["wamid.a0"], "only before the outage"


@pytest.mark.slow
async def test_a_request_the_api_rejects_is_the_batchs_own_failure_not_an_outage(
    redis: Redis,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    """A 400 goes to review at once as ai_rejected (the same request would be refused again);
    a 409 is retried and counted: four attempts, then review as max_attempts. Neither pauses
    the fleet: another person is answered meanwhile, and no batch waited."""
    await fleet.start(1, **env)
    rejected, conflicted, bystander = people(3, base=400)
    ai.fail_next(1, "invalid_request", message="messages: bad")
    await push_message(redis, prefix, rejected, "wamid.r0", "hola")

    (item,) = await in_review(redis, prefix, what="the rejected batch in review")
    assert item["reason"] == "ai_rejected" and item["attempts"] == 0
    assert str(item["error"]).startswith("Anthropic 400: ") and "messages: bad" in item["error"]

    ai.fail_next(4, "invalid_request", status=409)
    await push_message(redis, prefix, conflicted, "wamid.r1", "otra vez")
    items = await in_review(redis, prefix, count=2, what="the conflicted batch in review")
    (item,) = [i for i in items if i["person"] == conflicted]
    assert item["reason"] == "max_attempts" and item["attempts"] == 4
    assert str(item["error"]).startswith("RetryLater: Anthropic 409")
    await push_message(redis, prefix, bystander, "wamid.r2", "¿y yo?")
    await all_answered(graph, {bystander: "¿y yo?"}, timeout_s=15)

    counts = await stats(redis, prefix)
    assert counts["retries"] == 3 and "ai_waits" not in counts, counts
    assert not await redis.exists(Keys(prefix).ai_paused)
    assert len(ai_requests(ai)) == 1 + 4 + 1


# --- the pause itself, on the test Redis ------------------------------------------------------
def pause_of(redis: Redis, prefix: str, worker: str, seed: int = 1) -> AIPause:
    settings = Settings().with_overrides(ai_outage_pause_s=1.0, ai_outage_max_pause_s=4.0)
    return AIPause(redis, Keys(prefix), settings, worker, rng=random.Random(seed))


async def stored(redis: Redis, prefix: str) -> tuple[Pause, int]:
    keys = Keys(prefix)
    pause = Pause.parse(await redis.get(keys.ai_paused))
    assert pause is not None
    return pause, int(await redis.pttl(keys.ai_paused))


async def end_pause_now(redis: Redis, prefix: str) -> None:
    """Make the stored pause end now (its level kept), as time would, and wait until every
    worker's view of it is old enough to be read again."""
    pause, _ = await stored(redis, prefix)
    over = Pause(int(time.time() * 1000) - 1, pause.level, pause.since_ms, pause.why)
    await redis.set(Keys(prefix).ai_paused, over.to_json(), px=60_000)
    await asyncio.sleep(REFRESH_S + 0.05)


async def test_the_pause_doubles_per_failed_probe_is_capped_and_honours_retry_after(
    redis: Redis, prefix: str
) -> None:
    worker = pause_of(redis, prefix, "w1")
    assert await worker.admit() == GO, "no pause: call"
    wait = await worker.failed(AIUnavailable("Anthropic 529: Overloaded"), GO)
    pause, pttl = await stored(redis, prefix)
    length = pause.until_ms / 1000 - time.time()
    assert pause.level == 1 and 0.9 <= length <= 1.2 and pause.why == "Anthropic 529: Overloaded"
    # The batch that set the pause is the next probe: it waits the pause alone, no jitter.
    assert length <= wait - WAIT_MARGIN_S <= length + 0.05, (wait, length)
    # The key outlives the pause by the longest pause (4 s): the level is remembered.
    assert 4000 + 800 <= pttl <= 4000 + 1200
    # Another call in flight that fails too does not lengthen the pause, and its batch waits
    # the pause plus a jitter of up to AI_OUTAGE_PAUSE_S (1 s).
    other = await worker.failed(AIUnavailable("Anthropic 529: Overloaded"), GO)
    assert (await stored(redis, prefix))[0] == pause
    assert wait - 0.1 <= other <= wait + 1.0 + 0.05, (other, wait)
    # Each failed probe doubles it (2 s, 4 s), up to the cap (4 s), and a retry-after within
    # the cap does not lengthen it; one beyond the cap is honoured, exactly. The probe's batch
    # waits the new pause alone: it probes again when it ends.
    for level, least, most, retry in (
        (2, 2.0, 2.4, None),
        (3, 4.0, 4.0, None),
        (4, 4.0, 4.0, 3.0),
        (5, 60.0, 60.0, 60.0),
    ):
        await end_pause_now(redis, prefix)
        probe = await worker.admit()
        assert probe.probe and probe.wait_s == 0, "the pause is over: this worker probes"
        wait = await worker.failed(AIUnavailable("Anthropic 429", retry), probe)
        pause, _ = await stored(redis, prefix)
        length = pause.until_ms / 1000 - time.time()
        assert pause.level == level and least - 0.1 <= length <= most, (level, length)
        assert length <= wait - WAIT_MARGIN_S <= length + 0.05, (level, wait, length)
        assert not await redis.exists(Keys(prefix).ai_probe), "the probe gave its token back"
    await redis.delete(Keys(prefix).ai_paused)
    await worker.failed(AIUnavailable("Anthropic 429", 3.0), GO)
    pause, _ = await stored(redis, prefix)
    assert pause.level == 1 and 2.9 <= pause.until_ms / 1000 - time.time() <= 3.6


async def test_one_worker_probes_the_others_wait_and_a_stale_view_cannot_probe(
    redis: Redis, prefix: str
) -> None:
    one, other = pause_of(redis, prefix, "w1"), pause_of(redis, prefix, "w2", seed=2)
    await one.failed(AIUnavailable("Anthropic 529: Overloaded"), GO)
    assert (await other.admit()).wait_s > 0.9, "paused: the batch waits for the pause"

    await end_pause_now(redis, prefix)
    probe = await one.admit()
    assert probe.probe
    waiting = await other.admit()
    assert waiting.wait_s > 0 and not waiting.probe, "one probe at a time"
    assert 0.5 <= waiting.wait_s <= 1.0, "it looks again within a pause"
    # The probe fails: a longer pause, and the token back. `other` last read the pause that
    # ended; it wins the token but sees the new pause, and waits.
    await one.failed(AIUnavailable("Anthropic 529: Overloaded"), probe)
    stale = await other.admit()
    assert stale.wait_s > 1.5 and not stale.probe
    assert not await redis.exists(Keys(prefix).ai_probe)

    await end_pause_now(redis, prefix)
    probe = await other.admit()
    assert probe.probe
    await other.answered(probe)
    assert not await redis.exists(Keys(prefix).ai_paused), "the answer lifts the pause"
    assert not await redis.exists(Keys(prefix).ai_probe)
    assert await one.admit() == GO and await other.admit() == GO


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "7"}, 0.25),  # the finer one wins
        ({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, 30.0),  # a date: from now
        ({"retry-after": "Wed, 21 Oct 2015 07:27:00 GMT"}, 0.0),  # in the past: no wait
        ({"retry-after": "soon"}, None),  # unreadable: as if not said
        ({"retry-after": "nan"}, None),
        ({"retry-after": "99999999"}, 3600.0),  # absurd: bounded
        ({}, None),
    ],
)
def test_retry_after_headers(headers: dict[str, str], seconds: float | None) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert retry_after(headers, now=now) == seconds
