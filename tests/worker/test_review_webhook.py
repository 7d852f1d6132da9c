"""Being told (docs/operating.md#being-told): every new review item, whatever made it, reaches
the team's receiver as one signed event, POSTed by real `python -m worker` processes with the
real httpx client to a stand-in receiver that checks the signature (scripts/standins/
review_hook.py); retried with backoff, taken over after a worker dies mid-POST, given up after
the bound with the item left in review. Without a URL nothing is queued at all."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from scripts.standins.review_hook import PATH, ReviewHookStandIn
from scripts.standins.server import free_port
from shared.keys import Keys
from shared.ops import review_webhook
from shared.settings import Settings
from shared.storage.scripts import Scripts
from tests.delivery.support import push_failed_status
from tests.support.helpers import standin_fixtures
from tests.worker.support import (
    TENANT,
    WorkerFleet,
    in_review,
    push_message,
    quick_store,
    review_items,
    scan_keys,
    stats,
    wait_exit,
    wait_for,
)

SECRET = "review-secret"


hook_server, hook = standin_fixtures("hook", lambda: ReviewHookStandIn(secret=SECRET))


def webhook_env(url: str, **more: object) -> dict[str, object]:
    return {
        "REVIEW_WEBHOOK_URL": url,
        "REVIEW_WEBHOOK_SECRET": SECRET,
        "REVIEW_WEBHOOK_TIMEOUT_S": "3",
        "REVIEW_WEBHOOK_RETRY_S": "0.2",
        **more,
    }


async def sent_events(hook: ReviewHookStandIn, n: int, timeout_s: float = 20) -> list[Any]:
    async def probe() -> list[Any] | None:
        events = hook.events()
        return events if len(events) >= n else None

    return await wait_for(probe, f"{n} review event(s) taken by the receiver", timeout_s)


async def counted(redis: Redis, prefix: str, field: str) -> dict[str, int]:
    """The tenant's stats once `field` was counted (the receiver has an event a moment before
    the worker settles it)."""

    async def probe() -> dict[str, int] | None:
        counts = await stats(redis, prefix)
        return counts if counts.get(field) else None

    return await wait_for(probe, f"{field} counted")


async def pending(redis: Redis, prefix: str) -> int:
    return int(await redis.zcard(Keys(prefix).tenant(TENANT).review_notify))


async def test_every_way_to_review_posts_one_signed_event(
    redis: Redis, prefix: str, fleet: WorkerFleet, hook: ReviewHookStandIn, settings: Settings
) -> None:
    url = hook.url + PATH
    # A `failed` 131047, one before the send was recorded (parked on the record) and one after:
    # the intake queues them as late delivery failures of the answered batch, driven on the
    # scripts before any worker runs; a worker then makes them one review item (finish.lua,
    # like every item) with the batch's messages.
    await Scripts().load(redis)
    store = quick_store(
        redis, settings, key_prefix=prefix, review_webhook_url=url, review_webhook_secret=SECRET
    )
    undelivered = "5491155550071"
    await push_message(redis, prefix, undelivered, "wamid.in.71", "hola, ¿abren hoy?")
    await store.claim(TENANT, 0, "intake")
    await asyncio.sleep(0.05)
    (batch,) = (await store.claim(TENANT, 1, "turn")).batches
    await push_failed_status(redis, prefix, undelivered, "wamid.out.early", 131047)
    await store.claim(TENANT, 0, "intake")  # parked on the record: no send recorded yet
    assert await store.record_part(batch, 0, "wamid.out.early")  # record_part.lua's item
    assert await store.record_part(batch, 1, "wamid.out.late")
    await push_failed_status(redis, prefix, undelivered, "wamid.out.late", 131047)
    await store.claim(TENANT, 0, "intake")  # claim.lua's item
    assert await store.finish_done(batch)
    assert await pending(redis, prefix) == 0, "no item yet: the worker makes it"

    await fleet.start(1, POLL_INTERVAL_S="0.5", REVIEW_AFTER_S="600", **webhook_env(url))
    await push_message(redis, prefix, "5491155550072", "wamid.in.72", "quiero hablar !review=human")
    await push_message(
        redis, prefix, "5491155550073", "wamid.in.73", "viejo", ts=int(time.time()) - 3600
    )
    await push_message(redis, prefix, "5491155550074", "wamid.in.74", "falla !fail=9")

    events = await sent_events(hook, 4, timeout_s=30)
    await asyncio.sleep(1.5)  # a second delivery of any of them would show by now
    requests = hook.requests
    assert len(requests) == 4 and all(r.status == 200 for r in requests), requests
    assert all(r.extra["verified"] for r in requests), "each signature checks out"
    for r in requests:  # and is what the docs say it is
        stamp = r.headers["x-review-timestamp"]
        assert r.headers["x-review-signature"] == review_webhook.signature(SECRET, stamp, r.raw)
        assert abs(int(stamp) - time.time()) < 60
        assert r.headers["content-type"] == "application/json"

    items = {i["id"]: i for i in await review_items(redis, prefix)}
    assert len(items) == 4
    by_item = {e["item"]["id"]: e for e in events}
    assert set(by_item) == set(items), "one event per review item"
    reasons = sorted(e["item"]["reason"] for e in events)
    assert reasons == ["human", "max_attempts", "too_old", "window_closed"]
    for item_id, event in by_item.items():
        item = items[item_id]
        assert event["id"] == f"{TENANT}:{item_id}" and event["type"] == "review_item.created"
        assert event["tenant"] == TENANT and isinstance(event["at_ms"], int)
        assert event["item"]["person"] == item["person"]
        assert event["item"]["error"] == item["error"]
        assert event["item"]["attempts"] == item["attempts"]
        assert event["item"]["reviewed_ms"] == item["reviewed_ms"]
        assert event["item"]["messages"] == len(item["messages"])
    too_old = next(e for e in events if e["item"]["reason"] == "too_old")
    assert too_old["item"]["preview"] == "viejo" and too_old["item"]["messages"] == 1
    closed = next(e for e in events if e["item"]["reason"] == "window_closed")
    assert closed["item"]["preview"] == "hola, ¿abren hoy?" and closed["item"]["messages"] == 1

    counts = await stats(redis, prefix)
    assert counts["review_webhook_sent"] == 4 and "review_webhook_gave_up" not in counts
    assert await pending(redis, prefix) == 0
    assert await redis.exists(Keys(prefix).tenant(TENANT).review_notify_events) == 0


@pytest.mark.cluster  # the scripts' keys share the tenant's slot (invariant 9)
async def test_a_receiver_failing_twice_gets_the_event_on_the_third_try(
    redis: Redis, prefix: str, fleet: WorkerFleet, hook: ReviewHookStandIn
) -> None:
    hook.fail_next(2, status=500)
    await fleet.start(1, **webhook_env(hook.url + PATH, REVIEW_WEBHOOK_RETRY_S="0.5"))
    await push_message(redis, prefix, "5491155550075", "wamid.in.75", "ayuda !review=human")

    (event,) = await sent_events(hook, 1)
    first, second, third = hook.requests
    assert [r.status for r in hook.requests] == [500, 500, 200]
    assert first.body == second.body == third.body == event, "the same event each time"
    # Backoff: 0.5 s, then 1 s (each + 0-20 %); timed generously on the late side only.
    assert second.time - first.time >= 0.5 and third.time - second.time >= 1.0
    counts = await counted(redis, prefix, "review_webhook_sent")
    assert counts["review_webhook_retries"] == 2 and counts["review_webhook_sent"] == 1
    assert await pending(redis, prefix) == 0


async def test_a_retry_after_from_the_receiver_is_honoured(
    redis: Redis, prefix: str, fleet: WorkerFleet, hook: ReviewHookStandIn
) -> None:
    hook.fail_next(1, status=429, retry_after="2")
    await fleet.start(1, **webhook_env(hook.url + PATH))  # its own backoff would be 0.2 s
    await push_message(redis, prefix, "5491155550076", "wamid.in.76", "ayuda !review=human")

    await sent_events(hook, 1)
    first, second = hook.requests
    assert first.status == 429 and second.status == 200
    assert second.time - first.time >= 2.0


async def test_an_answer_that_a_retry_would_not_change_is_given_up_at_once(
    redis: Redis, prefix: str, fleet: WorkerFleet, hook: ReviewHookStandIn
) -> None:
    hook.configure(secret="not-the-workers-secret")  # every signature is refused: 401
    await fleet.start(1, **webhook_env(hook.url + PATH))
    await push_message(redis, prefix, "5491155550077", "wamid.in.77", "ayuda !review=human")

    counts = await counted(redis, prefix, "review_webhook_gave_up")
    assert [r.status for r in hook.requests] == [401]
    assert "review_webhook_retries" not in counts and "review_webhook_sent" not in counts
    assert [i["reason"] for i in await review_items(redis, prefix)] == ["human"]
    assert "review event given up" in fleet.dump() and "HTTP 401" in fleet.dump()


async def test_a_worker_killed_mid_post_leaves_the_event_to_another(
    redis: Redis, prefix: str, fleet: WorkerFleet, hook: ReviewHookStandIn
) -> None:
    hook.hang_next(1, 120)  # the first POST never gets an answer from the receiver
    env = webhook_env(hook.url + PATH, REVIEW_WEBHOOK_TIMEOUT_S="3")  # lease: 3 + 5 s
    (victim,) = await fleet.start(1, **env)
    await push_message(redis, prefix, "5491155550078", "wamid.in.78", "ayuda !review=human")

    async def in_flight() -> bool:
        return len(hook.requests) == 1

    await wait_for(in_flight, "the first POST at the receiver")
    posted = hook.requests[0].time
    victim.send_signal(signal.SIGKILL)
    await wait_exit(victim, 5)
    (rescuer,) = await fleet.start(1, **env)

    (event,) = await sent_events(hook, 1, timeout_s=40)
    hung, delivered = hook.requests
    assert hung.status is None and delivered.status == 200
    assert hung.body == event and hung.extra["verified"] and delivered.extra["verified"]
    # Not before the victim's lease (taken just before its POST) ended.
    assert delivered.time - posted >= 8 - 1
    counts = await counted(redis, prefix, "review_webhook_sent")
    assert counts["review_webhook_sent"] == 1 and await pending(redis, prefix) == 0
    raw = await redis.hget(Keys(prefix).tenant(TENANT).review, event["item"]["id"])
    assert raw is not None and orjson.loads(raw)["reason"] == "human"
    assert rescuer.poll() is None


async def test_an_unreachable_receiver_is_given_up_after_the_bound_and_the_item_stays(
    redis: Redis, prefix: str, fleet: WorkerFleet
) -> None:
    url = f"http://127.0.0.1:{free_port()}{PATH}"  # nothing listens there
    await fleet.start(1, **webhook_env(url, REVIEW_WEBHOOK_GIVE_UP_S="2"))
    started = time.monotonic()
    await push_message(redis, prefix, "5491155550079", "wamid.in.79", "ayuda !review=human")

    counts = await counted(redis, prefix, "review_webhook_gave_up")
    took = time.monotonic() - started
    assert 2 <= took < 15, took
    # Tries at about 0, 0.2, 0.6, 1.4 and (the last, at the bound) 2 s.
    assert counts["review_webhook_retries"] >= 3 and "review_webhook_sent" not in counts
    (item,) = await review_items(redis, prefix)
    assert item["reason"] == "human", "the item itself stays in review"
    assert await pending(redis, prefix) == 0
    assert "review event given up" in fleet.dump()


async def test_without_a_url_nothing_is_queued(
    redis: Redis, prefix: str, fleet: WorkerFleet
) -> None:
    await fleet.start(1)
    await push_message(redis, prefix, "5491155550080", "wamid.in.80", "ayuda !review=human")

    await in_review(redis, prefix, what="the review item")
    assert not [k for k in await scan_keys(redis, prefix) if ":review:notify" in k]
    assert await redis.exists(Keys(prefix).review_notify_queue) == 0


async def test_a_notification_taken_by_a_dead_worker_goes_to_the_next_taker_only(
    redis: Redis, prefix: str
) -> None:
    """The lease, on the scripts: a settle with an old token changes nothing."""
    scripts = Scripts()
    await scripts.load(redis)
    k = Keys(prefix).tenant(TENANT)
    await redis.hset(k.review_notify_events, "b1", orjson.dumps({"item": "{}", "created_ms": 1}))
    await redis.zadd(k.review_notify, {"b1": 0})

    async def take(token: str, lease_ms: int) -> list[Any]:
        return list(
            await scripts.review_notify_take(redis, k, most=8, lease_ms=lease_ms, token=token)
        )

    async def settle(token: str, outcome: str) -> int:
        return int(
            await scripts.review_notify_settle(
                redis, k, item_id="b1", token=token, outcome=outcome, delay_ms=0, error=""
            )
        )

    first = await take("dead", 50)
    assert _text(first[2]) == "b1" and orjson.loads(first[3])["attempts"] == 1
    assert (await take("early", 50))[2:] == [], "leased: nobody else takes it"
    await asyncio.sleep(0.1)
    second = await take("next", 5000)
    expected = {"item": "{}", "created_ms": 1, "attempts": 2, "token": "next"}
    assert orjson.loads(second[3]) == expected
    assert await settle("dead", "sent") == 0, "the dead worker's token no longer holds it"
    assert await redis.zcard(k.review_notify) == 1
    assert await settle("next", "sent") == 1
    assert await redis.exists(k.review_notify, k.review_notify_events) == 0
    assert _text(await redis.hget(k.stats, "review_webhook_sent")) == "1"


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
