"""What both stand-ins share: the request record, the served-app base class, wait helpers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeVar

import orjson
from starlette.responses import Response

from scripts.standins.server import BackgroundServer

T = TypeVar("T")

# Request headers worth keeping in a record (secrets are kept too: tests assert on them).
RECORDED_HEADERS = (
    "authorization",
    "content-type",
    "user-agent",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "x-stainless-retry-count",
    "x-stainless-timeout",
    "idempotency-key",
)


@dataclass
class RecordedRequest:
    """One request as the stand-in saw it, and what it answered.

    `status`/`response` are None while the answer is still pending (latency, hang); `kind` says
    what the stand-in made of it ("text", "template", "read", "messages", "invalid", ...).
    `answered` is when the answer was decided (`time.time()`), None while pending: with `time`
    it tells how long a request was in flight (the chaos suite checks that no two requests of
    one person ever were at once).
    """

    time: float
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any = None
    kind: str = ""
    status: int | None = None
    response: Any = None
    fault: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    generation: int = 0  # the stand-in's clear() count when it arrived
    answered: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "answered": self.answered,
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "kind": self.kind,
            "status": self.status,
            "response": self.response,
            "fault": repr(self.fault) if self.fault is not None else None,
            **self.extra,
        }


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(payload), status_code=status, headers=headers, media_type="application/json"
    )


class CutResponse(Response):
    """The status line, the headers and half the body, then the connection is closed (uvicorn
    closes it when the app returns mid-body, and logs that it did): an answer lost on the way
    back, after the request was carried out. The client sees a dropped connection."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        half = self.body[: len(self.body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})


def pick_headers(headers: Any) -> dict[str, str]:
    return {name: headers[name] for name in RECORDED_HEADERS if name in headers}


def as_tuple(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)


class StandInBase:
    """A stand-in owns a Starlette `app` and can serve it itself (background thread, free port).

    `start()`/`stop()`, `url`, `with` and `async with` come from here. Sleeps inside handlers go
    through `_sleep`, which `stop()` interrupts, so a hung request never delays a test's teardown.
    """

    name = "standin"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._records: list[RecordedRequest] = []
        self._generation = 0  # bumped by clear(): requests still waiting become stale
        self.host = host
        self.port_requested = port
        self._server: BackgroundServer | None = None

    @property
    def app(self) -> Any:  # overridden: the Starlette app
        raise NotImplementedError

    # ------------------------------------------------------------------ serving

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"{self.name} is not running (call start() first)")
        return self._server.url

    @property
    def port(self) -> int:
        if self._server is None or self._server.port is None:
            raise RuntimeError(f"{self.name} is not running (call start() first)")
        return self._server.port

    def start(self) -> Self:
        if self._server is None:
            self._stopping.clear()
            server = BackgroundServer(
                self.app, host=self.host, port=self.port_requested, name=self.name
            )
            server.start()
            self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self._stopping.set()
            server.stop()

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

    async def _sleep(self, seconds: float, generation: int | None = None) -> bool:
        """Sleep in the server's loop. False (early) when the stand-in is stopping, or when
        `clear()`/`reset()` ran meanwhile (`generation` given): the request belongs to an
        earlier test and must not touch the new state (e.g. take a reply queued since)."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set():
            if generation is not None and generation != self._generation:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, 0.05))
        return False

    # ------------------------------------------------------------------ records

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far (a copy, oldest first), control calls excluded."""
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        """Forget the recorded requests (faults and configuration stay). Requests still
        waiting (latency, hang) are answered 503 without touching the stand-in's state."""
        with self._lock:
            self._records.clear()
            self._generation += 1

    def _record(self, record: RecordedRequest) -> RecordedRequest:
        with self._lock:
            record.generation = self._generation
            self._records.append(record)
        return record

    def _finish(
        self, record: RecordedRequest, status: int, response: Any, kind: str | None = None
    ) -> None:
        with self._lock:
            record.status = status
            record.response = response
            record.answered = time.time()
            if kind is not None:
                record.kind = kind

    # ------------------------------------------------------------------ waiting

    def wait_for(
        self, predicate: Callable[[], T], timeout: float = 5.0, interval: float = 0.01
    ) -> T:
        """Poll `predicate` until it returns something truthy; return it. TimeoutError otherwise.

        Blocks the calling thread: from async code use `await_for` (the stand-in keeps running
        either way, but an app under test living in the test's event loop would not).
        """
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.name}: condition not met within {timeout} s")
            time.sleep(interval)

    async def await_for(
        self,
        predicate: Callable[[], T],
        timeout: float = 5.0,  # noqa: ASYNC109
        interval: float = 0.01,
    ) -> T:
        """`wait_for` for async tests: polls with `asyncio.sleep`."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.name}: condition not met within {timeout} s")
            await asyncio.sleep(interval)
