"""Settings in the units the Lua scripts read, worked out once from `Settings`.

Durations are configured in seconds (shared/settings); the scripts take milliseconds (or whole
seconds where Redis wants them) and flags as 0/1. The conversion happens here, once at
start-up, for every configured tenant and for the defaults the others get; each attribute is
named as the ARGV entry it fills (shared/lua/*.lua), so a caller passes `window_ms=t.window_ms`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.settings import Settings
from shared.settings.tenants import TenantConfig


@dataclass(frozen=True)
class TenantScriptSettings:
    """One tenant's settings as the scripts read them."""

    window_ms: int  # the debounce window
    max_wait_ms: int  # how long a burst waits at most
    human_pause_ms: int  # how long a human takeover (an echo, a reply by hand) pauses the bot
    memory_turns: int  # how many exchanges a memory keeps
    welcome: int  # 1: a `request_welcome` event starts a turn (a welcome text is configured)

    @classmethod
    def of(cls, own: TenantConfig) -> TenantScriptSettings:
        """From the tenant's view (`Settings.tenant`), its overrides already resolved."""
        return cls(
            window_ms=_ms(own.debounce_window_s),
            max_wait_ms=_ms(own.max_wait_s),
            human_pause_ms=_ms(own.human_pause_s),
            memory_turns=own.memory_turns,
            welcome=1 if own.welcome_text else 0,
        )


@dataclass(frozen=True)
class ScriptSettings:
    """The fleet-wide settings as the scripts read them, and each tenant's (`tenant`)."""

    lease_ms: int  # a turn's lease (LEASE_S)
    memory_ttl_ms: int  # how long memory lives after the last turn (MEMORY_TTL_S)
    memory_ttl_s: int  # the same in whole seconds, at least 1 (an EXPIRE of 0 deletes)
    default: TenantScriptSettings  # a tenant TENANTS_FILE does not name
    tenants: Mapping[str, TenantScriptSettings]

    @classmethod
    def of(cls, settings: Settings) -> ScriptSettings:
        # A tenant not in TENANTS_FILE has no overrides: any id not configured gives the same.
        unnamed = "\x00not a configured tenant"
        return cls(
            lease_ms=_ms(settings.lease_s),
            memory_ttl_ms=_ms(settings.memory_ttl_s),
            memory_ttl_s=max(1, int(settings.memory_ttl_s)),
            default=TenantScriptSettings.of(settings.tenant(unnamed)),
            tenants={t: TenantScriptSettings.of(settings.tenant(t)) for t in settings.tenants},
        )

    def tenant(self, tenant: str) -> TenantScriptSettings:
        return self.tenants.get(tenant, self.default)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
