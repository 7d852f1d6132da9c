"""A TCP proxy in front of the test Redis that can lose Redis's answers, not the commands.

A network that fails one way round: while `dropping`, every command a client sends still reaches
Redis, which runs it, but its answer never comes back, so the client times out on a call that
did happen. That is the one fault in which a claim locks batches for a worker that never learns
of them, made at will (a frozen Redis only shows it by chance: the call must run just before the
freeze). `resume()` closes the connections that lost answers (their byte streams are out of
step; the client opens new ones) and passes everything again.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit


class AnswerDroppingProxy:
    def __init__(self, redis_url: str) -> None:
        target = urlsplit(redis_url)
        self._target = (target.hostname or "127.0.0.1", target.port or 6379)
        self._path = target.path
        self._server: asyncio.Server | None = None
        self.dropping = False
        self._spoilt: set[asyncio.StreamWriter] = set()  # lost an answer: closed at resume
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen; the URL a client reaches Redis by through the proxy."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}{self._path}"

    def drop(self) -> None:
        self.dropping = True

    def resume(self) -> None:
        self.dropping = False
        for writer in self._spoilt:
            writer.close()
        self._spoilt.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, writer, answers=False)),
            asyncio.create_task(self._pump(up_reader, writer, writer, answers=True)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for w in (writer, up_writer):
            w.close()
        self._tasks.difference_update(pumps)

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        client: asyncio.StreamWriter,
        *,
        answers: bool,
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                if answers and (self.dropping or client in self._spoilt):
                    self._spoilt.add(client)
                    continue
                sink.write(data)
                await sink.drain()
