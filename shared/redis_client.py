"""Builds the asyncio Redis client: one server, or a cluster when `REDIS_CLUSTER=true`."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from shared.settings import Settings


def make_redis(settings: Settings, **overrides: Any) -> Any:
    """A client with bounded timeouts, so a stalled Redis surfaces as an error, not a hang.

    Typed as Any because the single-server and cluster clients share no common base class.
    """
    options: dict[str, Any] = {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        "health_check_interval": 30,
    }
    options.update(overrides)
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, **options)
    return Redis.from_url(settings.redis_url, **options)


def is_cluster(redis: Any) -> bool:
    """True for the cluster client, whose pipelines cannot carry PUBLISH."""
    return isinstance(redis, RedisCluster)
