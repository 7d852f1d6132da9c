"""The one place that reads the environment.

`Settings.from_env()` builds a frozen object; a bad or missing value raises `ConfigError`
naming the variable, so a misconfigured process stops at start-up instead of misbehaving later.
Each setting is declared once, as a field of one of the groups in shared/settings/fields.py:
variable, default, rules, secret or not and meaning; parsing, validation, masking,
`env_names()` and docs/configuration.md's table (`python -m shared.settings.doc`) all follow
from that. Per-tenant overrides (`TENANTS_FILE`) are read by shared/settings/tenants.py. The names
are
a contract: tools outside the repo drive the product with them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from shared.settings.fields import AISettings, ConnectionSettings, ProviderSettings, TurnSettings
from shared.settings.ops_fields import OpsSettings
from shared.settings.spec import ConfigError as ConfigError
from shared.settings.spec import Spec, specs_of
from shared.settings.tenants import NO_OVERRIDES, TenantConfig, load_tenants

__all__ = ["ConfigError", "Settings", "TenantConfig", "env_names", "exit_on_config_error"]


# The groups' fields come in this order: connection, providers, AI, turns, ops (dataclasses
# take the fields of the last base first).
@dataclass(frozen=True)
class Settings(OpsSettings, TurnSettings, AISettings, ProviderSettings, ConnectionSettings):
    """The effective configuration of a process; `from_env()` builds it."""

    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)  # from TENANTS_FILE

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for spec in SPECS:
            values[spec.name] = spec.read(env, values)
        if values["tenants_file"]:
            values["tenants"] = load_tenants(values["tenants_file"])
        settings = cls(**values)
        settings.validate()
        return settings

    @classmethod
    def from_env_or_exit(cls) -> Settings:
        """`from_env()` for a process's entry point: a bad setting ends the process with one
        line on stderr naming the variable, and exit code 2 (no traceback)."""
        try:
            return cls.from_env()
        except ConfigError as exc:
            exit_on_config_error(exc)

    def validate(self) -> None:
        for spec in SPECS:
            spec.check(getattr(self, spec.name))
        if self.lease_renew_s >= self.lease_s:
            raise ConfigError(
                f"LEASE_RENEW_S ({self.lease_renew_s}) must be shorter than "
                f"LEASE_S ({self.lease_s})"
            )
        if self.ai_outage_max_pause_s < self.ai_outage_pause_s:
            raise ConfigError(
                f"AI_OUTAGE_MAX_PAUSE_S ({self.ai_outage_max_pause_s}) must be >= "
                f"AI_OUTAGE_PAUSE_S ({self.ai_outage_pause_s})"
            )
        _check_tls(self)
        self.check_review_webhook()
        if self.max_wait_s < self.debounce_window_s:
            raise ConfigError(
                f"MAX_WAIT_S ({self.max_wait_s}) must be >= DEBOUNCE_WINDOW_S "
                f"({self.debounce_window_s})"
            )

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests and tools); validated like the original."""
        new = replace(self, **changes)
        new.validate()
        return new

    def tenant(self, tenant_id: str) -> TenantConfig:
        return self.tenants.get(tenant_id, NO_OVERRIDES)

    def window_s(self, tenant_id: str) -> float:
        return self.tenant(tenant_id).debounce_window_s or self.debounce_window_s

    def max_wait_for(self, tenant_id: str) -> float:
        return self.tenant(tenant_id).max_wait_s or self.max_wait_s

    def human_pause_for(self, tenant_id: str) -> float:
        """How long a human takeover silences the bot for a person of this tenant (s)."""
        return self.tenant(tenant_id).human_pause_s or self.human_pause_s

    def memory_turns_for(self, tenant_id: str) -> int:
        turns = self.tenant(tenant_id).memory_turns
        return self.memory_turns if turns is None else turns

    def welcome_text_for(self, tenant_id: str) -> str:
        """The welcome text (`request_welcome`) of a tenant; "": such events start no turn."""
        text = self.tenant(tenant_id).welcome_text
        return (self.welcome_text if text is None else text).strip()

    def masked(self) -> dict[str, Any]:
        """Effective configuration for start-up logs, with secrets masked."""
        out = {spec.name: spec.shown(getattr(self, spec.name)) for spec in SPECS}
        out["tenants"] = sorted(self.tenants)
        return out


SPECS: tuple[Spec, ...] = specs_of(Settings)


def env_names() -> frozenset[str]:
    """Every environment variable `Settings.from_env` reads (tools that must keep a
    developer's own settings out of a child process strip these)."""
    return frozenset(spec.env for spec in SPECS)


def _check_tls(settings: Settings) -> None:
    if settings.redis_tls_ca_file and settings.redis_tls_verify == "none":
        raise ConfigError(
            "REDIS_TLS_CA_FILE is set but REDIS_TLS_VERIFY=none turns verification off:"
            " keep one of them"
        )


def exit_on_config_error(error: ConfigError) -> NoReturn:
    """End the process the way every entry point does for a bad setting: one line, code 2."""
    print(f"configuration error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(2)
