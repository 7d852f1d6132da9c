"""The webhook receiver: `uvicorn receiver.app:create_app --factory`.

Verifies, fans out and stores; answers 200 only once Redis confirmed every item of the request
(invariant 1, docs/invariants.md); a bad request changes nothing (invariant 8).
Redis is connected in the lifespan, never at import. No input produces a 500: an unexpected
error is logged and answered 503, which the provider retries (dedupe makes that safe).

While Redis does not take a webhook (a failover, a restart, a stall) the request is held and
its write retried for up to `WEBHOOK_HOLD_S` after it arrived, below the 5 s Chatwoot waits:
Chatwoot never retries account webhooks, so an answer that is not 200 loses the message. Only
then does it get the provider's `unavailable_status`, the one that provider retries (Chatwoot
agent bots: 500; Meta: 503). A retried write is safe: `ingest.lua` skips what it has already
stored (invariant 2). The hold is the failure path only: a write Redis answers never enters it.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Receive, Scope, Send

from receiver.body_deadline import BodyDeadlines, BodyTimeout
from receiver.catchup_request import CatchUpRequests
from receiver.metrics.endpoint import ReceiverMetrics, authorized
from receiver.providers.base import InboundProvider, WebhookRequest
from receiver.providers.chatwoot import ChatwootInbound
from receiver.providers.parsing import Parsed
from receiver.providers.registry import inbound_providers
from receiver.providers.signature import token_matches
from receiver.providers.whatsapp import WhatsAppInbound
from receiver.store import DeadLetterBounds, InboxWriter, StoreUnavailable, WriterTuning
from receiver.webhook_request import (
    BODY_UNREAD,
    EMPTY_BODY,
    TEXT,
    admit,
    counts,
    request_headers,
)
from shared.keys import Keys
from shared.logs import configure_logging, log_startup, served_by_uvicorn, warn_if_not_persistent
from shared.settings import Settings
from shared.storage.redis_client import explain, make_redis
from shared.storage.scripts import Scripts

logger = logging.getLogger(__name__)

WEBHOOK_PATH = WhatsAppInbound.path

Endpoint = Callable[[Request], Awaitable[Response]]

# Static answers are built once: the hot path allocates no response it can reuse.
FORBIDDEN = PlainTextResponse("forbidden", status_code=403)
UNAVAILABLE = PlainTextResponse("unavailable, retry later", status_code=503)
OK = PlainTextResponse("ok")
UNAUTHORIZED = PlainTextResponse(
    "unauthorized", status_code=401, headers={"www-authenticate": "Bearer"}
)

# Retrying a held webhook's write (`Receiver.hold`): the first pause, doubling up to the cap.
HOLD_FIRST_PAUSE_S = 0.05
HOLD_MAX_PAUSE_S = 0.5


def never_500(endpoint: Endpoint) -> Endpoint:
    """Turn any unexpected exception into a logged error and a retry-safe 503."""

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ClientDisconnect:
            logger.debug("client went away before the body was read")
            return UNAVAILABLE
        except Exception:
            logger.exception("unexpected error in %s %s", request.method, request.url.path)
            return UNAVAILABLE

    return guarded


class Receiver:
    """Holds the settings and, while the lifespan runs, the Redis client and writer."""

    def __init__(self, settings: Settings, tuning: WriterTuning | None = None) -> None:
        self.settings = settings
        self.tuning = tuning or WriterTuning()
        self.keys = Keys(settings.key_prefix)
        self.scripts = Scripts()
        # Webhook path -> provider; each path's POST is served as plain ASGI (ReceiverApp).
        self.webhooks = inbound_providers(settings)
        self.signatures = self._whatsapp().signatures
        self.redis: Any = None
        self.writer: InboxWriter | None = None
        self.metrics = ReceiverMetrics(settings)
        self.deadlines = BodyDeadlines(settings.body_read_timeout_s)
        self.catchup = CatchUpRequests(self.keys, self.scripts, settings.redis_timeout_s)
        # Run at shutdown before Redis is closed: what a mounted app opened (the ops page's
        # senders of replies by hand).
        self.on_close: list[Callable[[], Awaitable[None]]] = []

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        settings = self.settings
        configure_logging(settings.log_level, settings.log_format)
        log_startup(logger, "receiver", settings)
        if not self.signatures.configured:
            logger.warning(
                "WHATSAPP_APP_SECRET is not set: "
                "POST /webhooks/whatsapp refuses every request with 403"
            )
        if not self.webhooks[ChatwootInbound.path].configured:
            logger.info(
                "neither CHATWOOT_WEBHOOK_SECRET nor CHATWOOT_WEBHOOK_TOKEN is set: "
                "POST /webhooks/chatwoot refuses every request with 403"
            )
        # One immediate retry on a broken connection (a restarted Redis); no retry on timeouts.
        # No per-reply socket timeout (redis-py arms a timer per reply, measurable here): every
        # call is bounded instead, the writes by one deadline per round (InboxWriter), the
        # rest by wait_for, so a stalled Redis still surfaces within redis_timeout_s as a 503.
        self.redis = make_redis(
            settings,
            socket_timeout=None,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        await self._prepare_redis()
        self.catchup.redis = self.redis
        self.writer = InboxWriter(
            self.redis,
            self.scripts,
            self.keys,
            settings.dedupe_ttl_s,
            settings.redis_timeout_s,
            self.tuning,
            DeadLetterBounds.of(settings),
            self._dropped_deadletters,
        )
        self.deadlines.start()
        calm_garbage_collector()
        try:
            yield
        finally:
            self.writer = None
            await self.deadlines.stop()
            await self.catchup.stop()
            for close in self.on_close:
                await close()
            await self.redis.aclose()
            logger.info("receiver stopped")

    def _whatsapp(self) -> WhatsAppInbound:
        whatsapp = self.webhooks[WEBHOOK_PATH]
        assert isinstance(whatsapp, WhatsAppInbound)
        return whatsapp

    def _dropped_deadletters(self, count: int) -> None:
        logger.warning(
            "dead-letter list at its bounds (DEADLETTER_MAX %d, DEADLETTER_MAX_BYTES %d):"
            " dropped its %d oldest bodies",
            self.settings.deadletter_max,
            self.settings.deadletter_max_bytes,
            count,
        )
        self.metrics.dropped_deadletters(count)

    async def _prepare_redis(self) -> None:
        """Load the scripts and check persistence; a Redis that is down now is not fatal."""
        try:
            await asyncio.wait_for(self.scripts.load(self.redis), self.settings.redis_timeout_s)
        except Exception as exc:
            logger.warning("Redis not reachable at start-up (%s); /readyz reports it", explain(exc))
            return
        await warn_if_not_persistent(self.redis, self.settings.redis_timeout_s, logger)

    # --- routes ------------------------------------------------------------------------------

    async def verify(self, request: Request) -> Response:
        """Meta's subscription handshake: echo `hub.challenge` when the token matches."""
        params = request.query_params
        if params.get("hub.mode") == "subscribe" and token_matches(
            params.get("hub.verify_token"), self.settings.whatsapp_verify_token
        ):
            return PlainTextResponse(params.get("hub.challenge", ""))
        logger.info("webhook verification refused")
        return FORBIDDEN

    async def webhook(
        self, scope: Scope, receive: Receive, send: Send, inbound: InboundProvider | None = None
    ) -> None:
        """A webhook POST to `inbound`'s path (WhatsApp's when None), as a plain ASGI handler
        (see `ReceiverApp` for why).

        200 once Redis confirmed every item, with the counts in headers (`x-stored`,
        `x-duplicates`, `x-deadlettered`) and an empty body, which uvicorn writes in one
        `write()` (a body costs a second one); 413 too large, 400 malformed
        Content-Length, 408 body not in within `BODY_READ_TIMEOUT_S` (closes the connection:
        the rest of the body is not read), 401 unsigned, 403 wrongly signed (or no
        secret configured); when Redis failed or did not confirm within `WEBHOOK_HOLD_S`, the
        provider's `unavailable_status` (Chatwoot 500, WhatsApp 503); 503 on any unexpected
        error.

        Under the Procfile's protocol a webhook POST is served without this handler
        (receiver/http_protocol.py), with the same steps (receiver/webhook_request.py, `stored`,
        `hold`); this serves the requests that path leaves to the ASGI app, and every
        other server.
        """
        started = time.perf_counter()
        if inbound is None:
            inbound = self.webhooks[WEBHOOK_PATH]
        try:
            status, answer = await self._answer(scope, receive, inbound, started)
        except BodyTimeout:
            timeout_s = self.deadlines.timeout_s
            logger.info("%s webhook body not in within %ss: 408", inbound.channel, timeout_s)
            status, answer = 408, b"request body too slow"
        except ClientDisconnect:
            logger.debug("client went away before the body was read")
            return
        except Exception:
            logger.exception("unexpected error in POST %s", inbound.path)
            status, answer = 503, b"unavailable, retry later"
        if status == 200:
            await send({"type": "http.response.start", "status": 200, "headers": answer})
            await send(EMPTY_BODY)
        else:
            headers = [(b"content-type", TEXT), (b"content-length", str(len(answer)).encode())]
            if status in BODY_UNREAD:
                headers.append((b"connection", b"close"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": answer})
        self.metrics.answered(status, time.perf_counter() - started)

    async def _answer(
        self, scope: Scope, receive: Receive, inbound: InboundProvider, started: float
    ) -> tuple[int, Any]:
        """(status, the counts' headers for a 200 or else the text) for a webhook POST."""
        limit = self.settings.max_body_bytes
        headers = request_headers(scope["headers"], inbound, limit)
        if type(headers) is tuple:  # refused before the body: (status, text)
            return headers
        body = await self.deadlines.read(receive, limit, started)
        if body is None:
            return 413, b"body too large"
        now_ns = time.time_ns()
        request = WebhookRequest(headers, scope.get("query_string", b""), body)
        admitted = admit(request, inbound, now_ns)
        if type(admitted) is tuple:  # refused: (status, text)
            return admitted
        try:
            return await self._store(admitted, body)
        except StoreUnavailable as error:
            return await self.hold(admitted, body, inbound, now_ns, error)

    async def _store(self, parsed: Parsed, body: bytes) -> tuple[int, Any]:
        """Store the understood items; dead-letter the whole body if anything was not understood.

        A partially valid body is both: its good items go to their inboxes (one bad item must
        not hold the others back) and the raw body goes to the dead-letter list, so whatever
        was skipped can still be inspected and re-driven (its good items then dedupe).
        """
        deadletter = body if parsed.problems else None
        if not parsed.items and deadletter is None:
            return 200, counts(0, 0)
        if self.writer is None:
            raise RuntimeError("receiver used outside its lifespan")
        writer = self.writer
        try:
            results = await writer.join(parsed.items, deadletter)
        except Exception as exc:
            raise writer.unavailable(exc) from exc
        return self.stored(parsed, body, results)

    def stored(self, parsed: Parsed, body: bytes, results: list[int]) -> tuple[int, Any]:
        """(200, the counts' headers) for what Redis confirmed; logs and counts it."""
        stored = sum(results)
        duplicates = len(results) - stored
        deadlettered = bool(parsed.problems)
        if deadlettered:
            logger.warning(
                "signed webhook body (%d bytes) dead-lettered, %d items kept: %s",
                len(body),
                parsed.count,
                "; ".join(sorted(set(parsed.problems))),
            )
        self.metrics.saved(stored, duplicates, deadlettered)
        return 200, counts(stored, duplicates, deadlettered)

    async def hold(
        self,
        parsed: Parsed,
        body: bytes,
        inbound: InboundProvider,
        received_ns: int,
        error: Exception,
    ) -> tuple[int, Any]:
        """Redis did not take the webhook: retry until `WEBHOOK_HOLD_S` after it arrived, then
        answer the provider's `unavailable_status` (see the module docstring)."""
        deadline_s = received_ns / 1e9 + self.settings.webhook_hold_s
        attempts, pause_s = 1, HOLD_FIRST_PAUSE_S
        while (left_s := deadline_s - time.time()) > 0:
            await asyncio.sleep(min(pause_s, left_s))
            left_s = deadline_s - time.time()
            if left_s <= 0:
                break
            attempts, pause_s = attempts + 1, min(pause_s * 2, HOLD_MAX_PAUSE_S)
            try:
                # A write still out at the deadline is given up on here; if Redis takes it
                # later, the provider's retry is a duplicate.
                async with asyncio.timeout(left_s):
                    answer = await self._store(parsed, body)
            except (StoreUnavailable, TimeoutError) as exc:
                error = exc
                continue
            logger.info("webhook stored after %d attempts (Redis: %s)", attempts, error)
            return answer
        status = inbound.unavailable_status
        if inbound.channel == "chatwoot":  # never sent again: read back through Chatwoot's API
            self.catchup.remember(parsed.items, received_ns // 1_000_000)
        logger.warning(
            "webhook not stored after %d attempts in %.1fs, answering %d: %s",
            attempts,
            time.time() - received_ns / 1e9,
            status,
            explain(error),
        )
        return status, b"unavailable, retry later"

    async def healthz(self, request: Request) -> Response:
        return OK

    async def readyz(self, request: Request) -> Response:
        if self.redis is None:
            return UNAVAILABLE
        try:
            await asyncio.wait_for(self.redis.ping(), self.settings.redis_timeout_s)
        except Exception as exc:
            logger.info("not ready: Redis does not answer (%s)", explain(exc))
            return UNAVAILABLE
        return PlainTextResponse("ready")

    async def metrics_endpoint(self, request: Request) -> Response:
        """Prometheus text for the holder of `METRICS_TOKEN` (401 for anyone else): this
        receiver's figures, and the fleet's as read from Redis at most every
        `METRICS_FLEET_MAX_AGE_S` (receiver/metrics/endpoint.py)."""
        if not authorized(request.headers.get("authorization"), self.settings.metrics_token):
            return UNAUTHORIZED
        text = await self.metrics.exposition(self.redis)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    def routes(self) -> list[BaseRoute]:
        # Without METRICS_TOKEN there is no /metrics at all: 404, like any unknown path.
        metrics = [Route("/metrics", never_500(self.metrics_endpoint), methods=["GET"])]
        return [
            Route(WEBHOOK_PATH, never_500(self.verify), methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", never_500(self.readyz), methods=["GET"]),
            *(metrics if self.settings.metrics_token else []),
            *(self._ops() if self.settings.ops_enabled else []),
        ]

    def _ops(self) -> list[BaseRoute]:
        """The ops page (receiver/ops/), a sub-app under /ops: without OPS_TOKEN or OPS_USERS
        it is neither imported nor mounted (404); its guards never wrap the webhook routes."""
        from receiver.ops.routes import OpsPage

        return [Mount("/ops", app=OpsPage(self).app())]


def calm_garbage_collector() -> None:
    """Move start-up objects out of the collector's sight and collect young objects less often.

    With the default thresholds the receiver ran ~45 full collections of 15-40 ms each per 20 s
    at 7k requests/s, stalling every connection at once: that was its p99 latency. Frozen
    start-up objects are never scanned again; cycles are still collected, just in larger,
    rarer batches (the same tuning Instagram described for its Django servers).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


class ReceiverApp(Starlette):
    """Starlette for every route but the webhook POST, which is served as plain ASGI.

    The webhook's request task suspends while Redis works, and with Starlette's Request,
    router and exception middleware every resume unwinds through their frames, a large share
    of a request's cost (docs/benchmarks/receiver.md). The hot path skips them; the rest of
    the app stays ordinary Starlette.
    """

    def __init__(self, receiver: Receiver) -> None:
        super().__init__(routes=receiver.routes(), lifespan=receiver.lifespan)
        self.state.receiver = receiver
        self.receiver = receiver
        self._webhooks = receiver.webhooks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            inbound = self._webhooks.get(scope["path"])
            if inbound is not None:
                await self.receiver.webhook(scope, receive, send, inbound)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None, tuning: WriterTuning | None = None) -> ReceiverApp:
    """The ASGI app: `uvicorn receiver.app:create_app --factory` (the Procfile's `web`), or
    called with settings (tests, an embedding app); `tuning` is for benchmarks. Redis
    connects on start-up.

    Without settings it reads the environment, where a bad value ends the process with one
    line naming the variable and exit code 2 (uvicorn lets the SystemExit through). Under
    uvicorn's command line it also sets up logging, before uvicorn's first line ("Started
    server process"), so that line is ours (JSON) too; any other caller keeps its logging.
    """
    if settings is None:
        settings = Settings.from_env_or_exit()
        if served_by_uvicorn():
            configure_logging(settings.log_level, settings.log_format)
    return ReceiverApp(Receiver(settings, tuning))
