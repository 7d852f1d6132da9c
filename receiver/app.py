"""The webhook receiver: `uvicorn receiver.app:app`.

Verifies, fans out and stores; answers 200 only once Redis confirmed every item of the request.
Redis is connected in the lifespan, never at import. No input produces a 500: an unexpected
error is logged and answered 503, which the provider retries (dedupe makes that safe).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from receiver.signature import SignatureChecker, SignatureError, token_matches
from receiver.store import InboxWriter, StoreUnavailable
from receiver.whatsapp import Parsed, parse_body
from shared.keys import Keys
from shared.redis_client import make_redis
from shared.scripts import Scripts
from shared.settings import Settings

logger = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]

# Static answers are built once: the hot path allocates no response it can reuse.
UNAUTHORIZED = PlainTextResponse("missing signature", status_code=401)
FORBIDDEN = PlainTextResponse("forbidden", status_code=403)
TOO_LARGE = PlainTextResponse("body too large", status_code=413)
BAD_REQUEST = PlainTextResponse("bad request", status_code=400)
UNAVAILABLE = PlainTextResponse("unavailable, retry later", status_code=503)
OK = PlainTextResponse("ok")


class BodyTooLarge(Exception):
    pass


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


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing more than `limit` bytes whatever Content-Length claims."""
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    return None if raw is None else int(raw)  # ValueError: a malformed header


class Receiver:
    """Holds the settings and, while the lifespan runs, the Redis client and writer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.scripts = Scripts()
        self.signatures = SignatureChecker(settings.whatsapp_app_secrets)
        self.redis: Any = None
        self.writer: InboxWriter | None = None

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        settings = self.settings
        configure_logging()
        logger.info("receiver starting: %s", settings.masked())
        if not self.signatures.configured:
            logger.warning(
                "WHATSAPP_APP_SECRET is not set: every webhook POST will be refused with 403"
            )
        # One immediate retry on a broken connection (a restarted Redis); no retry on timeouts,
        # so a stalled Redis surfaces within redis_timeout_s as a 503.
        self.redis = make_redis(
            settings, retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        )
        await self._prepare_redis()
        self.writer = InboxWriter(
            self.redis, self.scripts, self.keys, settings.dedupe_ttl_s, settings.redis_timeout_s
        )
        try:
            yield
        finally:
            self.writer = None
            await self.redis.aclose()
            logger.info("receiver stopped")

    async def _prepare_redis(self) -> None:
        """Load the scripts and check persistence; a Redis that is down now is not fatal."""
        try:
            await asyncio.wait_for(self.scripts.load(self.redis), self.settings.redis_timeout_s)
        except Exception as exc:
            logger.warning("Redis not reachable at start-up (%r); /readyz reports it", exc)
            return
        try:
            config = await asyncio.wait_for(
                self.redis.config_get("appendonly"), self.settings.redis_timeout_s
            )
        except Exception:  # managed Redis often forbids CONFIG
            logger.debug("cannot read Redis appendonly setting")
            return
        if _appendonly_off(config):
            logger.warning("Redis persistence (appendonly) is off: acknowledged items can be lost")

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

    async def receive(self, request: Request) -> Response:
        """A webhook POST: 200 with the counts once Redis confirmed every item.

        413 too large, 401 unsigned, 403 wrongly signed (or no secret configured), 503 when
        Redis failed or did not confirm in time.
        """
        limit = self.settings.max_body_bytes
        try:
            length = declared_length(request)
        except ValueError:
            return BAD_REQUEST
        if length is not None and length > limit:
            return TOO_LARGE
        if not self.signatures.configured:
            return FORBIDDEN  # never accept unsigned traffic (warned at start-up)
        header = request.headers.get("x-hub-signature-256")
        if header is None:
            logger.info("webhook refused: no signature header")
            return UNAUTHORIZED
        try:
            body = await read_body(request, limit)
        except BodyTooLarge:
            return TOO_LARGE
        try:
            self.signatures.check(body, header)
        except SignatureError as exc:
            logger.info("webhook refused: %s", exc)
            return UNAUTHORIZED if exc.status_code == 401 else FORBIDDEN
        return await self._store(parse_body(body, time.time_ns() // 1_000_000), body)

    async def _store(self, parsed: Parsed, body: bytes) -> Response:
        """Store the understood items; dead-letter the whole body if anything was not understood.

        A partially valid body is both: its good items go to their inboxes (one bad item must
        not hold the others back) and the raw body goes to the dead-letter list, so whatever
        was skipped can still be inspected and re-driven (its good items then dedupe).
        """
        if parsed.ignored_fields:
            logger.debug("ignored webhook fields: %s", parsed.ignored_fields)
        deadletter = body if parsed.problems else None
        if not parsed.items and deadletter is None:
            return _counts(0, 0)
        if self.writer is None:
            raise RuntimeError("receiver used outside its lifespan")
        try:
            saved = await self.writer.save(parsed.items, deadletter)
        except StoreUnavailable as exc:
            logger.warning("webhook not stored, answering 503: %s", exc)
            return UNAVAILABLE
        if deadletter is not None:
            logger.warning(
                "signed webhook body (%d bytes) dead-lettered, %d items kept: %s",
                len(body),
                parsed.count,
                "; ".join(sorted(set(parsed.problems))),
            )
        return _counts(saved.stored, saved.duplicates, deadletter is not None)

    async def healthz(self, request: Request) -> Response:
        return OK

    async def readyz(self, request: Request) -> Response:
        if self.redis is None:
            return UNAVAILABLE
        try:
            await asyncio.wait_for(self.redis.ping(), self.settings.redis_timeout_s)
        except Exception as exc:
            logger.info("not ready: Redis does not answer (%r)", exc)
            return UNAVAILABLE
        return PlainTextResponse("ready")

    def routes(self) -> list[Route]:
        return [
            Route("/webhooks/whatsapp", never_500(self.verify), methods=["GET"]),
            Route("/webhooks/whatsapp", never_500(self.receive), methods=["POST"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", never_500(self.readyz), methods=["GET"]),
        ]


@functools.lru_cache(maxsize=1024)  # the same few answers over and over: built once each
def _counts(stored: int, duplicates: int, deadlettered: bool = False) -> Response:
    body: dict[str, Any] = {"stored": stored, "duplicates": duplicates}
    if deadlettered:
        body["deadlettered"] = True
    return Response(orjson.dumps(body), media_type="application/json")


def _appendonly_off(config: Any) -> bool:
    value = config.get("appendonly", config.get(b"appendonly")) if config else None
    return value in ("no", b"no")


def configure_logging() -> None:
    """Uvicorn configures only its own loggers: give ours a handler unless someone else did."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )


def create_app(settings: Settings | None = None) -> Starlette:
    """The ASGI app; settings from the environment unless given. Redis connects on start-up."""
    receiver = Receiver(settings or Settings.from_env())
    app = Starlette(routes=receiver.routes(), lifespan=receiver.lifespan)
    app.state.receiver = receiver
    return app


app = create_app()
