"""A pipeline of commands packed once as RESP and sent on a connection of its own.

redis-py's pipeline packs each queued command in Python, takes a connection from the pool
(a lock, a readiness check, observability hooks) and gives it back for every round trip: at
the receiver's ~20 requests per round that was a measurable share of each request's CPU
(docs/benchmarks/receiver.md). Here hiredis' C packer encodes the whole batch in one go and
each in-flight batch keeps a connection checked out of the client's pool for as long as the
process runs, so a round trip is one write and the reads of its replies.

The replies are taken straight from the connection's hiredis reader, as many as it holds per
read from the socket: redis-py's `read_response` spent ~3 µs of Python per reply (a timeout
context, an error-host string, a parser hop), two of them per turn (docs/benchmarks/worker.md).
A connection without a hiredis reader (hiredis missing, another redis-py) reads reply by reply.

Single server only: a cluster client routes commands per slot, use its own pipeline there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

try:  # what redis-py's parser has its hiredis reader answer while a reply is incomplete
    from redis._parsers.hiredis import NOT_ENOUGH_DATA
except ImportError:  # another redis-py: reply by reply (`_round_trip`)
    NOT_ENOUGH_DATA = None

Command = Sequence[Any]  # name and arguments: str, bytes, int or float


class Prepacked(tuple[Any, ...]):
    """A command whose first `at` values were packed as RESP once (`head`), for the calls a
    turn makes on the hot path (shared/storage/scripts.py `BoundCall`): hiredis formats each
    value with a `sprintf` (and an int through `repr`), ~700 instructions a value, and half of
    a finish's ~35 values are the tenant's, the same every turn. Still the command's tuple,
    for a cluster pipeline and anything else that reads it."""

    head: bytes
    at: int

    def resp(self) -> bytes:
        """The command as RESP: the count, the packed head, the rest packed now."""
        tail: bytes = hiredis.pack_command(self[self.at :])
        return b"".join((b"*%d\r\n" % len(self), self.head, tail[tail.index(b"\n") + 1 :]))


def packed(command: Command) -> bytes:
    """One command as RESP."""
    if type(command) is Prepacked:
        return command.resp()
    resp: bytes = hiredis.pack_command(tuple(command))
    return resp


class Sent(NamedTuple):
    """A batch `RawPipeline.send_now` wrote: its connection (held until its replies are read)
    and its bytes (sent again on a retry)."""

    connection: Any
    payload: bytes


class RawPipeline:
    """Sends batches of commands on connections held from a single-server client's pool."""

    def __init__(self, redis: Any, held_at_most: int = 1) -> None:
        self._pool = redis.connection_pool
        # Idle held connections; one per batch in flight at most. They stay in the pool's
        # in-use set, so closing the client still disconnects them.
        self._idle: list[Any] = []
        # How many `send_now` may hold (`exchange` takes one more whenever none is idle), and
        # the one being opened for it.
        self._held_at_most = held_at_most
        self._held = 0
        self._opening: asyncio.Task[None] | None = None

    def _open_one(self) -> None:
        """Open one more connection for `send_now`, in the background (it found none idle)."""
        if self._opening is not None or self._held >= self._held_at_most:
            return

        async def open_() -> None:
            try:
                connection = await self._pool.get_connection()
            except Exception:  # the next round's `exchange` meets it and says so
                return
            finally:
                self._opening = None
            self._held += 1
            self._idle.append(connection)

        self._opening = asyncio.get_running_loop().create_task(open_())

    async def exchange(self, commands: Sequence[Command]) -> list[Any]:
        """Every command's reply, in order; an error reply is returned as its exception.

        A broken connection is retried per the client's `retry` policy: the commands not yet
        answered are sent again (redis-py's pipeline sends the whole batch again, which runs
        the answered ones twice); any other failure, or cancellation, raises and leaves the
        connection disconnected, so it never carries stale replies.
        """
        payload = b"".join([packed(command) for command in commands])
        if self._idle:
            connection = self._idle.pop()
        else:
            connection = await self._pool.get_connection()
            self._held += 1
        replies: list[Any] = []
        await self._retried(
            connection, lambda: self._round_trip(connection, payload, commands, replies)
        )
        return replies

    def send_now(self, commands: Sequence[Command]) -> Sent | None:
        """Write these commands at once, before the caller goes on (`exchange` writes when
        its task first runs, after every callback already queued): on an idle connection
        whose stream writer takes bytes as they are; None when there is none (then use
        `exchange`). `replies` reads their answers."""
        if not self._idle:
            self._open_one()
            return None
        connection = self._idle[-1]
        writer = getattr(connection, "_writer", None)
        if writer is None or not connection.is_connected or writer.is_closing():
            return None
        payload = b"".join([packed(command) for command in commands])
        self._idle.pop()
        writer.write(payload)
        return Sent(connection, payload)

    async def replies(self, sent: Sent, commands: Sequence[Command]) -> list[Any]:
        """The replies to what `send_now` wrote, as `exchange` gives them (a broken connection
        retried the same way)."""
        connection = sent.connection
        replies: list[Any] = []
        tries = 0

        async def attempt() -> None:
            nonlocal tries
            tries += 1
            if tries == 1:  # written already: read
                await _read_all(connection, len(commands), replies)
            else:  # a retry on a new connection: what was not answered goes again
                await self._round_trip(connection, sent.payload, commands, replies)

        await self._retried(connection, attempt)
        return replies

    async def _retried(self, connection: Any, attempt: Callable[[], Awaitable[None]]) -> None:
        """Run `attempt` under the client's retry policy (a broken connection is disconnected
        and tried again); any other failure leaves the connection disconnected. The connection
        is idle again after."""
        try:
            await connection.retry.call_with_retry(attempt, lambda error: connection.disconnect())
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        finally:
            self._idle.append(connection)

    @staticmethod
    async def _round_trip(
        connection: Any, payload: bytes, commands: Sequence[Command], replies: list[Any]
    ) -> None:
        """Send the commands not yet answered (all of them on a first try) and read their
        replies into `replies`."""
        if replies:  # a retry: the answered commands ran; the rest may not have
            payload = b"".join([packed(c) for c in commands[len(replies) :]])
        # A health check would cost a PING round trip; a dead connection shows up as a
        # ConnectionError on the read instead, which the retry policy handles.
        await connection.send_packed_command(payload, check_health=False)
        await _read_all(connection, len(commands), replies)


