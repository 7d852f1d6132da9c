"""The receiver's HTTP protocol: uvicorn's httptools protocol with the header deadline
(receiver/header_deadline.py), serving a webhook POST from the parser's callbacks.

The Procfile's `web` line names it (`--http receiver.http_protocol:ReceiverProtocol`).

Under uvicorn every request is a task running the ASGI app: a scope, a cycle with its event,
`receive` and `send` messages, and each response header checked against two regular
expressions. For the webhook POST, the one route that carries the load, that machinery cost
more than the webhook's own work (docs/benchmarks/receiver.md, 2026-12-05). Here a webhook POST
is a `WebhookCall` (receiver/webhook_call.py) fed by the parser and answered with bytes built
once per second; every other request, and every webhook POST this path does not take, goes to
the ASGI app as before: a request uvicorn must queue behind another on the same connection
(pipelining), HTTP/1.0, `Expect: 100-continue`, an upgrade, a concurrency limit reached, the
access log on (uvicorn writes its lines), a
refusal that needs no body (413 by Content-Length, 400, 403 with no secret), a server not
started yet or stopping. `Receiver.webhook` serves those with the same steps and answers.

The body has a deadline here as on the ASGI path (`BODY_READ_TIMEOUT_S`, 408 and the
connection closed), watched the way the headers' is.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from receiver.header_deadline import DeadlineWatch, HeaderDeadlineProtocol
from receiver.providers.base import InboundProvider
from receiver.webhook_call import WebhookCall
from receiver.webhook_request import BODY_UNREAD, TEXT, request_headers

if TYPE_CHECKING:
    from receiver.app import Receiver

CLOSE = b"connection: close\r\n"
# uvicorn's `--http` for this protocol, as the Procfile names it (benchmarks and tests too).
UVICORN_HTTP = "receiver.http_protocol:ReceiverProtocol"


class Answers:
    """Whole answers as bytes: a 200's built once per set of count headers, again whenever
    uvicorn renews its default headers (`date`, each second)."""

    def __init__(self) -> None:
        self._defaults: Any = None  # the list uvicorn's server state held when built
        self._default_bytes = b""
        # id(count headers) -> (those headers, keep-alive answer, closing answer); the list is
        # kept so that its id cannot be reused while it is a key
        self._ok: dict[int, tuple[Any, bytes, bytes]] = {}

    def ok(self, defaults: list[tuple[bytes, bytes]], counts: Any, keep_alive: bool) -> bytes:
        if defaults is not self._defaults:
            self._renew(defaults)
        built = self._ok.get(id(counts))
        if built is None or built[0] is not counts:
            head = STATUS_LINE[200] + self._default_bytes + _lines(counts)
            built = self._ok[id(counts)] = (counts, head + b"\r\n", head + CLOSE + b"\r\n")
        return built[1] if keep_alive else built[2]

    def text(
        self, defaults: list[tuple[bytes, bytes]], status: int, text: bytes, keep_alive: bool
    ) -> bytes:
        if defaults is not self._defaults:
            self._renew(defaults)
        length = str(len(text)).encode()
        head = STATUS_LINE[status] + self._default_bytes
        head += b"content-type: " + TEXT + b"\r\ncontent-length: " + length + b"\r\n"
        return head + (b"" if keep_alive else CLOSE) + b"\r\n" + text

    def _renew(self, defaults: list[tuple[bytes, bytes]]) -> None:
        self._defaults = defaults
        self._default_bytes = _lines(defaults)
        self._ok.clear()


def _lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(name + b": " + value + b"\r\n" for name, value in headers)


class DirectWebhooks:
    """One server's share of the direct path: the receiver, its webhook paths, the body
    deadline's watch and the answers' bytes."""

    def __init__(
        self, receiver: Receiver | None, root_path: str, keep_alive_s: float, loop: Any
    ) -> None:
        self.receiver = receiver
        # Only the exact path: an escaped or absolute-form target goes the ASGI way, which
        # decodes it. With a root path uvicorn prefixes every path: that way too.
        webhooks = receiver.webhooks if receiver is not None and not root_path else {}
        self.paths: dict[bytes, InboundProvider] = {p.encode(): i for p, i in webhooks.items()}
        timeout_s = receiver.settings.body_read_timeout_s if receiver is not None else 1.0
        self.body_watch = DeadlineWatch(loop, timeout_s, ReceiverProtocol.body_late)
        # `--timeout-keep-alive` after a direct answer, watched rather than a timer per answer
        # as uvicorn arms (that timer cost ~8 % of the direct path's samples)
        self.idle_watch = DeadlineWatch(loop, keep_alive_s, ReceiverProtocol.idle_late)
        self.answers = Answers()

    @classmethod
    def of(cls, protocol: ReceiverProtocol) -> DirectWebhooks:
        """The receiver behind uvicorn's middleware (`app.app`...), or none: another app."""
        from receiver.app import ReceiverApp  # the app imports this module's neighbours

        app, args = protocol.app, (protocol.root_path, protocol.timeout_keep_alive, protocol.loop)
        for _ in range(8):
            if isinstance(app, ReceiverApp):
                return cls(app.receiver, *args)
            app = getattr(app, "app", None)
        return cls(None, *args)


