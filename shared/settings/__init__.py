"""The one place that reads the environment.

`Settings.from_env()` builds a frozen object; a bad or missing value raises `ConfigError`
naming the variable, so a misconfigured process stops at start-up instead of misbehaving later.
Each setting is declared once, as a field of one of the groups in shared/settings/fields.py:
variable, default, rules, secret or not and meaning; parsing, validation, masking,
`env_names()` and docs/configuration.md's table (`python -m shared.settings.doc`) all follow
from that. Per-tenant overrides (`TENANTS_FILE`) are declared in shared/settings/tenants.py;
`settings.tenant(tenant_id)` answers the values that apply to one tenant. The names are a
contract: tools outside the repo drive the product with them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NoReturn

from shared.settings.catchup_fields import CatchUpSettings
from shared.settings.fields import AISettings, ConnectionSettings, ProviderSettings, TurnSettings
from shared.settings.intake_fields import IntakeSettings
from shared.settings.ops_fields import OpsSettings
from shared.settings.spec import ConfigError as ConfigError
from shared.settings.spec import Spec, specs_of
from shared.settings.tenants import TenantConfig, check_tenants, load_tenants

__all__ = ["ConfigError", "Settings", "TenantConfig", "env_names", "exit_on_config_error"]


# The groups' fields come in this order: connection, providers, the Chatwoot catch-up, AI,
# turns, intake, ops (dataclasses take the fields of the last base first).
@dataclass(frozen=True)
class Settings(
    OpsSettings,
    IntakeSettings,
    TurnSettings,
    AISettings,
    CatchUpSettings,
    ProviderSettings,
    ConnectionSettings,
):
    """The effective configuration of a process; `from_env()` builds it."""

    # TENANTS_FILE's tables by tenant id; `tenant(tenant_id)` answers the effective values.
    tenants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

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
        self.check_signin_backoff()
        self.check_ops_users()
        if self.max_wait_s < self.debounce_window_s:
            raise ConfigError(
                f"MAX_WAIT_S ({self.max_wait_s}) must be >= DEBOUNCE_WINDOW_S "
                f"({self.debounce_window_s})"
            )
        check_tenants(self.tenants, self.tenants_file)
        self._tenant_views  # noqa: B018  (resolved now, at start-up)

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests and tools); validated like the original."""
        new = replace(self, **changes)
        new.validate()
        return new

    def tenant(self, tenant_id: str) -> TenantConfig:
        """The settings that apply to a tenant: its `TENANTS_FILE` values over the global ones
        (shared/settings/tenants.py); a tenant not in the file gets the global values."""
        return self._tenant_views.get(tenant_id, self._global_tenant)

    @cached_property
    def _tenant_views(self) -> dict[str, TenantConfig]:
        # Resolved once per Settings (`validate()` asks first), not at every turn.
        return {tid: TenantConfig.resolve(table, self) for tid, table in self.tenants.items()}

    @cached_property
    def _global_tenant(self) -> TenantConfig:
        return TenantConfig.resolve({}, self)

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
