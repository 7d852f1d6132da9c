"""Plain helpers every test directory uses: fixture files, webhook signatures, the credentials the
stand-ins accept, the Redis a test's processes are pointed at, and tenants on every cluster node."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.crc import key_slot

from scripts.dev.redis_server import RedisCluster
from scripts.webhooks import sign_body

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
APP_SECRET = "test-app-secret"
VERIFY_TOKEN = "test-verify-token"

# What the stand-ins started by tests.support.fixtures accept: a global Graph API token and a
# tenant's own (TENANTS_FILE), and an Anthropic API key.
TOKEN = "global-token"
TENANT_TOKEN = "tenant-token"
API_KEY = "test-key"


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