async def _read_all(connection: Any, count: int, replies: list[Any]) -> None:
    """Read replies into `replies` until it holds `count`."""
    parser = getattr(connection, "_parser", None)
    reader = getattr(parser, "_reader", None)
    bulk = NOT_ENOUGH_DATA is not None and hasattr(parser, "read_from_socket")
    if bulk and isinstance(reader, hiredis.Reader):
        await _read_replies(parser, reader, count, replies)
        return
    while len(replies) < count:
        try:
            replies.append(await connection.read_response())
        except ResponseError as exc:  # the reply was read: the connection stays in step
            replies.append(exc)


async def _read_replies(
    parser: Any, reader: hiredis.Reader, count: int, replies: list[Any]
) -> None:
    """Read replies into `replies` until it holds `count`, from a redis-py hiredis parser's
    reader, fed from its socket as needed. An error reply comes back as its exception (the
    reader makes it: redis-py's error classes), in place; a reply that is a connection error,
    or a closed socket, raises."""
    gets, append = reader.gets, replies.append
    try:
        while len(replies) < count:
            reply = gets()
            if reply is NOT_ENOUGH_DATA:
                await parser.read_from_socket()
                continue
            if isinstance(reply, RedisConnectionError):
                raise reply
            append(reply)
    except OSError as exc:  # as redis-py's read_response says it: the retry policy's error
        raise RedisConnectionError(f"Error while reading from Redis: {exc!r}") from exc
