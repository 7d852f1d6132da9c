"""Wake-ups: how a worker learns, without polling, that a tenant has work, and only one does.

Fleet-wide sorted sets are queues of tenant ids (score: when the tenant was added, ms, so
the longest waiting goes first). `ZADD NX` keeps a tenant in a queue at most once, however
often it is woken while it waits, so none grows beyond the number of tenants, even while
no worker runs. Workers take from them with `BZPOPMIN`, which Redis serves to one blocked
client at a time (the one waiting longest): each wake-up reaches one worker, not every worker.

- `wa:wake`, **new work**: the receiver adds the tenants of each write round after the round
  (so the events are in the inbox before any worker can take the wake-up). Every worker takes
  from it, busy or not: the claim that follows takes the events in, and intake is what sets a
  conversation's due time (claim.lua, on Redis's clock), so it must not wait for a free slot.
  The worker that took the tenant in holds its next due time and claims then.
- `wa:relay`, **due, needs a free slot**: a worker relays a tenant whose conversation is due
  (or will be, as far as it knows) when it cannot start it: its slots are full, it is
  shutting down, or it is the sweeper and found more than it can take. Only a worker with a
  free slot takes from it, so a busy worker never swallows one another could serve.

**Rolling deploy of the rename** (`wa:handoff` -> `wa:relay`; remove after one release).
Workers of the previous release relay to `wa:handoff` and read only it. New workers relay to
`wa:relay` and listen on both (worker/fleet/listeners.py), so a tenant an old worker relayed is
served by a new worker as soon as one has a free slot. The other way round, a tenant a new worker
relayed while only old workers have free slots waits on `wa:relay` for the first new worker
with a free slot, or for the safety sweep (which old workers run too) to find it due: late by
an interval or two during the deploy, never lost, since the queue is kept in Redis. A tenant
taken from either queue is only a hint to claim: the claim script decides, so one relayed
twice is claimed once.

A worker that takes a wake-up and dies before its claim loses it: the safety sweep
(worker/fleet/sweep.py) finds that tenant's inbox, due time or lease end within an interval or two,
as it does for a dead worker's leases. The queues are single keys on whatever node owns their
slot on a cluster, and no command combines them with a tenant's keys (invariant 9).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from redis.asyncio.cluster import RedisCluster

from shared.keys import Keys
from shared.storage.redis_client import is_cluster

# Tenants per ZADD when many are woken at once (the sweeper): bounds one command's size.
CHUNK = 500


def _members(tenants: Iterable[str], score_ms: int) -> list[str | int]:
    flat: list[str | int] = []
    for tenant in tenants:
        flat += [score_ms, tenant]
    return flat


def wake_command(keys: Keys, tenants: Iterable[str], now_ms: int) -> tuple[str | int, ...]:
    """The receiver's `ZADD wake NX ...` for the tenants of one round, as a command tuple."""
    return ("ZADD", keys.wake_queue, "NX", *_members(tenants, now_ms))


def now_ms() -> int:
    """This machine's clock: a queue's score only orders tenants, it is never a due time."""
    return int(time.time() * 1000)


async def add(redis: Any, queue: str, tenants: Iterable[str]) -> None:
    """Put tenants on a queue (`ZADD NX`: one already waiting keeps its place)."""
    ordered = sorted(set(tenants))
    stamp = now_ms()
    for start in range(0, len(ordered), CHUNK):
        chunk = ordered[start : start + CHUNK]
        await redis.execute_command("ZADD", queue, "NX", *_members(chunk, stamp))


async def take(redis: Any, queue: str, most: int, block_s: float) -> list[str]:
    """Up to `most` tenants from a queue, waiting at most `block_s` for the first one.

    `BZPOPMIN` blocks for the first, then `ZPOPMIN` takes what else waits (`BZMPOP` does both
    in one call but needs Redis 7; these run on Redis 5 and later). Give it a client without
    `socket_timeout`: the wait may be longer than a reply timeout.
    """
    reply = await redis.bzpopmin(queue, timeout=block_s)
    if not reply:
        return []
    tenants = [_text(reply[1])]
    if most > 1:
        tenants += [_text(member) for member, _ in await redis.zpopmin(queue, most - 1)]
    return tenants


async def listening_workers(redis: Any, keys: Keys) -> int:
    """How many workers have a wake-up connection open (`CLIENT LIST` of every node; each
    worker names those connections `keys.worker_client_name(id)`)."""
    if is_cluster(redis):
        per_node = await redis.execute_command("CLIENT LIST", target_nodes=RedisCluster.ALL_NODES)
        clients = [c for node in per_node.values() for c in node]
    else:
        clients = await redis.client_list()
    names = {_text(c.get("name", "")) for c in clients}
    return sum(1 for n in names if n.startswith(keys.worker_client_prefix))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
