"""Plain helpers every test directory uses: fixture files, webhook signatures, the credentials the
stand-ins accept, the Redis a test's processes are pointed at, tenants on every cluster node,
processes (alive? stopped), and `standin_fixtures`, the one way a test directory declares a
stand-in server's fixtures."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.crc import key_slot

from scripts.dev.redis_server import RedisCluster
from scripts.webhooks import sign_body
from shared.fleet import stats_hash

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
APP_SECRET = "test-app-secret"
VERIFY_TOKEN = "test-verify-token"

# What the stand-ins started by tests.support.fixtures accept: a global Graph API token and a
# tenant's own (TENANTS_FILE), and an Anthropic API key.
TOKEN = "global-token"
TENANT_TOKEN = "tenant-token"
API_KEY = "test-key"


def counters(raw: dict[Any, Any]) -> dict[str, int]:
    """A stats hash's counters (HGETALL's answer) by name, as the product's readers take them
    (the layout field left out)."""
    return stats_hash.counters(raw.items())


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def fixture_json(name: str) -> Any:
    return json.loads(fixture_bytes(name))


def sign(body: bytes, secret: str = APP_SECRET) -> str:
    """The `X-Hub-Signature-256` Meta would send for `body`."""
    return sign_body(secret, body)


@dataclass(frozen=True)
class RedisTarget:
    """The Redis a test's processes are pointed at: `REDIS_URL` and `REDIS_CLUSTER`."""

    url: str
    cluster: bool = False

    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.url, "REDIS_CLUSTER": "true" if self.cluster else "false"}

    def client(self) -> Redis:
        """A client of the test's own (typed as Redis: the cluster client has the same calls)."""
        if self.cluster:
            return ClusterClient.from_url(self.url)  # type: ignore[return-value]
        return Redis.from_url(self.url)


def tenants_on_every_node(cluster: RedisCluster) -> list[str]:
    """One tenant id (a 15-digit phone_number_id) per node, by the slot of its hash tag."""
    found: dict[int, str] = {}
    candidate = 106540352242922
    while len(found) < len(cluster.nodes):
        tenant = str(candidate)
        found.setdefault(cluster.node_for_slot(key_slot(tenant.encode())), tenant)
        candidate += 1
    return [found[i] for i in sorted(found)]


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (exited, not yet reaped) or a dead process does not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def stop_process(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, then SIGKILL if `proc` has not exited within `grace_s`; reaped either way."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Resettable(Protocol):
    def reset(self) -> None: ...


S = TypeVar("S", bound=_Resettable)


def standin_fixtures(
    name: str, start: Callable[[], AbstractContextManager[S]]
) -> tuple[Callable[..., Iterator[S]], Callable[..., Iterator[S]]]:
    """The two fixtures of a stand-in server: `<name>_server`, started by `start()` once per
    test module and stopped after it, and `<name>`, the same server reset before and after each
    test, so that no test sees another's requests, faults or replies. Bind both at the top of a
    conftest or test module, under their own names, for pytest to find them:

        hook_server, hook = standin_fixtures("hook", lambda: ReviewHookStandIn(secret=SECRET))
    """
    server_name = f"{name}_server"

    @pytest.fixture(scope="module", name=server_name)
    def server() -> Iterator[S]:
        with start() as standin:
            yield standin

    @pytest.fixture(name=name)
    def fresh(request: pytest.FixtureRequest) -> Iterator[S]:
        standin: S = request.getfixturevalue(server_name)
        standin.reset()
        yield standin
        standin.reset()

    return server, fresh
