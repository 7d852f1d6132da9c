"""What the stand-ins share: the request record, and `StandInBase`, which serves a stand-in's
app and keeps its records, its injected faults and latency, and its `/_control` endpoint.

Each stand-in adds its own API routes, fault rule (what a rule matches, what it answers) and
configuration; everything about recording, faults being used up, answers cut by a `drop`
fault, stale requests after a `clear()`, and driving it over HTTP lives here once.
"""

from __future__ import annotations

import asyncio
import hmac
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from scripts.standins.server import BackgroundServer, Startable

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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

# The default of `configure` keywords: "leave this setting as it is" (None is a real value).
UNSET: Any = object()

# One `/_control` op: takes the request's JSON; what it returns is not used.
ControlOp = Callable[[Mapping[str, Any]], object]


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
        """The record as `GET /_requests` lists it; dataclasses in `extra` (what was sent or
        created) become objects."""
        extra = {
            key: asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
            for key, value in self.extra.items()
        }
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
            **extra,
        }


class Fault(Protocol):
    """What every stand-in's fault rule (a dataclass) has; each adds what it matches and what
    error it answers. `count` None: never used up. `drop`: the request is carried out as if
    there were no fault, then its answer is cut halfway (`CutResponse`)."""

    status: int | None
    raw_body: str | None
    content_type: str
    delay: float
    count: int | None
    drop: bool
    hits: int

    def to_json(self) -> dict[str, Any]: ...


F = TypeVar("F", bound=Fault)


