"""`python -m worker.inspect`: the live state of a tenant or a conversation, read from a real
Redis put into every state a conversation can be in (waiting, running, retrying, in review)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer
from shared.keys import Keys
from shared.ops import live_state, takeover
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.worker.support import _CONTRACT_VARS, TENANT, push_message, run_module
from worker.conversation_store import ConversationStore
from worker.inspect import render_person

WAITING, RUNNING, RETRYING, REVIEWED = (
    "5491155550001",
    "5491155550002",
    "5491155550003",
    "5491155550004",
)
LEASE_S = 60


async def build_states(redis: Redis, settings: Settings, prefix: str) -> None:
    """One conversation in each state, through the product's own scripts."""
    s = settings.with_overrides(
        key_prefix=prefix, debounce_window_s=30, max_wait_s=60, lease_s=LEASE_S
    )
    scripts = Scripts()
    store = ConversationStore(s, scripts, GroupCommitter(redis, scripts))
    k = Keys(prefix).tenant(TENANT)
    for person in (RUNNING, RETRYING, REVIEWED):
        await push_message(redis, prefix, person, f"wamid.{person}", "secret words")
    await store.claim(TENANT, 0, "intake")
    await redis.zadd(k.due, {RUNNING: 0, RETRYING: 0, REVIEWED: 0})
    batches = {b.person: b for b in (await store.claim(TENANT, 5, "tok")).batches}
    assert set(batches) == {RUNNING, RETRYING, REVIEWED}
    assert await store.finish_retry(batches[RETRYING], 120, "brain said boom")
    assert await store.finish_review(batches[REVIEWED], "too_old", "older than 900s", 1)
    # The running person writes again during the turn; someone else starts a burst.
    await push_message(redis, prefix, RUNNING, "wamid.during", "one more thing")
    await push_message(redis, prefix, WAITING, "wamid.w1", "hola")
    await push_message(redis, prefix, WAITING, "wamid.w2", "una consulta")
    await store.claim(TENANT, 0, "intake")
    await push_message(redis, prefix, WAITING, "wamid.w3", "still in the inbox")


async def keys_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_keys", {}).get("calls", 0))


async def test_tenant_view_shows_every_state(redis: Redis, settings: Settings, prefix: str) -> None:
    await build_states(redis, settings, prefix)
    keys_before = await keys_calls(redis)
    state = await live_state.tenant(redis, Keys(prefix), TENANT)
    assert await keys_calls(redis) == keys_before, "SCAN, never KEYS"

    assert state["registered"] and state["inbox"] == 1 and state["unroutable"] == 0
    waiting = {w["person"]: w["due_in_ms"] for w in state["waiting"]}
    assert set(waiting) == {WAITING, RETRYING} and state["waiting_total"] == 2
    assert 20_000 < waiting[WAITING] <= 30_000  # the 30 s window (a noisy machine: 10 s slack)
    assert 110_000 < waiting[RETRYING] <= 120_000  # the retry delay
    (running,) = state["running"]
    assert running["person"] == RUNNING and running["attempt"] == 0
    assert running["token"] == "tok:1" or running["token"].startswith("tok:")
    assert (LEASE_S - 10) * 1000 < running["lease_left_ms"] <= LEASE_S * 1000
    pending = {p["person"]: p for p in state["pending"]["conversations"]}
    assert pending[WAITING]["messages"] == 2 and not pending[WAITING]["batch_in_flight"]
    assert pending[RUNNING]["messages"] == 1 and pending[RUNNING]["batch_in_flight"]
    assert set(pending) == {WAITING, RUNNING} and not state["pending"]["truncated"]
    (item,) = state["review"]
    assert (item["person"], item["reason"], item["messages"]) == (REVIEWED, "too_old", 1)
    assert state["counters"]["messages"] == 6 and state["counters"]["retries"] == 1
    assert state["counters"]["review:too_old"] == 1
    assert state["dispatch_lag"]["claims"] == 3
    assert b"secret words" not in orjson.dumps(state), "no message text without --text"


