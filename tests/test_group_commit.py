"""GroupCommitter on a real Redis: rounds written early (`eager_at`), at most `max_in_flight`
out at once, every caller its own reply, a broken connection retried."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis as sync_redis
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from scripts.dev.redis_server import RedisServer
from shared.keys import TenantKeys
from shared.storage.group_commit import MAX_GROUP, GroupCommitter
from shared.storage.scripts import Scripts
from tests.test_raw_pipeline import blpop_blocks, retrying_client


async def _warm(committer: GroupCommitter, connections: int) -> None:
    """Hold `connections` connections, as a busy worker does after its first rounds: the
    first round opens one; an early write that finds none idle has one more opened."""
    await committer.run([("PING",)])
    raw = committer._raw
    assert raw is not None
    for _ in range(200):
        if len(raw._idle) >= connections:
            return
        raw._open_one()
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(raw._idle)} of {connections} connections held")


async def test_enough_waiting_commands_are_written_before_the_submitting_callback_returns(
    redis_server: RedisServer, redis: Redis
) -> None:
    """Four INCRs submitted in one callback, which then blocks: with `eager_at=4` Redis ran
    them meanwhile; without, nothing was written until the callback gave the loop back."""
    watcher = sync_redis.Redis.from_url(redis_server.url)
    for eager_at, expected in ((4, b"4"), (0, None)):
        key = f"gc:eager:{eager_at}"
        committer = GroupCommitter(redis, Scripts(), eager_at=eager_at, max_in_flight=2)
        await _warm(committer, 2)
        futures = [committer.submit(("INCR", key)) for _ in range(4)]
        time.sleep(0.3)  # noqa: ASYNC251 - the loop held on purpose: only what was written runs
        assert watcher.get(key) == expected
        assert await asyncio.gather(*futures) == [1, 2, 3, 4]
    watcher.close()


async def test_many_callers_each_get_their_own_reply_with_two_rounds_out_at_most(
    redis: Redis,
) -> None:
    committer = GroupCommitter(redis, Scripts(), max_batch=8, eager_at=4, max_in_flight=2)
    out_at_once = 0

    async def caller(i: int) -> list[object]:
        nonlocal out_at_once
        got = []
        for step in range(5):  # each step waits for the last: a turn's order of calls
            got.append(await committer.submit(("INCRBY", f"gc:n:{i}", step + 1)))
            out_at_once = max(out_at_once, committer._in_flight)
        got.append(await committer.submit(("GET", f"gc:n:{i}")))
        return got

    results = await asyncio.gather(*(caller(i) for i in range(200)))
    assert all(r == [1, 3, 6, 10, 15, b"15"] for r in results)
    assert 1 <= out_at_once <= 2
    assert len(committer._raw._idle) <= 2, "no more connections than rounds out at once"  # type: ignore[union-attr]


async def test_a_run_of_several_commands_stays_in_one_round_in_order(redis: Redis) -> None:
    """An eager write takes the waiting commands whole: a run (LPUSH then LTRIM, as the
    outbox sender does) is never split between two connections."""
    committer = GroupCommitter(redis, Scripts(), max_batch=8, eager_at=2, max_in_flight=2)
    await _warm(committer, 2)
    for i in range(50):
        await asyncio.gather(
            committer.run([("LPUSH", "gc:list", i), ("LTRIM", "gc:list", 0, 2)]),
            committer.submit(("INCR", "gc:other")),
        )
    assert await redis.lrange("gc:list", 0, -1) == [b"49", b"48", b"47"]


async def test_an_early_round_whose_connection_breaks_is_sent_again_and_answered(
    redis_server: RedisServer, redis: Redis
) -> None:
    client = retrying_client(redis_server.url)
    try:
        committer = GroupCommitter(client, Scripts(), eager_at=2, max_in_flight=2)
        await _warm(committer, 2)
        # Written at once: a blocked BLPOP keeps the round out while its connection is killed.
        round_ = [committer.submit(("BLPOP", "gc:wake", 10)), committer.submit(("INCR", "gc:k"))]
        assert not committer._waiting, "written at once, not left to the flush"
        await blpop_blocks(redis)
        await redis.execute_command("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
        await blpop_blocks(redis)  # the retry's BLPOP blocks again on a new connection
        await redis.rpush("gc:wake", "go")
        assert await asyncio.gather(*round_) == [[b"gc:wake", b"go"], 1]
    finally:
        await client.aclose()


def _script_calls(info: dict[str, Any]) -> int:
    return sum(v["calls"] for n, v in info.items() if n in ("cmdstat_evalsha", "cmdstat_fcall"))


async def test_grouped_calls_of_one_round_go_as_one_command_each_caller_its_element(
    redis: Redis,
) -> None:
    """renew.lua's `turns` group, called per turn: the calls of a round go as one command
    (at most MAX_GROUP items each), every caller gets its own element of the array reply;
    a caller that gave up before the round went is left out of it."""
    k = TenantKeys("gc:{g}")
    scripts = Scripts()
    await scripts.load(redis)
    bound = scripts.renew.bind(k, lease_ms=60_000)
    committer = GroupCommitter(redis, scripts)
    people = [f"p{i}" for i in range(MAX_GROUP + 3)]
    for p in people[::2]:  # every other person's lock held by its token
        await redis.set(k.lock(p), f"tok-{p}", px=5_000)
    before = _script_calls(await redis.info("commandstats"))
    futures = [committer.submit_grouped(bound, (p, f"tok-{p}")) for p in people]
    gave_up = futures[0]
    gave_up.cancel()
    replies = await asyncio.gather(*futures[1:])
    assert replies == [1 if i % 2 == 0 else 0 for i in range(1, len(people))]
    assert _script_calls(await redis.info("commandstats")) - before == 2, "two groups"
    assert await redis.pttl(k.lock(people[0])) <= 5_000, "the caller that gave up: not sent"
    assert await redis.pttl(k.lock(people[2])) > 5_000


async def test_a_grouped_command_that_fails_fails_each_of_its_callers(redis: Redis) -> None:
    k = TenantKeys("gc:{h}")
    bound = Scripts().renew.bind(k, lease_ms="not a number")
    committer = GroupCommitter(redis, Scripts())
    await redis.set(k.lock("a"), "ta")
    await redis.set(k.lock("b"), "tb")
    results = await asyncio.gather(
        committer.submit_grouped(bound, ("a", "ta")),
        committer.submit_grouped(bound, ("b", "tb")),
        committer.submit(("INCR", "gc:{h}:n")),
        return_exceptions=True,
    )
    assert [type(r) for r in results[:2]] == [ResponseError, ResponseError]
    assert results[2] == 1, "the round's other commands are answered"
