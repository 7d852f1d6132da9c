"""A minimal stand-in for the receiver app, used to build and debug the benchmark harness.

Not the product: it only does what the benchmark exercises (verify the signature, fan out the
text messages, one ingest script call per tenant through the shared group committer, 200 after
Redis confirmed, 503 if Redis failed). Run the benchmark against it with
`scripts/bench_receiver --app scripts.bench.stub_receiver:app`; it also gives a lean reference
point.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from hashlib import sha256
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shared.events import dedupe_id, encode, message_event
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.redis_client import make_redis
from shared.storage.scripts import Command, Scripts

settings = Settings.from_env()
keys = Keys(settings.key_prefix)
scripts = Scripts()
state: dict[str, Any] = {}


def signed(header: str, body: bytes) -> bool:
    if not header.startswith("sha256="):
        return False
    got = header[7:]
    for secret in settings.whatsapp_app_secrets:
        want = hmac.new(secret.encode(), body, sha256).hexdigest()
        if hmac.compare_digest(want, got):
            return True
    return False


def events_of(payload: Any, received_ms: int) -> dict[str, list[dict[str, Any]]]:
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for entry in payload.get("entry") or []:
        for change in entry.get("changes") or []:
            value = change.get("value") or {}
            tenant = value["metadata"]["phone_number_id"]
            names = {
                c.get("wa_id"): c.get("profile", {}).get("name", "")
                for c in value.get("contacts") or []
            }
            for msg in value.get("messages") or []:
                by_tenant.setdefault(tenant, []).append(
                    message_event(
                        channel="whatsapp",
                        person=msg["from"],
                        message_id=msg["id"],
                        type=msg["type"],
                        text=(msg.get("text") or {}).get("body", ""),
                        ts=int(msg["timestamp"]),
                        received_ms=received_ms,
                        raw=msg,
                        name=names.get(msg["from"], ""),
                    )
                )
    return by_tenant


async def webhook(request: Request) -> Response:
    body = await request.body()
    if not signed(request.headers.get("x-hub-signature-256", ""), body):
        return Response(status_code=401)
    try:
        by_tenant = events_of(orjson.loads(body), int(time.time() * 1000))
    except (ValueError, KeyError, TypeError, AttributeError):
        return Response(status_code=200)  # the real receiver dead-letters it; not benchmarked
    committer: GroupCommitter = state["committer"]
    calls: list[Command] = []
    for tenant, events in by_tenant.items():
        tk = keys.tenant(tenant)
        command = scripts.ingest.command(
            tk,
            seen=[tk.seen(dedupe_id(e)) for e in events],
            dedupe_ttl_s=settings.dedupe_ttl_s,
            events=[encode(e) for e in events],
        )
        calls.append(command)
    try:
        await committer.run(calls)
    except Exception:
        return Response(status_code=503)
    return Response(status_code=200)


async def ready(request: Request) -> Response:
    try:
        await asyncio.wait_for(state["redis"].ping(), 1)
    except Exception:
        return Response(status_code=503)
    return Response(b"ok", media_type="text/plain")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    redis = make_redis(settings)
    await scripts.load(redis)
    state["redis"] = redis
    state["committer"] = GroupCommitter(redis, scripts)
    yield
    await redis.aclose()


app = Starlette(
    routes=[
        Route("/webhooks/whatsapp", webhook, methods=["POST"]),
        Route("/readyz", ready),
    ],
    lifespan=lifespan,
)
