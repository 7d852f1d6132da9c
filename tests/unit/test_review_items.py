"""worker/review.py's list, show and drop: the review hash read without a script (a drop is
one, review_act.lua, so its test has a real Redis)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fakeredis.aioredis import FakeRedis
from redis.asyncio import Redis

from shared.keys import Keys
from shared.ops.review import ReviewError, ReviewList
from shared.storage.scripts import Scripts

KEYS = Keys("rv")
TENANT = "106540352242922"


def item(item_id: str, reason: str, reviewed_ms: int | None, **fields: Any) -> dict[str, Any]:
    found = {"id": item_id, "person": "5491155550001", "reason": reason, **fields}
    if reviewed_ms is not None:
        found["reviewed_ms"] = reviewed_ms
    return found


async def stored(fake: FakeRedis | Redis, *items: dict[str, Any]) -> ReviewList:
    review = KEYS.tenant(TENANT).review
    await fake.hset(review, mapping={i["id"]: orjson.dumps(i) for i in items})
    return ReviewList(fake, KEYS, Scripts())


async def test_items_are_listed_oldest_first_and_filtered_by_reason(fake: FakeRedis) -> None:
    review = await stored(
        fake,
        item("b3", "too_old", 300),
        item("b2", "too_old", 100),
        item("b1", "failed", 100),
        item("b0", "failed", None),  # written before reviewed_ms existed: listed first
    )
    assert [i["id"] for i in await review.items(TENANT)] == ["b0", "b1", "b2", "b3"]
    assert [i["id"] for i in await review.items(TENANT, "too_old")] == ["b2", "b3"]
    assert await review.items(TENANT, "delivery_unknown") == []
    assert await review.items("106540352242923") == []


async def test_show_and_drop_name_the_item_they_cannot_find(redis: Redis) -> None:
    """A drop is a script (review_act.lua): a real Redis."""
    review = await stored(redis, item("b1", "failed", 100, error="boom"))
    assert (await review.get(TENANT, "b1"))["error"] == "boom"
    await review.drop(TENANT, "b1")
    assert await redis.hlen(KEYS.tenant(TENANT).review) == 0
    with pytest.raises(ReviewError, match="no review item 'b1' for tenant '106540352242922'"):
        await review.get(TENANT, "b1")
    with pytest.raises(ReviewError, match="no review item 'b1'"):
        await review.drop(TENANT, "b1")


async def test_an_item_without_messages_cannot_be_requeued(fake: FakeRedis) -> None:
    review = await stored(fake, item("b1", "failed", 100, messages=[]))
    with pytest.raises(ReviewError, match="has no messages to answer; drop it"):
        await review.requeue(TENANT, "b1")
    assert await fake.hexists(KEYS.tenant(TENANT).review, "b1"), "left for a person to drop"