async def test_person_view_shows_the_turn_the_batch_and_the_pending_messages(
    redis: Redis, settings: Settings, prefix: str
) -> None:
    await build_states(redis, settings, prefix)
    keys = Keys(prefix)
    running = await live_state.person(redis, keys, TENANT, RUNNING)
    assert running["lease"]["token"].startswith("tok:")
    assert (LEASE_S - 10) * 1000 < running["lease"]["lock_ttl_ms"] <= LEASE_S * 1000
    assert running["batch"]["in_turn"] and running["batch"]["attempt"] == 0
    assert running["batch"]["messages"] == 1 and not running["batch"]["reply_stored"]
    assert [m["id"] for m in running["pending"]] == ["wamid.during"]
    assert running["pending"][0]["chars"] == len("one more thing")
    assert "text" not in running["pending"][0] and running["due"] is None
    assert running["window"]["open"] and running["window"]["closes_in_s"] > 86_000

    retrying = await live_state.person(redis, keys, TENANT, RETRYING)
    assert retrying["lease"] is None and not retrying["batch"]["in_turn"]
    assert retrying["batch"]["attempt"] == 1
    assert retrying["batch"]["last_error"] == "brain said boom"
    assert retrying["due"]["due_in_ms"] > 100_000 and retrying["pending"] == []

    reviewed = await live_state.person(redis, keys, TENANT, REVIEWED)
    assert reviewed["batch"] is None and reviewed["lease"] is None
    assert [i["reason"] for i in reviewed["review"]] == ["too_old"]

    with_text = await live_state.person(redis, keys, TENANT, WAITING, with_text=True)
    assert [m["text"] for m in with_text["pending"]] == ["hola", "una consulta"]
    assert with_text["burst"]["first_ms"] <= with_text["burst"]["last_ms"]

    stranger = await live_state.person(redis, keys, TENANT, "5491100000000")
    assert stranger["pending"] == [] and stranger["batch"] is None
    assert stranger["lease"] is None and not stranger["window"]["open"]
    assert stranger["human"] is None

    await takeover.pause(redis, keys, TENANT, WAITING, by="alice", why="by phone", seconds=90)
    paused = await live_state.person(redis, keys, TENANT, WAITING)
    assert (paused["human"]["by"], paused["human"]["why"]) == ("alice", "by phone")
    (line,) = [ln for ln in render_person(paused) if ln.startswith("  human")]
    assert line.startswith("  human       bot paused by 'alice' ('by phone'), ends in 1m")


def run_cli(
    redis_server: RedisServer, prefix: str, *args: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _CONTRACT_VARS}
    env.update({"REDIS_URL": redis_server.url, "KEY_PREFIX": prefix, **variables})
    return run_module("worker.inspect", *args, env=env)


@pytest.mark.slow
async def test_the_command_prints_text_and_json(
    redis: Redis, redis_server: RedisServer, settings: Settings, prefix: str
) -> None:
    await build_states(redis, settings, prefix)
    fleet = run_cli(redis_server, prefix)
    assert fleet.returncode == 0, fleet.stderr
    assert f"{TENANT}  inbox=1 waiting=2 running=1 review=1 messages=6" in fleet.stdout
    # No worker runs: the tenant's wake-up waits for one, once however often it was woken.
    assert "workers listening: 0; tenants waiting for a worker: 1 with new work" in fleet.stdout

    text = run_cli(redis_server, prefix, TENANT)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert "waiting     2 conversations" in out and f"{WAITING}  due in " in out
    assert f"{RUNNING}  batch " in out and "s left (lock tok:" in out
    assert f"{RUNNING}  1 messages, a batch in flight" in out
    assert f"person={REVIEWED}  reason=too_old" in out
    assert "secret words" not in out

    as_json: dict[str, Any] = orjson.loads(run_cli(redis_server, prefix, TENANT, "--json").stdout)
    assert {w["person"] for w in as_json["waiting"]} == {WAITING, RETRYING}

    person = run_cli(redis_server, prefix, TENANT, RETRYING)
    assert "attempt 1, 1 messages, waiting" in person.stdout, person.stdout
    assert "last error  brain said boom" in person.stdout
    shown = run_cli(redis_server, prefix, TENANT, WAITING, "--text")
    assert "'una consulta'" in shown.stdout, shown.stdout

    bad = run_cli(redis_server, prefix, "{oops}")
    assert bad.returncode == 2 and "cannot be used in a Redis key" in bad.stderr
    down = run_cli(
        redis_server, prefix, TENANT, REDIS_URL="redis://127.0.0.1:1/0", REDIS_TIMEOUT_S="1"
    )
    assert down.returncode == 1 and "cannot read Redis at redis://127.0.0.1:1/0" in down.stderr
