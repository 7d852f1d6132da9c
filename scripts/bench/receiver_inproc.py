"""CPU per request of the receiver's own code, without wrk or the network in between.

    .venv/bin/python -m scripts.bench.receiver_inproc [--connections 32] [--requests 40000]
        [--via protocol|asgi]

`--connections` clients each send their next signed, unique body (scripts/bench/payloads.py) as
soon as the last one was answered, against a private Redis (appendonly off) on a free port.
`--via protocol` (the default, what the Procfile runs): each client is a connection of the
receiver's HTTP protocol (receiver/http_protocol.py) fed the request's bytes, as uvicorn feeds
it from a socket, and answered through a transport that only notes the answer; `--via asgi`:
each client calls the ASGI app directly (the path every request but the webhook POST takes).
Reports the process's CPU time per request for each repetition. The figure includes the Redis
client's work and the syscalls to Redis but not the socket I/O to the client, so it moves with
receiver changes and hardly with other load on the machine (unlike wall-clock throughput);
compare runs with the same arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import uvloop

from scripts.bench import payloads
from scripts.dev.redis_server import RedisServer

SECRET = "inproc-secret"
PATH = "/webhooks/whatsapp"


def signed_bodies(count: int) -> list[tuple[bytes, bytes]]:
    now = int(time.time())
    out = []
    for record in range(count):
        body = payloads.body_for(record, "inproc", 1, now)
        out.append((body, f"sha256={payloads.sign(SECRET.encode(), body)}".encode()))
    return out


class NotingTransport(asyncio.Transport):
    """A client's socket as the protocol sees it: what is written is handed to `written`."""

    def __init__(self, written: Callable[[bytes], None]) -> None:
        super().__init__()
        self.written = written
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )


async def drive_protocol(
    app: Any, bodies: list[tuple[bytes, bytes]], args: argparse.Namespace
) -> None:
    """`--via protocol`: the requests' bytes through `ReceiverProtocol`, one per connection."""
    import uvicorn
    from uvicorn.server import ServerState

    from receiver.http_protocol import ReceiverProtocol

    config = uvicorn.Config(app, http=ReceiverProtocol, log_config=None, limit_concurrency=1000)
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", b"Sat, 05 Dec 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
    loop = asyncio.get_running_loop()
    statuses: dict[int, int] = {}
    next_body = 0

    async def connection(until: int) -> None:
        nonlocal next_body
        answered: asyncio.Future[bytes] = loop.create_future()

        def written(data: bytes) -> None:
            if not answered.done():
                answered.set_result(data)

        protocol = ReceiverProtocol(config=config, server_state=state, app_state={}, _loop=loop)
        protocol.connection_made(NotingTransport(written))
        while next_body < until:
            body, signature = bodies[next_body]
            next_body += 1
            head = REQUEST_HEAD % (len(body), signature)
            protocol.data_received(head + body)
            answer = await answered
            answered = loop.create_future()
            status = int(answer[9:12])
            statuses[status] = statuses.get(status, 0) + 1
        protocol.connection_lost(None)

    await repeat(connection, args)
    print(f"answers by status: {dict(sorted(statuses.items()))}")


# What wrk sends (scripts/bench/post.lua), with the body's length and signature.
REQUEST_HEAD = (
    b"POST /webhooks/whatsapp HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Type: application/json\r\nUser-Agent: facebookexternalua\r\n"
    b"Content-Length: %d\r\nX-Hub-Signature-256: %s\r\n\r\n"
)


async def repeat(connection: Callable[[int], Awaitable[None]], args: argparse.Namespace) -> None:
    for rep in range(args.reps):
        cpu, wall = time.process_time(), time.perf_counter()
        until = (rep + 1) * args.requests
        await asyncio.gather(*(connection(until) for _ in range(args.connections)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(
            f"rep {rep + 1}: CPU {cpu / args.requests * 1e6:.1f} us/request, "
            f"{args.requests / wall:,.0f} requests/s wall",
            flush=True,
        )


async def drive(app: Any, bodies: list[tuple[bytes, bytes]], args: argparse.Namespace) -> None:
    """`--via asgi`: each request a call of the ASGI app."""
    statuses: dict[int, int] = {}
    next_body = 0

    async def connection(until: int) -> None:
        nonlocal next_body
        while next_body < until:
            body, signature = bodies[next_body]
            next_body += 1
            scope = {
                "type": "http",
                "method": "POST",
                "path": PATH,
                "query_string": b"",
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-hub-signature-256", signature),
                ],
            }
            message = {"type": "http.request", "body": body, "more_body": False}

            async def receive(message: dict[str, Any] = message) -> dict[str, Any]:
                return message

            async def send(event: dict[str, Any]) -> None:
                if event["type"] == "http.response.start":
                    statuses[event["status"]] = statuses.get(event["status"], 0) + 1

            await app(scope, receive, send)

    await repeat(connection, args)
    print(f"answers by status: {dict(sorted(statuses.items()))}")


async def run(args: argparse.Namespace, redis_url: str) -> None:
    os.environ.update(WHATSAPP_APP_SECRET=SECRET, REDIS_URL=redis_url, KEY_PREFIX="inproc")
    from receiver.app import create_app
    from receiver.store import WriterTuning

    tuning = WriterTuning()
    if args.rounds_in_flight:
        tuning = replace(tuning, rounds_in_flight=args.rounds_in_flight)
    # --pool fixes how many bodies are made, so two runs that differ only in --requests differ
    # only in serving work (the instruction-count method in docs/benchmarks/receiver.md).
    bodies = signed_bodies(max(args.pool, args.requests * args.reps))
    app = create_app(tuning=tuning)
    async with app.router.lifespan_context(app):
        await (drive_protocol if args.via == "protocol" else drive)(app, bodies, args)
        stats = await app.state.receiver.redis.info("commandstats")
        rounds = stats.get("cmdstat_zadd", {}).get("calls", 0)  # one wake-up ZADD per round
        served = args.requests * args.reps
        print(f"group-commit rounds: {rounds:,}, {served / max(rounds, 1):.1f} requests each")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--requests", type=int, default=40000, help="per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pool", type=int, default=0, help="bodies to generate (at least all)")
    parser.add_argument("--rounds-in-flight", type=int, default=0, help="0: as committed")
    parser.add_argument("--via", choices=("protocol", "asgi"), default="protocol")
    args = parser.parse_args()
    server = RedisServer(appendonly=False).start()
    try:
        uvloop.run(run(args, server.url))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
