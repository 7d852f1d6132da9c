"""RawPipeline against a real Redis: replies in order, errors in place, never out of step."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from scripts.dev.redis_server import RedisServer
from shared.storage.raw_pipeline import RawPipeline


async def blpop_blocks(redis: Redis) -> None:
    """Wait (2 s at most) until a client of the server is blocked in a BLPOP."""
    for _ in range(200):
        if any(c["cmd"] == "blpop" for c in await redis.client_list()):
            return
        await asyncio.sleep(0.01)


def retrying_client(url: str) -> Redis:
    """Like the receiver's: one immediate retry on a broken connection, no socket timeout."""
    return Redis.from_url(
        url, retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    )


async def test_replies_come_back_in_order_with_error_replies_in_place(redis: Redis) -> None:
    wire = RawPipeline(redis)
    replies = await wire.exchange(
        [
            ("SADD", "rp:set", "a", "b"),
            ("EVALSHA", "0" * 40, 0),  # no such script
            ("LPUSH", "rp:list", b"\x00binary\r\n", 7, 1.5),
            ("INCR", "rp:set"),  # wrong type
            ("LRANGE", "rp:list", 0, -1),
        ]
    )
    assert replies[0] == 2
    assert isinstance(replies[1], NoScriptError)
    assert replies[2] == 3
    assert isinstance(replies[3], ResponseError)
    assert replies[4] == [b"1.5", b"7", b"\x00binary\r\n"]
    # the connection stayed in step: the next batch gets its own replies, not leftovers
    assert await wire.exchange([("PING",), ("SCARD", "rp:set")]) == [b"PONG", 2]


async def test_a_batch_cancelled_while_redis_stalls_leaves_no_stale_reply(redis: Redis) -> None:
    wire = RawPipeline(redis)
    await wire.exchange([("SET", "rp:key", "before")])
    # A 2 s pause against the 0.2 s timeout: on a loaded machine too the GET is still stalled
    # when it is cancelled.
    await redis.execute_command("CLIENT", "PAUSE", "2000", "ALL")
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await wire.exchange([("GET", "rp:key")])
    finally:
        await asyncio.sleep(2.0)  # the pause ends; the stalled GET's reply would arrive now
    await redis.set("rp:key", "after")
    assert await wire.exchange([("GET", "rp:key")]) == [b"after"]


async def test_a_killed_connection_is_retried_once_and_the_batch_goes_through(
    redis_server: RedisServer, redis: Redis
) -> None:
    client = retrying_client(redis_server.url)
    try:
        wire = RawPipeline(client)
        await wire.exchange([("CLIENT", "SETNAME", "raw-pipeline-test")])
        await redis.execute_command("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
        assert await wire.exchange([("INCR", "rp:n"), ("INCR", "rp:n")]) == [1, 2]
    finally:
        await client.aclose()


async def test_redis_down_raises_connection_error_and_recovers_when_back() -> None:
    server = RedisServer().start()
    client = retrying_client(server.url)
    try:
        wire = RawPipeline(client)
        assert await wire.exchange([("PING",)]) == [b"PONG"]
        server.stop()
        with pytest.raises(RedisConnectionError):
            await wire.exchange([("PING",)])
        server.start()
        assert await wire.exchange([("PING",)]) == [b"PONG"]
    finally:
        await client.aclose()
        server.close()


async def test_closing_the_client_disconnects_the_held_connections(
    redis_server: RedisServer, redis: Redis
) -> None:
    client = Redis.from_url(redis_server.url)
    wire = RawPipeline(client)
    await wire.exchange([("CLIENT", "SETNAME", "raw-pipeline-held")])
    assert await _named(redis, "raw-pipeline-held")
    await client.aclose()
    for _ in range(100):  # Redis notices the closed socket within a loop turn or two
        if not await _named(redis, "raw-pipeline-held"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the held connection is still open after the client was closed")


async def _named(redis: Redis, name: str) -> bool:
    return any(c["name"] == name for c in await redis.client_list())


async def test_a_retry_after_a_broken_connection_sends_only_what_was_not_answered(
    redis_server: RedisServer, redis: Redis
) -> None:
    """The INCR answered before the connection broke ran once: only the BLPOP and the INCR
    after it go again (the whole batch again would have counted 3)."""
    client = retrying_client(redis_server.url)
    try:
        wire = RawPipeline(client)
        await wire.exchange([("CLIENT", "SETNAME", "raw-pipeline-retry")])
        batch = asyncio.create_task(
            wire.exchange([("INCR", "rp:n"), ("BLPOP", "rp:wake", 10), ("INCR", "rp:n")])
        )
        for _ in range(200):  # the first INCR ran and the BLPOP blocks
            if await redis.get("rp:n") == b"1":
                break
            await asyncio.sleep(0.01)
        await redis.execute_command("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
        await blpop_blocks(redis)  # the retry's BLPOP blocks again on a new connection
        await redis.rpush("rp:wake", "go")
        assert await batch == [1, [b"rp:wake", b"go"], 2]
        assert await redis.get("rp:n") == b"2"
    finally:
        await client.aclose()
