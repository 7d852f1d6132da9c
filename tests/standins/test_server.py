"""BackgroundServer: a Starlette app on uvicorn in a thread, from sync and async tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from scripts.standins import BackgroundServer


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


APP = Starlette(routes=[Route("/", hello)])


def test_sync_context_manager() -> None:
    with BackgroundServer(APP) as server:
        assert server.running
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert httpx.get(server.url + "/").text == "hello"
        url = server.url
    assert not server.running
    with pytest.raises(RuntimeError):
        _ = server.url
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/")


async def test_async_context_manager_and_restart() -> None:
    server = BackgroundServer(APP)
    async with server:
        async with httpx.AsyncClient() as client:
            assert (await client.get(server.url + "/")).text == "hello"
    server.start()
    try:
        async with httpx.AsyncClient() as client:
            assert (await client.get(server.url + "/")).text == "hello"
        assert server.start() is server  # already running: no-op
    finally:
        server.stop()
    server.stop()  # idempotent


def test_two_servers_get_two_ports() -> None:
    with BackgroundServer(APP) as a, BackgroundServer(APP) as b:
        assert a.port != b.port


def test_startup_failure_is_reported() -> None:
    @asynccontextmanager
    async def broken(app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("no")
        yield  # pragma: no cover

    server = BackgroundServer(Starlette(lifespan=broken))
    with pytest.raises(RuntimeError, match="failed to start"):
        server.start()
    assert not server.running
