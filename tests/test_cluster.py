"""The product on a real local Redis Cluster (three masters, `REDIS_CLUSTER=true`).

Tenants are chosen so their hash slots fall on every node, and the key prefix so the wake-up
queues live on nodes other than the one `REDIS_URL` names: the workers' blocking pops reach
them only by the slot map. The end-to-end test runs the real receiver (`uvicorn`) and worker
processes; a SIGKILLed worker's batch comes back after its lease, found by the survivor's
safety sweep. The scenarios of the single-Redis suites marked `cluster` also run here
(tests/support/fixtures.py).
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from receiver.app import create_app
from scripts.dev.redis_server import CLUSTER_SLOTS, RedisCluster
from scripts.webhooks import text_message
from shared.conversation.burst_shards import burst_shard_of
from shared.keys import Keys
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.receiver.support import Uvicorn, payload
from tests.support.helpers import RedisTarget, sign, tenants_on_every_node
from tests.worker.support import (
    Records,
    Turn,
    WorkerFleet,
    now_ms,
    outbox,
    stats,
    wait_exit,
    wait_for,
)
from worker.conversation_store import ConversationStore

pytestmark = [pytest.mark.slow, pytest.mark.cluster(only=True)]
PEOPLE_PER_TENANT = 3
LEASE = {"LEASE_S": "2", "LEASE_RENEW_S": "0.5"}


def prefix_queueing_on_other_nodes(cluster: RedisCluster) -> str:
    """A key prefix whose two wake-up queues hash to nodes other than the first one (the one
    `REDIS_URL` names), so the workers' blocking pops must follow the slot map."""
    while True:
        prefix = f"cl{uuid.uuid4().hex[:8]}"
        keys = Keys(prefix)
        queues = (keys.wake_queue, keys.relay_queue)
        if all(cluster.node_for_slot(key_slot(q.encode())) != 0 for q in queues):
            return prefix


@pytest.fixture
def prefix(redis_cluster: RedisCluster) -> str:
    return prefix_queueing_on_other_nodes(redis_cluster)


@pytest.fixture
def tenants(redis_cluster: RedisCluster) -> list[str]:
    return tenants_on_every_node(redis_cluster)


@pytest.fixture
async def receiver(redis_target: RedisTarget, prefix: str) -> AsyncIterator[Uvicorn]:
    server = await asyncio.to_thread(
        # A generous Redis timeout: a 503 here would be the shared machine, not the cluster.
        Uvicorn,
        redis_target.url,
        REDIS_CLUSTER="true",
        KEY_PREFIX=prefix,
        REDIS_TIMEOUT_S="5",
    )
    try:
        yield server
    finally:
        code, output = server.terminate()
        print(f"--- receiver exited {code}\n{output[-4000:]}")


async def test_three_masters_share_every_slot_and_a_tenant_is_one_slot(
    redis: Any, redis_cluster: RedisCluster, tenants: list[str]
) -> None:
    nodes = (await redis.cluster_nodes()).values()
    masters = [n for n in nodes if "master" in n["flags"]]
    assert len(masters) == 3 and all(n["connected"] for n in masters)
    assert sum(last - first + 1 for first, last in redis_cluster.slot_ranges()) == CLUSTER_SLOTS

    for index, tenant in enumerate(tenants):
        k = Keys("wa").tenant(tenant)
        keys = [k.inbox, k.due, k.running, k.burst, k.stats, k.review, k.seen("whatsapp:w")]
        keys += [k.pending("549"), k.batch("549"), k.lock("549"), k.outbound("wamid.X")]
        keys += [k.burst_shard(burst_shard_of("549")), k.burst_shard(burst_shard_of("AR.x"))]
        keys += [k.seen_gens, k.seen_shard("1796304483", "3"), k.outbound_gens]
        keys += [k.outbound_shard("1796304483", "3")]  # the scripts build these names
        # The server's own hash of every key of the tenant: one slot, on node `index`.
        slots = {int(await redis.cluster_keyslot(key)) for key in keys}
        assert len(slots) == 1
        assert redis_cluster.node_for_slot(slots.pop()) == index
    assert len({redis_cluster.node_for_slot(key_slot(t.encode())) for t in tenants}) == 3