class ReceiverProtocol(HeaderDeadlineProtocol):
    """`HeaderDeadlineProtocol`, serving webhook POSTs without the ASGI request cycle."""

    _direct: DirectWebhooks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        state = self.server_state
        direct = getattr(state, "direct_webhooks", None)
        if direct is None:
            direct = DirectWebhooks.of(self)
            state.direct_webhooks = direct  # type: ignore[attr-defined]
        self._direct = direct

    def connection_lost(self, exc: Exception | None) -> None:
        self._direct.body_watch.end(self)
        self._direct.idle_watch.end(self)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        # A request begins: the connection is not idle. A webhook answered from a parser
        # callback earlier in this same read (a 401, a ping's 200) left the keep-alive deadline
        # running, which would close the connection under this request.
        self._direct.idle_watch.end(self)
        if self.timeout_keep_alive_task is not None:
            self._unset_keepalive_if_required()
        # uvicorn's, without the scope: only a request going the ASGI way needs one
        # (`_make_scope`); a dict of nine entries and a copy of the app state per request
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        if self._watch is not None:
            self._watch.begin(self)

    def _make_scope(self) -> None:
        """uvicorn's scope for this request, by uvicorn's own code: it starts a request afresh,
        so what the parser gave so far is put back."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        HttpToolsProtocol.on_message_begin(self)
        self.url, self.expect_100_continue = url, expect
        self.headers.extend(headers)  # the list the new scope holds

    def on_headers_complete(self) -> None:
        call = self._webhook_call()
        if call is None:
            self._make_scope()
            super().on_headers_complete()
            return
        if self._watch is not None:
            self._watch.end(self)
        self.cycle = call  # type: ignore[assignment]
        self._direct.body_watch.begin(self)

    def _webhook_call(self) -> WebhookCall | None:
        """A call for this request if the direct path takes it (see the module docstring)."""
        receiver = self._direct.receiver
        if receiver is None or receiver.writer is None:
            return None
        if self.access_log and self.config.access_log:
            # uvicorn writes the access log's lines on its own path. (Its `access_log` is
            # whether the logger has handlers, which a test runner's capture can add to a
            # logger `--no-access-log` switched off: the flag must be on too.)
            return None
        parser = self.parser
        if parser.get_method() != b"POST" or self.expect_100_continue:
            return None
        if parser.get_http_version() != "1.1" or parser.should_upgrade():
            return None
        cycle: Any = self.cycle
        if cycle is not None and not cycle.response_complete:
            return None  # pipelined behind a request not answered yet: uvicorn queues it
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return None  # uvicorn's 503
        path, _, query = self.url.partition(b"?")
        inbound = self._direct.paths.get(path)
        if inbound is None:
            return None
        headers = request_headers(self.headers, inbound, receiver.settings.max_body_bytes)
        if type(headers) is tuple:
            return None  # refused before the body: the ASGI path answers it
        keep_alive = parser.should_keep_alive()
        return WebhookCall(self, receiver, inbound, headers, query, keep_alive, time.perf_counter())

    def on_body(self, body: bytes) -> None:
        cycle: Any = self.cycle
        if type(cycle) is WebhookCall:
            if not cycle.response_complete:
                cycle.add_body(body)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle: Any = self.cycle
        if type(cycle) is WebhookCall:
            self._direct.body_watch.end(self)
            if not cycle.response_complete:
                cycle.complete()
            return
        super().on_message_complete()

    def body_late(self) -> None:
        """The body did not come in time: 408; or, if it was answered already (413, its rest
        still coming), the connection closes."""
        cycle: Any = self.cycle
        if type(cycle) is WebhookCall:
            if cycle.response_complete:
                self.transport.close()
            else:
                cycle.body_late()

    def answer_webhook(self, call: WebhookCall, status: int, answer: Any) -> None:
        """Write `call`'s answer (`WebhookCall.answer`): the counts' headers for a 200, else
        the text; then what uvicorn does after a response."""
        transport = self.transport
        if call.disconnected or transport.is_closing():
            call.response_complete = True
            return
        keep_alive = call.keep_alive and status not in BODY_UNREAD
        defaults = self.server_state.default_headers
        answers = self._direct.answers
        if status == 200:
            transport.write(answers.ok(defaults, answer, keep_alive))
        else:
            transport.write(answers.text(defaults, status, answer, keep_alive))
        call.response_complete = True
        if not keep_alive:
            transport.close()
        self._answered()

    def _answered(self) -> None:
        """uvicorn's `on_response_complete`, with the keep-alive deadline in `idle_watch`."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:  # a request queued behind the answered one: its turn
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._direct.idle_watch.begin(self)

    def idle_late(self) -> None:
        """No next request within `--timeout-keep-alive` of a direct answer: close."""
        if not self.transport.is_closing():
            self.transport.close()
