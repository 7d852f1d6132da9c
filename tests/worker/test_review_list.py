"""The review list: list, show, requeue (as a fresh batch), drop; and the CLI around it."""

from __future__ import annotations

import functools
import os
import subprocess

import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.ops.review import ReviewError, ReviewList
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.worker.support import park, quick_store, run_module

TENANT = "106500000000001"


PERSON = "5491155550001"
park_one = functools.partial(park, tenant=TENANT, person=PERSON)


async def test_a_requeued_batch_gets_back_the_context_its_batch_had_taken(
    redis: Redis, settings: Settings
) -> None:
    """A reaction the parked batch had taken is not lost to the review: the requeued batch's
    AI is shown it as the first one would have been."""
    reaction = {"what": "reaction", "target": "wamid.out.1", "raw": {"reaction": {"emoji": "👍"}}}
    item_id = await park_one(redis, settings, ["¿y?"], context=[reaction])
    review = ReviewList(redis, Keys(settings.key_prefix), Scripts())
    (item,) = await review.items(TENANT)
    assert item["context"] == [reaction]

    await review.requeue(TENANT, item_id)
    (batch,) = (await quick_store(redis, settings).claim(TENANT, 5, "t2")).batches
    assert batch.requeued and batch.context == [reaction]


@pytest.mark.cluster
async def test_list_show_requeue_as_fresh_batch(redis: Redis, settings: Settings) -> None:
    item_id = await park_one(redis, settings, ["hola", "una consulta"])
    review = ReviewList(redis, Keys(settings.key_prefix), Scripts())

    (item,) = await review.items(TENANT)
    assert item["id"] == item_id and item["reason"] == "max_attempts" and item["error"] == "boom"
    assert [m["text"] for m in item["messages"]] == ["hola", "una consulta"]
    assert await review.items(TENANT, reason="too_old") == []
    assert (await review.get(TENANT, item_id))["person"] == PERSON

    relay = Keys(settings.key_prefix).relay_queue
    await review.requeue(TENANT, item_id)
    # Due now: relayed to a worker with a free slot at once, not left to the sweep.
    assert [m for m, _ in await redis.zrange(relay, 0, -1, withscores=True)] == [TENANT.encode()]
    assert await review.items(TENANT) == []
    claim = await quick_store(redis, settings).claim(TENANT, 5, "t2")
    (batch,) = claim.batches
    assert batch.attempt == 0 and batch.requeued
    assert batch.texts == ["hola", "una consulta"]


async def test_requeue_waits_while_the_person_has_a_batch(redis: Redis, settings: Settings) -> None:
    # `too_old` does not pause the person, so their second batch is claimed and parked too.
    first = await park_one(redis, settings, ["uno"], reason="too_old")
    second = await park_one(redis, settings, ["dos"], reason="too_old")
    review = ReviewList(redis, Keys(settings.key_prefix), Scripts())
    await review.requeue(TENANT, first)
    with pytest.raises(ReviewError, match="in flight"):
        await review.requeue(TENANT, second)
    assert {i["id"] for i in await review.items(TENANT)} == {second}


async def test_drop_and_unknown_ids(redis: Redis, settings: Settings) -> None:
    item_id = await park_one(redis, settings, ["hola"])
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
    item_id = await park_one(redis, settings, ["hola"])
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "REDIS_CLUSTER": str(settings.redis_cluster).lower(),
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_module("worker.review", *args, env=env)

    listed = cli("list", "--tenant", TENANT)
    assert listed.returncode == 0 and item_id in listed.stdout and "1 item(s)" in listed.stdout
    assert '"reason": "max_attempts"' in cli("show", "--tenant", TENANT, item_id).stdout
    assert cli("drop", "--tenant", TENANT, item_id).returncode == 0
    missing = cli("drop", "--tenant", TENANT, item_id)
    assert missing.returncode == 1 and "no review item" in missing.stderr
