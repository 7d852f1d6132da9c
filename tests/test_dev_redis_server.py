"""The test fixtures' Redis (scripts/dev/redis_server.py): a port it picked that another
process takes before the server binds it is picked again, on the first start only."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from scripts.dev.redis_server import PortTaken, RedisServer


@contextmanager
def taken_port() -> Iterator[int]:
    """A port another process holds (here: a listening socket of this one)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_picked_port_taken_before_the_start_is_picked_again() -> None:
    with taken_port() as port:
        server = RedisServer()
        server.port = port  # as if another process took the port free_port picked
        server.start()
        try:
            assert server.port != port
            assert redis.Redis(port=server.port).ping()
        finally:
            server.stop()


def test_a_picked_cluster_bus_port_taken_before_the_start_is_picked_again() -> None:
    with taken_port() as bus:
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        server = RedisServer(extra_args=[*args, "--cluster-port", str(bus)])
        server.start()
        try:
            assert server.extra_args[-1] != str(bus)
            assert redis.Redis(port=server.port).ping()
        finally:
            server.stop()


def test_a_port_given_or_a_restart_keeps_its_port_and_says_it_is_taken() -> None:
    with taken_port() as port:
        with pytest.raises(PortTaken, match="Address already in use"):
            RedisServer(port=port).start()
    server = RedisServer().start()
    server.stop()
    with taken_port() as other:
        server.port = other  # as if another process took its port while it was stopped
        with pytest.raises(PortTaken):
            server.start()
        assert server.port == other, "a restart keeps the port its clients hold"
