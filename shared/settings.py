"""The one place that reads the environment.

`Settings.from_env()` builds a frozen object; a bad or missing value raises `ConfigError`
naming the variable, so a misconfigured process stops at start-up instead of misbehaving later.
The names are a contract: tools outside the repo drive the product with them.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing or malformed; the message names the variable."""


@dataclass(frozen=True)
class TenantConfig:
    """Per-tenant overrides read from `TENANTS_FILE` (TOML, one `[tenants."<id>"]` table each)."""

    debounce_window_s: float | None = None
    max_wait_s: float | None = None
    system_prompt: str | None = None
    access_token: str | None = None
    template: str | None = None
    template_language: str = "en_US"


@dataclass(frozen=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_cluster: bool = False
    redis_timeout_s: float = 2.0
    key_prefix: str = "wa"
    port: int = 8000

    whatsapp_app_secrets: tuple[str, ...] = ()
    whatsapp_verify_token: str = ""
    whatsapp_access_token: str = ""
    whatsapp_api_base_url: str = "https://graph.facebook.com"
    whatsapp_api_version: str = "v23.0"
    whatsapp_timeout_s: float = 15.0

    chatwoot_base_url: str = "https://app.chatwoot.com"
    chatwoot_api_access_token: str = ""
    chatwoot_webhook_secrets: tuple[str, ...] = ()
    chatwoot_webhook_tokens: tuple[str, ...] = ()
    chatwoot_only_pending: bool = False
    chatwoot_timeout_s: float = 15.0

    anthropic_api_key: str = ""
    ai_model: str = "claude-sonnet-4-5"
    system_prompt: str = "You are a helpful assistant answering customers on WhatsApp."
    ai_max_tokens: int = 1024
    ai_timeout_s: float = 60.0
    memory_turns: int = 10
    memory_ttl_s: float = 86400.0
    brain: str = "echo"
    sender: str = "outbox"
    tenants_file: str = ""

    debounce_window_s: float = 20.0
    max_wait_s: float = 60.0
    lease_s: float = 120.0
    lease_renew_s: float = 30.0
    max_attempts: int = 4
    retry_base_s: float = 5.0
    review_after_s: float = 900.0
    worker_concurrency: int = 5
    poll_interval_s: float = 1.0
    shutdown_grace_s: float = 10.0
    dedupe_ttl_s: int = 604800
    max_body_bytes: int = 4 * 1024 * 1024
    log_level: str = "INFO"
    log_format: str = "json"

    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        d = cls()
        api_key = env.get("ANTHROPIC_API_KEY", "")
        values: dict[str, Any] = {
            "redis_url": _str(env, "REDIS_URL", d.redis_url),
            "redis_cluster": _bool(env, "REDIS_CLUSTER", d.redis_cluster),
            "redis_timeout_s": _num(env, "REDIS_TIMEOUT_S", d.redis_timeout_s, float),
            "key_prefix": _str(env, "KEY_PREFIX", d.key_prefix),
            "port": _num(env, "PORT", d.port, int),
            "whatsapp_app_secrets": tuple(
                s.strip() for s in env.get("WHATSAPP_APP_SECRET", "").split(",") if s.strip()
            ),
            "whatsapp_verify_token": env.get("WHATSAPP_VERIFY_TOKEN", ""),
            "whatsapp_access_token": env.get("WHATSAPP_ACCESS_TOKEN", ""),
            "whatsapp_api_base_url": _str(
                env, "WHATSAPP_API_BASE_URL", d.whatsapp_api_base_url
            ).rstrip("/"),
            "whatsapp_api_version": _str(env, "WHATSAPP_API_VERSION", d.whatsapp_api_version),
            "whatsapp_timeout_s": _num(env, "WHATSAPP_TIMEOUT_S", d.whatsapp_timeout_s, float),
            "chatwoot_base_url": _str(env, "CHATWOOT_BASE_URL", d.chatwoot_base_url).rstrip("/"),
            "chatwoot_api_access_token": env.get("CHATWOOT_API_ACCESS_TOKEN", "").strip(),
            "chatwoot_webhook_secrets": _list(env, "CHATWOOT_WEBHOOK_SECRET"),
            "chatwoot_webhook_tokens": _list(env, "CHATWOOT_WEBHOOK_TOKEN"),
            "chatwoot_only_pending": _bool(env, "CHATWOOT_ONLY_PENDING", d.chatwoot_only_pending),
            "chatwoot_timeout_s": _num(env, "CHATWOOT_TIMEOUT_S", d.chatwoot_timeout_s, float),
            "anthropic_api_key": api_key,
            "ai_model": _str(env, "AI_MODEL", d.ai_model),
            "system_prompt": _str(env, "SYSTEM_PROMPT", d.system_prompt),
            "ai_max_tokens": _num(env, "AI_MAX_TOKENS", d.ai_max_tokens, int),
            "ai_timeout_s": _num(env, "AI_TIMEOUT_S", d.ai_timeout_s, float),
            "memory_turns": _num(env, "MEMORY_TURNS", d.memory_turns, int),
            "memory_ttl_s": _num(env, "MEMORY_TTL_S", d.memory_ttl_s, float),
            # With a key the real AI is the sensible default; without one, the offline echo.
            "brain": _str(env, "BRAIN", "anthropic" if api_key else "echo"),
            # With a Graph API token replies go to WhatsApp; without one, to the Redis outbox.
            "sender": _str(
                env, "SENDER", "whatsapp" if env.get("WHATSAPP_ACCESS_TOKEN") else d.sender
            ),
            "tenants_file": env.get("TENANTS_FILE", ""),
            "debounce_window_s": _num(env, "DEBOUNCE_WINDOW_S", d.debounce_window_s, float),
            "max_wait_s": _num(env, "MAX_WAIT_S", d.max_wait_s, float),
            "lease_s": _num(env, "LEASE_S", d.lease_s, float),
            "lease_renew_s": _num(env, "LEASE_RENEW_S", d.lease_renew_s, float),
            "max_attempts": _num(env, "MAX_ATTEMPTS", d.max_attempts, int),
            "retry_base_s": _num(env, "RETRY_BASE_S", d.retry_base_s, float),
            "review_after_s": _num(env, "REVIEW_AFTER_S", d.review_after_s, float),
            "worker_concurrency": _num(env, "WORKER_CONCURRENCY", d.worker_concurrency, int),
            "poll_interval_s": _num(env, "POLL_INTERVAL_S", d.poll_interval_s, float),
            "shutdown_grace_s": _num(env, "SHUTDOWN_GRACE_S", d.shutdown_grace_s, float),
            "dedupe_ttl_s": _num(env, "DEDUPE_TTL_S", d.dedupe_ttl_s, int),
            "max_body_bytes": _num(env, "MAX_BODY_BYTES", d.max_body_bytes, int),
            "log_level": _str(env, "LOG_LEVEL", d.log_level).upper(),
            "log_format": _str(env, "LOG_FORMAT", d.log_format).lower(),
        }
        if values["tenants_file"]:
            values["tenants"] = load_tenants(values["tenants_file"])
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        positive = (
            "redis_timeout_s debounce_window_s max_wait_s lease_s lease_renew_s max_attempts "
            "ai_max_tokens ai_timeout_s memory_ttl_s whatsapp_timeout_s chatwoot_timeout_s "
            "retry_base_s review_after_s worker_concurrency poll_interval_s dedupe_ttl_s "
            "max_body_bytes"
        ).split()
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.upper()} must be > 0, got {getattr(self, name)!r}")
        if self.memory_turns < 0:
            raise ConfigError("MEMORY_TURNS must be >= 0")
        if self.shutdown_grace_s < 0:
            raise ConfigError("SHUTDOWN_GRACE_S must be >= 0")
        if self.lease_renew_s >= self.lease_s:
            raise ConfigError(
                f"LEASE_RENEW_S ({self.lease_renew_s}) must be shorter than "
                f"LEASE_S ({self.lease_s})"
            )
        if self.max_wait_s < self.debounce_window_s:
            raise ConfigError(
                f"MAX_WAIT_S ({self.max_wait_s}) must be >= DEBOUNCE_WINDOW_S "
                f"({self.debounce_window_s})"
            )
        if not 0 < self.port < 65536:
            raise ConfigError(f"PORT must be a TCP port, got {self.port}")
        if not self.key_prefix or any(c in self.key_prefix for c in "{}: "):
            raise ConfigError("KEY_PREFIX must be non-empty without '{', '}', ':' or spaces")
        if self.log_level not in _LOG_LEVELS:
            raise ConfigError(f"LOG_LEVEL must be one of {', '.join(_LOG_LEVELS)}")
        if self.log_format not in ("json", "text"):
            raise ConfigError(f"LOG_FORMAT must be json or text, got {self.log_format!r}")
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError("REDIS_URL must start with redis://, rediss:// or unix://")
        if not self.chatwoot_base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"CHATWOOT_BASE_URL must start with http:// or https://, "
                f"got {self.chatwoot_base_url!r}"
            )

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests and tools); validated like the original."""
        new = replace(self, **changes)
        new.validate()
        return new

    def tenant(self, tenant_id: str) -> TenantConfig:
        return self.tenants.get(tenant_id, _NO_OVERRIDES)

    def window_s(self, tenant_id: str) -> float:
        return self.tenant(tenant_id).debounce_window_s or self.debounce_window_s

    def max_wait_for(self, tenant_id: str) -> float:
        return self.tenant(tenant_id).max_wait_s or self.max_wait_s

    def masked(self) -> dict[str, Any]:
        """Effective configuration for start-up logs, with secrets masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _SECRETS and value:
                value = "***" if isinstance(value, str) else ["***"] * len(value)
            elif f.name == "tenants":
                value = sorted(value)
            elif f.name == "redis_url":
                value = _mask_url(value)
            out[f.name] = value
        return out