def fault_fields(rule: type[DataclassInstance], payload: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of fault rule class `rule` that a `/_control` "fail" op gives (`kinds` as a
    frozenset; `hits` is the stand-in's own count, never given)."""
    given = {f.name: payload[f.name] for f in fields(rule) if f.name in payload}
    given.pop("hits", None)
    if "kinds" in given:
        given["kinds"] = frozenset(given["kinds"])
    return given


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        half = self.body[: len(self.body) // 2]
        await send({"type": "http.response.body", "body": half, "more_body": True})


def pick_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in RECORDED_HEADERS if name in headers}


def as_tuple(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)


def accepts(accepted: tuple[str, ...] | None, credential: str | None) -> bool:
    """Whether `credential` is one of `accepted` (None: any non-empty one), in constant time."""
    if not credential:
        return False
    if accepted is None:
        return True
    return any(hmac.compare_digest(credential.encode(), a.encode()) for a in accepted)


def _json_or_none(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


class StandInBase(Startable, Generic[F]):
    """A stand-in owns a Starlette `app` and can serve it itself (background thread, free port).

    `start()`/`stop()`, `url`, `with` and `async with` come from here. Sleeps inside handlers go
    through `_sleep`, which `stop()` interrupts, so a hung request never delays a test's teardown.

    A subclass builds its app with `_serve(routes)`, sets `_initial_config` and implements
    `configure`, `state`, `_stale`, `_fault_answer` and `_unknown_path`; its handlers record a
    request with `_receive`, wait out latency and fault delays with `_delay`, take a matching
    fault with `_take_fault` and answer it with `_injected`.
    """

    name = "standin"
    # Each stand-in's own keywords, all defaulting to UNSET (`{"op": "config"}` calls it).
    configure: Callable[..., None]
    _initial_config: dict[str, Any]  # what `reset()` configures again
    _app: Starlette

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, seed: int | None = 0) -> None:
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._records: list[RecordedRequest] = []
        self._generation = 0  # bumped by clear(): requests still waiting become stale
        self.host = host
        self.port_requested = port
        self._server: BackgroundServer | None = None
        self.latency = 0.0
        self._faults: list[F] = []
        self._seed = seed
        self._rng = random.Random(seed)  # decides `probability` faults

    @property
    def app(self) -> Starlette:
        return self._app

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

    def _serve(self, routes: list[Route]) -> Starlette:
        """The app: `/_control`, `/_requests` and `/_health`, then `routes`, then every other
        path to `_unknown_path`."""
        return Starlette(
            routes=[
                Route("/_control", self._control_endpoint, methods=["GET", "POST"]),
                Route("/_requests", self._requests_endpoint, methods=["GET"]),
                Route("/_health", self._health, methods=["GET"]),
                *routes,
                Route("/{path:path}", self._unknown_path, methods=["GET", "POST", "PUT", "DELETE"]),
            ],
            lifespan=self._lifespan,
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield  # overridden where the stand-in needs its own start-up and shutdown

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

    async def _receive(
        self,
        request: Request,
        *,
        kind: str = "",
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> RecordedRequest:
        """Record `request` (its body parsed when it is JSON, else None; `headers`: instead of
        the usual RECORDED_HEADERS)."""
        raw = await request.body()
        return self._record(
            RecordedRequest(
                time=time.time(),
                method=request.method,
                path=request.url.path,
                headers=pick_headers(request.headers) if headers is None else headers,
                raw=raw,
                body=_json_or_none(raw),
                kind=kind,
                extra=extra or {},
            )
        )

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

    def _answer(
        self,
        record: RecordedRequest,
        status: int,
        body: Any,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """Answer JSON `body` with `status`, recorded (with `kind`, when it says more). A 200
        for a request whose fault drops is recorded the same, then cut on the way out: the
        request WAS carried out, and the client never learns what it made."""
        self._finish(record, status, body, kind)
        if status == 200 and record.fault is not None and record.fault.drop:
            return CutResponse(orjson.dumps(body), headers=headers, media_type="application/json")
        return json_response(body, status, headers)

    async def _delay(self, record: RecordedRequest, seconds: float) -> bool:
        """Hold the request `seconds` (latency, a fault's delay). False: the stand-in was
        stopped or cleared meanwhile, and the request must be answered `_stale`."""
        return seconds <= 0 or await self._sleep(seconds, record.generation)

    def _stale(self, record: RecordedRequest) -> Response:
        """The 503 for a request that outlived a `clear()` (in the API's own error shape)."""
        raise NotImplementedError

    async def _unknown_path(self, request: Request) -> Response:
        """A path the API does not have: recorded as "invalid", answered as the API does."""
        raise NotImplementedError

    # ------------------------------------------------------------------ faults

    def add_fault(self, fault: F) -> F:
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove_fault(self, fault: F) -> None:
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    @property
    def faults(self) -> list[F]:
        with self._lock:
            return list(self._faults)

    def set_latency(self, seconds: float) -> None:
        """Every request waits `seconds` before being handled."""
        with self._lock:
            self.latency = float(seconds)

    def reset_faults(self) -> None:
        """No faults, no latency."""
        with self._lock:
            self._faults.clear()
            self.latency = 0.0

    def reset(self) -> None:
        """Back to the state right after the constructor: `reset_faults()`, `clear()`, the RNG
        reseeded, and every `configure` setting as the constructor set it."""
        self.reset_faults()
        self.clear()
        self._reseed(self._seed)
        self.configure(**self._initial_config)

    def _reseed(self, seed: int | None) -> None:
        with self._lock:
            self._rng.seed(seed)

    def _chance(self, probability: float) -> bool:
        """True with `probability` (the seeded RNG; drawn only when below 1). Under the lock."""
        return probability >= 1.0 or self._rng.random() < probability

    def _take_fault(self, admits: Callable[[F], bool]) -> F | None:
        """The first fault (in the order added) that `admits` this request, one of its `count`
        used up (gone at zero). `admits` runs under the lock, in that order."""
        with self._lock:
            for fault in self._faults:
                if not admits(fault):
                    continue
                fault.hits += 1
                if fault.count is not None:
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    async def _injected(self, record: RecordedRequest, fault: F | None) -> Response | None:
        """What `fault` makes of the request after its delay: an answer, or None (no fault, a
        pure delay, a drop) to handle it normally (`_answer` cuts the answer of a drop)."""
        if fault is None:
            return None
        record.fault = fault
        if not await self._delay(record, fault.delay):
            return self._stale(record)
        return self._fault_answer(record, fault)

    def _fault_answer(self, record: RecordedRequest, fault: F) -> Response | None:
        """The error `fault` answers (recorded with `_finish`), or None for a pure delay or a
        drop."""
        raise NotImplementedError

    def _raw_answer(self, record: RecordedRequest, fault: F) -> Response:
        """A fault's non-JSON body (a proxy's error page), status 502 unless it says."""
        assert fault.raw_body is not None
        status = fault.status or 502
        self._finish(record, status, fault.raw_body)
        return Response(fault.raw_body, status_code=status, media_type=fault.content_type)

    # ------------------------------------------------------------------ HTTP control

    def control(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """What `POST /_control` does; returns the new state. Every stand-in takes
        `{"op": "latency", "seconds": 0.5}`, `{"op": "config", ...}` (any `configure`
        keyword), `{"op": "reset"}` (faults, latency), `{"op": "clear"}` (records) and
        `{"op": "reset_all"}` (`reset()`: the configuration too); its own ops ("fail",
        "hang", ...) are listed in its `_control_ops`."""
        op = payload.get("op")
        handler = self._control_ops().get(op) if isinstance(op, str) else None
        if handler is None:
            raise ValueError(f"unknown op {op!r}")
        handler(payload)
        return self.state()

    def _control_ops(self) -> dict[str, ControlOp]:
        return {
            "latency": lambda p: self.set_latency(float(p.get("seconds", 0.0))),
            "config": lambda p: self.configure(**{k: v for k, v in p.items() if k != "op"}),
            "reset": lambda p: self.reset_faults(),
            "clear": lambda p: self.clear(),
            "reset_all": lambda p: self.reset(),
        }

    def state(self) -> dict[str, Any]:
        """What `GET /_control` shows: the configuration, faults, counts."""
        raise NotImplementedError

    def _fault_state(self) -> dict[str, Any]:
        """The part of `state()` every stand-in has. Under the lock."""
        return {
            "latency": self.latency,
            "faults": [f.to_json() for f in self._faults],
            "requests": len(self._records),
        }

    def _listing(self) -> dict[str, Any]:
        """What `GET /_requests` answers."""
        with self._lock:
            return {"requests": [r.to_json() for r in self._records]}

    async def _control_endpoint(self, request: Request) -> Response:
        if request.method == "GET":
            return json_response(self.state())
        try:
            payload = orjson.loads(await request.body())
            if not isinstance(payload, dict):
                raise ValueError("expected a JSON object")
            return json_response({"ok": True, "state": self.control(payload)})
        except (ValueError, TypeError, KeyError) as exc:
            return json_response({"ok": False, "error": str(exc)}, 400)

    async def _requests_endpoint(self, request: Request) -> Response:
        return json_response(self._listing())

    async def _health(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    # ------------------------------------------------------------------ waiting

    def wait_for(
        self, predicate: Callable[[], T], timeout: float = 5.0, interval: float = 0.01
    ) -> T:
        """Poll `predicate` until it returns something truthy; return it. TimeoutError otherwise.

        Blocks the calling thread: from async code use `await_for` (the stand-in keeps running
        either way, but an app under test living in the test's event loop would not).
        """
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            self._check_deadline(deadline, timeout)
            time.sleep(interval)
        return value

    async def await_for(
        self,
        predicate: Callable[[], T],
        timeout: float = 5.0,  # noqa: ASYNC109
        interval: float = 0.01,
    ) -> T:
        """`wait_for` for async tests: polls with `asyncio.sleep`."""
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            self._check_deadline(deadline, timeout)
            await asyncio.sleep(interval)
        return value

    def _check_deadline(self, deadline: float, timeout: float) -> None:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{self.name}: condition not met within {timeout} s")
