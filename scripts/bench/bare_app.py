"""The baseline of the receiver benchmark: a Starlette app that reads the body and answers 200.

Same framework, same server flags, same route and requests as the receiver, and nothing else:
the ratio receiver/bare says what verification, parsing and the Redis round trip cost.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def webhook(request: Request) -> Response:
    await request.body()
    return Response(status_code=200)


async def ready(request: Request) -> Response:
    return Response(b"ok", media_type="text/plain")


app = Starlette(
    routes=[
        Route("/webhooks/whatsapp", webhook, methods=["POST"]),
        Route("/readyz", ready),
    ]
)