def env_names() -> frozenset[str]:
    """Every environment variable `Settings.from_env` reads (tools that must keep a
    developer's own settings out of a child process strip these)."""
    seen = _ReadRecorder()
    Settings.from_env(seen)
    return frozenset(seen.names)


class _ReadRecorder(dict[str, str]):
    """An empty environment that remembers which names were looked up."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.names.add(key)
        return default


_NO_OVERRIDES = TenantConfig()
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_SECRETS = {
    "whatsapp_app_secrets",
    "whatsapp_verify_token",
    "whatsapp_access_token",
    "anthropic_api_key",
    "chatwoot_api_access_token",
    "chatwoot_webhook_secrets",
    "chatwoot_webhook_tokens",
}


def load_tenants(path: str) -> dict[str, TenantConfig]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"TENANTS_FILE {path!r} cannot be read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"TENANTS_FILE {path!r} is not valid TOML: {exc}") from exc
    tables = data.get("tenants", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"TENANTS_FILE {path!r}: [tenants] must be a table")
    known = {f.name for f in fields(TenantConfig)}
    out: dict[str, TenantConfig] = {}
    for tenant_id, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError(f"TENANTS_FILE {path!r}: tenants.{tenant_id} must be a table")
        unknown = set(table) - known
        if unknown:
            raise ConfigError(
                f"TENANTS_FILE {path!r}: tenants.{tenant_id} has unknown keys {sorted(unknown)}"
            )
        for key in ("debounce_window_s", "max_wait_s"):
            if key in table and (not isinstance(table[key], int | float) or table[key] <= 0):
                raise ConfigError(
                    f"TENANTS_FILE {path!r}: tenants.{tenant_id}.{key} must be a number > 0"
                )
        out[str(tenant_id)] = TenantConfig(**table)
    return out


def _str(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name)
    if value is None:
        return default
    if not value.strip():
        raise ConfigError(f"{name} is set but empty")
    return value.strip()


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list (several secrets or tokens while one is being rotated)."""
    return tuple(s.strip() for s in env.get(name, "").split(",") if s.strip())


def _num(env: Mapping[str, str], name: str, default: T, kind: Callable[[str], T]) -> T:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        word = "an integer" if kind is int else "a number"
        raise ConfigError(f"{name} must be {word}, got {raw!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {raw!r}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _mask_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    return f"{scheme}{sep}***@{rest.split('@', 1)[1]}"
