"""Nothing grows without bound, and delivery statuses are consumed and counted: processes."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from shared import events
from shared.conversation.burst_shards import burst_shard_of
from shared.keys import Keys
from shared.ops import markers
from shared.storage.scripts import Scripts
from tests.worker.support import (
    TENANT,
    Records,
    WorkerFleet,
    in_review,
    outbox,
    push_message,
    push_status,
    scan_keys,
    stats,
    wait_for,
    wake_up,
)

pytestmark = pytest.mark.slow


async def test_finished_conversations_leave_no_keys_or_entries_behind(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(1, REVIEW_AFTER_S="60")
    plain, flaky, human, old, chatty = (f"54911000000{i}" for i in range(41, 46))
    await push_message(redis, prefix, plain, "wamid.h.1", "hola")
    await push_message(redis, prefix, plain, "wamid.h.2", "una consulta")
    await push_message(redis, prefix, flaky, "wamid.h.3", "!fail=1")
    await push_message(redis, prefix, human, "wamid.h.4", "!review=asks_for_human")
    await push_message(redis, prefix, old, "wamid.h.5", "viejo", ts=int(time.time()) - 3600)
    await push_message(redis, prefix, chatty, "wamid.h.6", "primero !sleep=0.8")
    await records.wait_turns(chatty, 1, outcome=None)
    await push_message(redis, prefix, chatty, "wamid.h.7", "durante el turno")

    for person in (plain, flaky):
        await records.wait_turns(person, 1)
    await records.wait_turns(chatty, 2)

    await in_review(redis, prefix, count=2, what="two review items")
    keys = Keys(prefix)
    k = keys.tenant(TENANT)
    conversation_keys = (k.inbox, k.due, k.running, k.burst, k.conversation_prefix)

    async def last_finish_landed() -> bool:
        # The brain's record comes before the reply and the finish: wait for those (however
        # slow a loaded machine is), then check below that nothing else is left.
        if await redis.llen(k.outbox) < 4:
            return False
        left = [key for key in await scan_keys(redis, prefix) if key.startswith(conversation_keys)]
        return all(key.endswith((":memory", ":human")) for key in left)

    await wait_for(last_finish_landed, "the last finish")
    found = await scan_keys(redis, prefix)
    seen = [key for key in found if key.startswith(k.seen_book)]
    assert await markers.count(redis, k) == 7, "one dedupe marker a message, in a few keys"
    for key in seen:
        assert 0 < await redis.ttl(key) <= 2 * 3600 + 60, f"{key} must expire"
    # The 24-hour windows: fields of the tenant's book of windows (shared/lua/lib/lastin.lua),
    # whose keys expire.
    windows = [key for key in found if key.startswith(k.lastin_book)]
    assert k.lastin_gens in windows and len(windows) > 1, "answered people have a window"
    for key in windows:
        assert await redis.ttl(key) > 0, f"{key} must expire"
    # Per person, only what expires on its own: the AI memory and the pause of the person
    # whose batch went to review for a person (shared/ops/takeover.py).
    expiring = [
        key
        for key in found
        if key.endswith((":memory", ":human")) and key.startswith(k.conversation_prefix)
    ] + windows
    assert expiring, "answered people have a memory"
    assert k.human(human) in expiring and k.human(old) not in expiring, "too_old pauses no one"
    for key in expiring:
        assert await redis.ttl(key) > 0, f"{key} must expire"
    # The review list's index goes with its items (shared/lua/lib/review.lua): the time index,
    # one per reason and per person, the id map and the counts.
    index = {key for key in found if key.startswith(f"{k.review_ix}")}
    assert {k.review_ix, k.review_ix_of, k.review_counts} <= index
    assert await redis.zcard(k.review_ix) == 2 == await redis.hlen(k.review)
    # Only the bounded or permanent records remain: registry, counters, capped outbox, review,
    # the conversations index of the ops inbox (the newest 10 000, 7 days: its claim trims it),
    # and the running workers' heartbeats (each worker removes its own as it stops).
    rest = set(found) - set(seen) - set(expiring) - index
    kept = [keys.tenants, k.stats, k.outbox, k.review, k.conversations, keys.workers]
    assert sorted(rest) == sorted(kept), (
        "no inbox, due, running, burst, pending, batch or lock keys left"
    )
    assert await redis.zcard(k.conversations) == 5, "one entry a person"
    assert await redis.llen(k.outbox) == 4  # plain, flaky, chatty x2
    assert (await stats(redis, prefix))["messages"] == 7


async def test_statuses_are_consumed_and_counted(
    redis: Redis, prefix: str, fleet: WorkerFleet, records: Records
) -> None:
    await fleet.start(1)
    recipient = "5491100000051"
    for message_id, status in [
        ("wamid.out.1", "sent"),
        ("wamid.out.1", "delivered"),
        ("wamid.out.1", "read"),
        ("wamid.out.2", "sent"),
        ("wamid.out.2", "failed"),
    ]:
        assert await push_status(redis, prefix, recipient, message_id, status)
    assert await push_status(redis, prefix, recipient, "wamid.out.1", "read")  # again: a no-op
    # An event kind the worker does not know is kept whole for an operator, not dropped.
    k = Keys(prefix).tenant(TENANT)
    odd = events.encode({"v": 1, "kind": "typing", "person": recipient, "id": "x"})
    await Scripts().ingest(
        redis, k, seen=[k.seen("whatsapp:typing:x")], dedupe_ttl_s=60, events=[odd]
    )
    await wake_up(redis, prefix)

    async def counted() -> dict[str, int] | None:
        counts = await stats(redis, prefix)
        return counts if counts.get("statuses") == 6 else None

    counts = await wait_for(counted, "six statuses counted")
    assert counts["status:sent"] == 2 and counts["status:failed"] == 1
    assert counts["status:delivered"] == 1 and counts["status:read"] == 2
    assert "messages" not in counts
    # The odd event may come in the claim after the one that counted the statuses.
    await wait_for(lambda: redis.lrange(k.unroutable, 0, -1), "the odd event set aside")
    assert await redis.llen(k.inbox) == 0
    assert await redis.lrange(k.unroutable, 0, -1) == [odd]
    await asyncio.sleep(0.5)
    assert await records.turns(recipient) == [], "a status never starts a turn"
    assert await outbox(redis, prefix) == []
    assert not await redis.exists(
        k.pending(recipient), k.due, k.burst_shard(burst_shard_of(recipient))
    )
