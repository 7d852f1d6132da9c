"""Builds the asyncio Redis client: one server, or a cluster when `REDIS_CLUSTER=true`.

Every process builds its clients here, so `REDIS_TLS_VERIFY` and `REDIS_TLS_CA_FILE` apply to
the receiver, the workers and the CLIs alike.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from shared.settings import Settings

# What a refused certificate looks like in the error (OpenSSL's reason code).
_UNTRUSTED = "CERTIFICATE_VERIFY_FAILED"


def make_redis(settings: Settings, **overrides: Any) -> Any:
    """A client with bounded timeouts, so a stalled Redis surfaces as an error, not a hang.

    Typed as Any because the single-server and cluster clients share no common base class.
    """
    options: dict[str, Any] = {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        "health_check_interval": 30,
        **tls_options(settings),
    }
    options.update(overrides)
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, **options)
    return Redis.from_url(settings.redis_url, **options)


def tls_options(settings: Settings) -> dict[str, Any]:
    """redis-py's certificate options for a `rediss://` URL; none for the others, whose
    connections take no `ssl_*` argument. Options in the URL's query string still win."""
    if not settings.redis_url.startswith("rediss://"):
        return {}
    if settings.redis_tls_verify == "none":
        return {"ssl_cert_reqs": "none", "ssl_check_hostname": False}
    # Spelled out: redis-py before 6.0 did not check the host name by default.
    return {
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": settings.redis_tls_ca_file or None,
    }


def explain(error: BaseException) -> str:
    """`error` for a log line, with the setting that fixes it when the server's certificate
    was refused (a Redis with TLS is otherwise just "not reachable")."""
    text = str(error) or repr(error)
    if _UNTRUSTED in text:
        text += (
            " (the Redis server's certificate is not trusted: REDIS_TLS_VERIFY=none accepts a"
            " self-signed one, as Heroku Redis has; REDIS_TLS_CA_FILE names a CA to trust)"
        )
    return text


def is_cluster(redis: Any) -> bool:
    """True for the cluster client, whose pipelines cannot carry PUBLISH."""
    return isinstance(redis, RedisCluster)