async def test_bursts_dedupe_and_a_killed_worker_across_tenants_on_three_nodes(
    redis: Redis,
    redis_cluster: RedisCluster,
    prefix: str,
    tenants: list[str],
    fleet: WorkerFleet,
    receiver: Uvicorn,
) -> None:
    # The safety sweep at its default interval: it is what finds a dead worker's expired lease.
    # The survivor learns that lease's end by itself only if it happened to claim for the
    # victim's tenant after the victim's batch was claimed; with the sweep off (the fleet's
    # default in tests) the batch then waited for it, a flake seen in CI. Wake-ups across the
    # nodes without any sweep are tests/worker/test_wakeups.py's, which also runs here.
    procs = await fleet.start(
        2, DEBOUNCE_WINDOW_S="0.4", MAX_WAIT_S="3", POLL_INTERVAL_S="1", **LEASE
    )
    records = Records(redis, prefix)
    people = {t: [f"54911{t[-4:]}{p:04d}" for p in range(PEOPLE_PER_TENANT)] for t in tenants}
    victim_tenant, victim = tenants[2], people[tenants[2]][0]
    sent: dict[str, list[str]] = {p: [] for ps in people.values() for p in ps}

    def message(tenant: str, person: str, n: int) -> dict[str, Any]:
        message_id = f"wamid.{person}.{n}"
        sent[person].append(message_id)
        slow = " !sleeponce=30" if person == victim and n == 0 else ""
        return text_message(message_id, f"mensaje {n}{slow}", person)

    # One POST holding every tenant (its pipeline spans the three nodes), then one per tenant
    # and message; each delivered twice at once, as Meta sometimes does.
    bodies = [payload(*((t, [message(t, p, 0) for p in people[t]], []) for t in tenants))]
    for n in (1, 2):
        bodies += [payload((t, [message(t, p, n) for p in people[t]], [])) for t in tenants]
    async with httpx.AsyncClient(base_url=receiver.url, timeout=10) as http:
        answers = []
        for body in bodies:
            raw = orjson.dumps(body)
            headers = {"X-Hub-Signature-256": sign(raw)}
            answers += await asyncio.gather(
                *(http.post("/webhooks/whatsapp", content=raw, headers=headers) for _ in range(2))
            )
    assert [a.status_code for a in answers] == [200] * len(answers)
    total = sum(len(ids) for ids in sent.values())
    assert sum(int(a.headers["x-stored"]) for a in answers) == total
    assert sum(int(a.headers["x-duplicates"]) for a in answers) == total

    async def answered(*people_: str) -> bool:
        for tenant in tenants:
            answered = {i for r in await outbox(redis, prefix, tenant) for i in r["message_ids"]}
            if not all(set(sent[p]) <= answered for p in people[tenant] if p in people_):
                return False
        return True

    # The victim's first turn sleeps: kill the worker running it, mid-turn, once everyone
    # else's turns are over (a turn of someone else killed between its brain and its send
    # would be answered again after its lease: one more AI call, as the README says, but not
    # the case this test counts).
    (killed,) = await records.wait_turns(victim, 1, outcome=None)
    others = [p for p in sent if p != victim]
    await wait_for(lambda: answered(*others), "everyone but the victim answered", timeout_s=20)
    holder = next(p for p in procs if p.pid == killed.start["pid"])
    holder.send_signal(signal.SIGKILL)
    await wait_exit(holder, 5)
    lock = Keys(prefix).tenant(victim_tenant).lock(victim)
    lease_ends_ms = now_ms() + await redis.pttl(lock)
    (survivor,) = [p for p in procs if p is not holder]

    await wait_for(lambda: answered(*sent), f"replies covering all {total} messages", timeout_s=45)
    await asyncio.sleep(0.5)  # a wrongly repeated turn would show up now

    for tenant in tenants:
        replies = await outbox(redis, prefix, tenant)
        for person in people[tenant]:
            mine = [r for r in replies if r["person"] == person]
            assert [i for r in mine for i in r["message_ids"]] == sent[person], person
            ended: list[Turn] = [t for t in await records.turns(person) if t.outcome == "end"]
            assert len(ended) == len(mine), f"one reply per finished turn of {person}"
        counters = await stats(redis, prefix, tenant)
        assert counters["messages"] == PEOPLE_PER_TENANT * 3
        assert counters.get("leases_expired", 0) == (1 if tenant == victim_tenant else 0)
        k = Keys(prefix).tenant(tenant)
        assert await redis.zcard(k.due) == await redis.zcard(k.running) == 0
        assert await redis.llen(k.inbox) == 0

    victim_turns = await records.turns(victim)
    resumed = next(t for t in victim_turns if t.batch == killed.batch and t.outcome == "end")
    assert resumed.start["pid"] == survivor.pid and resumed.ids == killed.ids
    assert resumed.start["ms"] >= lease_ends_ms - 50, "not before the dead worker's lease ended"

    # Where the data lives: each tenant's keys on its own node (a node's SCAN sees only its own).
    clients = [Redis.from_url(url) for url in redis_cluster.urls]
    try:
        for index, tenant in enumerate(tenants):
            pattern = Keys(prefix).tenant(tenant).base + ":*"
            found = [len([k async for k in c.scan_iter(match=pattern)]) for c in clients]
            assert found[index] > 0 and sum(found) == found[index], (tenant, found)
    finally:
        for c in clients:
            await c.aclose()


async def test_a_lost_script_cache_on_every_node_is_reloaded_by_receiver_and_worker(
    redis: Any, settings: Settings, prefix: str, tenants: list[str]
) -> None:
    settings = settings.with_overrides(key_prefix=prefix, debounce_window_s=0.01, max_wait_s=0.01)
    app = create_app(settings)
    body = orjson.dumps(
        payload(
            *((t, [text_message(f"wamid.s.{t}", "hola", "5491100000001")], []) for t in tenants)
        )
    )
    async with app.router.lifespan_context(app):
        await redis.script_flush()  # the cluster client flushes every master
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
            response = await client.post(
                "/webhooks/whatsapp", content=body, headers={"X-Hub-Signature-256": sign(body)}
            )
    assert response.status_code == 200 and response.headers["x-stored"] == str(len(tenants))

    await redis.script_flush()
    scripts = Scripts()
    store = ConversationStore(settings, scripts, GroupCommitter(redis, scripts))
    claims = await asyncio.gather(*(store.claim(t, 5, "tok") for t in tenants))
    await asyncio.sleep(0.05)
    claims = await asyncio.gather(*(store.claim(t, 5, "tok") for t in tenants))
    assert [[m.id for b in c.batches for m in b.messages] for c in claims] == [
        [f"wamid.s.{t}"] for t in tenants
    ]
