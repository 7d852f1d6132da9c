"""One webhook POST served straight from the HTTP protocol's parser callbacks
(receiver/http_protocol.py), without an ASGI request task.

The call gathers the body as the parser hands it over, checks the signature and parses once the
body is complete, and joins the writer's round as its own waiter (`InboxWriter.enter`): when Redis
has answered the round, `set_result` writes the 200 to the client in the same step. Refusals
(401/403/413/408) are answered from the parser's callback; a round Redis did not take goes to
the receiver's hold (`Receiver.hold`) as a task, as the ASGI path's would. What it answers, and
when, is what `Receiver.webhook` answers: the same steps (receiver/webhook_request.py), the
same hold, the same counts; only the ASGI machinery in between is gone.

To uvicorn's protocol the call stands where a `RequestResponseCycle` would (`protocol.cycle`):
it has the attributes the protocol reads and writes on a cycle (`response_complete`,
`disconnected`, `keep_alive`, `message_event`), so keep-alive, pipelining behind it, a lost
connection and a graceful shutdown work as they do for uvicorn's own cycles. To the writer it
is a waiter with `asyncio.Future`'s four methods.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from receiver.providers.base import InboundProvider, WebhookRequest
from receiver.store import InboxWriter
from receiver.webhook_request import admit

if TYPE_CHECKING:
    from receiver.app import Receiver

logger = logging.getLogger(__name__)

UNAVAILABLE = (503, b"unavailable, retry later")


class Answering(Protocol):
    """The connection a call answers on (receiver/http_protocol.py)."""

    tasks: set[asyncio.Task[None]]
    loop: asyncio.AbstractEventLoop

    def answer_webhook(self, call: WebhookCall, status: int, answer: Any) -> None: ...


class _NoEvent:
    """uvicorn's protocol sets its cycle's `message_event` when the connection is lost, to wake
    a task reading the body; a call has no task to wake."""

    @staticmethod
    def set() -> None:
        pass


class WebhookCall:
    """A webhook POST from its headers to its answer (see the module docstring)."""

    __slots__ = (
        "_body",
        "_chunks",
        "_headers",
        "_inbound",
        "_limit",
        "_parsed",
        "_protocol",
        "_query",
        "_received_ns",
        "_receiver",
        "_settled",
        "_size",
        "_started",
        "_writer",
        "disconnected",
        "keep_alive",
        "response_complete",
    )

    message_event = _NoEvent()

    def __init__(
        self,
        protocol: Answering,
        receiver: Receiver,
        inbound: InboundProvider,
        headers: Mapping[bytes, str],
        query: bytes,
        keep_alive: bool,
        started: float,
    ) -> None:
        self._protocol = protocol
        self._receiver = receiver
        self._inbound = inbound
        self._headers = headers
        self._query = query
        self._chunks: list[bytes] = []
        self._size = 0  # bytes of body seen, kept or not
        self._limit = receiver.settings.max_body_bytes
        self._started = started  # time.perf_counter() at the headers: the answer's latency
        self._received_ns = 0
        self._parsed: Any = None
        self._body = b""
        self._writer: InboxWriter | None = None
        self._settled = False  # answered, or its answer decided (`answer` runs once)
        self.keep_alive = keep_alive  # a graceful shutdown sets it False
        self.response_complete = False
        self.disconnected = False  # the client went away: the answer is not written

    @property
    def inbound(self) -> InboundProvider:
        return self._inbound

    # --- what the protocol feeds it -------------------------------------------------------

    def add_body(self, chunk: bytes) -> None:
        """A piece of the body; past `MAX_BODY_BYTES`, 413."""
        size = self._size = self._size + len(chunk)
        if size <= self._limit:
            self._chunks.append(chunk)
        else:  # answered now, as the ASGI path does; the rest is read and dropped
            self._chunks = []
            self.answer(413, b"body too large")

    def complete(self) -> None:
        """The whole body is in: refuse it, or join the writer's round (answered from there)."""
        try:
            self._complete()
        except Exception:
            logger.exception("unexpected error in POST %s", self._inbound.path)
            self.answer(*UNAVAILABLE)

    def _complete(self) -> None:
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        now_ns = time.time_ns()
        admitted = admit(WebhookRequest(self._headers, self._query, body), self._inbound, now_ns)
        if type(admitted) is tuple:  # refused: (status, text)
            self.answer(*admitted)
            return
        writer = self._receiver.writer
        if writer is None:  # the lifespan ended while the body came in
            self.answer(*UNAVAILABLE)
            return
        self._parsed, self._body, self._received_ns, self._writer = admitted, body, now_ns, writer
        deadletter = body if admitted.problems else None
        if not admitted.items and deadletter is None:
            self.set_result([])  # nothing to store: statuses of nobody, a test ping
        else:
            writer.enter(admitted.items, deadletter, self)

    def body_late(self) -> None:
        """The body did not come within `BODY_READ_TIMEOUT_S`: 408, and the connection closes."""
        if not self._settled:
            timeout_s = self._receiver.settings.body_read_timeout_s
            logger.info("%s webhook body not in within %ss: 408", self._inbound.channel, timeout_s)
            self.answer(408, b"request body too slow")

    # --- what the writer's round tells it (asyncio.Future's names) ------------------------

    def done(self) -> bool:
        return self._settled

    def set_result(self, result: list[int]) -> None:
        """Redis confirmed every item: 200 with the counts."""
        try:
            status, answer = self._receiver.stored(self._parsed, self._body, result)
        except Exception:
            logger.exception("unexpected error in POST %s", self._inbound.path)
            status, answer = UNAVAILABLE
        self.answer(status, answer)

    def set_exception(self, exception: BaseException) -> None:
        """The round failed or timed out: hold the webhook and retry, as `Receiver.webhook`."""
        assert self._writer is not None
        error = self._writer.unavailable(exception)  # type: ignore[arg-type]
        error.__cause__ = exception
        protocol = self._protocol
        task = protocol.loop.create_task(self._hold(error))
        # In the server's tasks: a graceful shutdown waits for held webhooks to be answered.
        protocol.tasks.add(task)
        task.add_done_callback(protocol.tasks.discard)

    def exception(self) -> BaseException | None:
        return None

    async def _hold(self, error: Exception) -> None:
        try:
            args = (self._parsed, self._body, self._inbound, self._received_ns, error)
            status, answer = await self._receiver.hold(*args)
        except Exception:
            logger.exception("unexpected error in POST %s", self._inbound.path)
            status, answer = UNAVAILABLE
        self.answer(status, answer)

    # --- the answer ----------------------------------------------------------------------

    def answer(self, status: int, answer: Any) -> None:
        """Answer once: `answer` is the counts' headers for a 200, else the text."""
        if self._settled:
            return
        self._settled = True
        self._receiver.metrics.answered(status, time.perf_counter() - self._started)
        self._protocol.answer_webhook(self, status, answer)
