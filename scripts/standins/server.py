"""Run an ASGI app on uvicorn in a background thread, on a free local port.

    with BackgroundServer(app) as server:          # or: async with BackgroundServer(app)
        httpx.get(server.url + "/healthz")

The socket is bound before the thread starts (port 0 = the OS picks a free one), so `.url` is
known and the port cannot be taken in between. The server runs its own event loop in its own
thread: it keeps answering while a test's event loop is busy or blocked, and a sync test can use
it as well as an async one. `stop()` waits for in-flight requests for at most `graceful_s`, then
cancels them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from types import TracebackType
from typing import Any, Self

import uvicorn

__all__ = ["BackgroundServer", "Startable", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (racy: prefer `BackgroundServer(port=0)`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class Startable:
    """`with` and `async with` for whatever has `start()` and `stop()` (the server, the
    stand-ins): entering starts it, leaving stops it; the async forms run them in a thread, as
    starting waits for the server to listen."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)


class BackgroundServer(Startable):
    """uvicorn serving `app` from a daemon thread. Restartable: `start()` after `stop()` works."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        graceful_s: int = 1,
        name: str = "standin",
    ) -> None:
        self.app = app
        self.host = host
        self.requested_port = port
        self.log_level = log_level
        self.graceful_s = graceful_s
        self.name = name
        self.port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>` (no trailing slash). Raises if the server is not running."""
        if self.port is None:
            raise RuntimeError(f"{self.name}: server is not running (call start() first)")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> Self:
        if self.running:
            return self
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only when
        # the socket says TCP, and without it every response waits ~40 ms (Nagle + delayed ACK).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.requested_port))
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(True)
        port: int = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=port,
            log_level=self.log_level,
            access_log=False,
            lifespan="auto",
            loop="asyncio",
            timeout_graceful_shutdown=self.graceful_s,
        )
        server = uvicorn.Server(config)
        self._error = None

        def run() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            except BaseException as exc:  # reported by start() or stop()
                self._error = exc
            finally:
                with contextlib.suppress(OSError):
                    sock.close()

        thread = threading.Thread(target=run, name=f"{self.name}:{port}", daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive():
                self._server = self._thread = None
                raise RuntimeError(f"{self.name}: server failed to start") from self._error
            if time.monotonic() > deadline:
                server.should_exit = True
                thread.join(timeout)
                self._server = self._thread = None
                raise TimeoutError(f"{self.name}: server did not start within {timeout} s")
            time.sleep(0.005)
        self.port = port
        return self

    def stop(self, timeout: float = 10.0) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout)
        self._server = self._thread = None
        self.port = None

    def __repr__(self) -> str:
        where = self.url if self.port is not None else "stopped"
        return f"<BackgroundServer {self.name} {where}>"
