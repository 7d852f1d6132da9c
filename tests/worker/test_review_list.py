"""The review list: list, show, requeue (as a fresh batch), drop; and the CLI around it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from shared import events
from shared.keys import Keys
from shared.ops.review import ReviewError, ReviewList
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from worker.conversation_store import ConversationStore

TENANT = "106500000000001"


async def _parked_item(
    redis: Redis,
    settings: Settings,
    texts: list[str],
    reason: str = "max_attempts",
    context: list[dict[str, Any]] | None = None,
) -> tuple[Any, str]:
    """Store messages, claim them as a batch and park it in review as the worker would
    (`max_attempts` also pauses the bot for the person: shared/ops/takeover.py)."""
    scripts = Scripts()
    await scripts.load(redis)
    k = Keys(settings.key_prefix).tenant(TENANT)
    for item in context or []:  # as claim.lua keeps a reaction to an answered message
        await redis.rpush(k.context("5491155550001"), orjson.dumps(item))
    for i, text in enumerate(texts):
        ev = events.message_event(
            channel="whatsapp",
            tenant=TENANT,
            person="5491155550001",
            message_id=f"wamid.R{i}.{text}",
            type="text",
            text=text,
            ts=int(time.time()),
            received_ms=0,
            raw={},
        )
        await scripts.ingest(
            redis,
            k,
            seen=[k.seen(events.dedupe_id(ev))],
            dedupe_ttl_s=60,
            events=[events.encode(ev)],
        )
    store = ConversationStore(
        settings.with_overrides(debounce_window_s=0.01, max_wait_s=0.01),
        scripts,
        GroupCommitter(redis, scripts),
    )
    await store.claim(TENANT, 0, "t")  # intake
    await asyncio.sleep(0.05)
    claim = await store.claim(TENANT, 5, "t")
    (batch,) = claim.batches
    assert await store.finish_review(batch, reason, "boom", claim.now_ms)
    return store, batch.id


async def test_a_requeued_batch_gets_back_the_context_its_batch_had_taken(
    redis: Redis, settings: Settings
) -> None:
    """A reaction the parked batch had taken is not lost to the review: the requeued batch's
    AI is shown it as the first one would have been."""
    reaction = {"what": "reaction", "target": "wamid.out.1", "raw": {"reaction": {"emoji": "👍"}}}
    store, item_id = await _parked_item(redis, settings, ["¿y?"], context=[reaction])
    review = ReviewList(redis, Keys(settings.key_prefix), Scripts())
    (item,) = await review.items(TENANT)
    assert item["context"] == [reaction]

    await review.requeue(TENANT, item_id)
    (batch,) = (await store.claim(TENANT, 5, "t2")).batches
    assert batch.requeued and batch.context == [reaction]


@pytest.mark.cluster
async def test_list_show_requeue_as_fresh_batch(redis: Redis, settings: Settings) -> None:
    store, item_id = await _parked_item(redis, settings, ["hola", "una consulta"])
    review = ReviewList(redis, Keys(settings.key_prefix), Scripts())

    (item,) = await review.items(TENANT)
    assert item["id"] == item_id and item["reason"] == "max_attempts" and item["error"] == "boom"
    assert [m["text"] for m in item["messages"]] == ["hola", "una consulta"]
    assert await review.items(TENANT, reason="too_old") == []
    assert (await review.get(TENANT, item_id))["person"] == "5491155550001"

    relay = Keys(settings.key_prefix).relay_queue
    await review.requeue(TENANT, item_id)
    # Due now: relayed to a worker with a free slot at once, not left to the sweep.
    assert [m for m, _ in await redis.zrange(relay, 0, -1, withscores=True)] == [TENANT.encode()]
    assert await review.items(TENANT) == []
    claim = await store.claim(TENANT, 5, "t2")
    (batch,) = claim.batches
    assert batch.attempt == 0 and batch.requeued
    assert batch.texts == ["hola", "una consulta"]


async def test_requeue_waits_while_the_person_has_a_batch(redis: Redis, settings: Settings) -> None:
    # `too_old` does not pause the person, so their second batch is claimed and parked too.
    _, first = await _parked_item(redis, settings, ["uno"], "too_old")
    _, second = await _parked_item(redis, settings, ["dos"], "too_old")
    review = ReviewList(redis, Keys(settings.key_prefix), Scripts())
    await review.requeue(TENANT, first)
    with pytest.raises(ReviewError, match="in flight"):
        await review.requeue(TENANT, second)
    assert {i["id"] for i in await review.items(TENANT)} == {second}


async def test_drop_and_unknown_ids(redis: Redis, settings: Settings) -> None:
    _, item_id = await _parked_item(redis, settings, ["hola"])
    review = ReviewList(redis, Keys(settings.key_prefix), Scripts())
    with pytest.raises(ReviewError, match="no review item"):
        await review.get(TENANT, "nope")
    with pytest.raises(ReviewError, match="no review item"):
        await review.requeue(TENANT, "nope")
    await review.drop(TENANT, item_id)
    assert await review.items(TENANT) == []
    with pytest.raises(ReviewError, match="no review item"):
        await review.drop(TENANT, item_id)


@pytest.mark.cluster
async def test_cli_lists_and_drops(redis: Redis, settings: Settings) -> None:
    _, item_id = await _parked_item(redis, settings, ["hola"])
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "REDIS_CLUSTER": str(settings.redis_cluster).lower(),
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "worker.review", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    listed = cli("list", "--tenant", TENANT)
    assert listed.returncode == 0 and item_id in listed.stdout and "1 item(s)" in listed.stdout
    assert '"reason": "max_attempts"' in cli("show", "--tenant", TENANT, item_id).stdout
    assert cli("drop", "--tenant", TENANT, item_id).returncode == 0
    missing = cli("drop", "--tenant", TENANT, item_id)
    assert missing.returncode == 1 and "no review item" in missing.stderr
