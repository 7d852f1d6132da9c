"""Per-tenant overrides: `TENANTS_FILE`, a TOML file with one `[tenants."<id>"]` table each.

A tenant's values win over the global settings (shared/settings/__init__.py); anything it leaves out
falls back to them. A file that cannot be read, an unknown key or a bad value stops start-up
like any other bad setting (`ConfigError` naming the file).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from shared.settings.spec import ConfigError, time_zone_problem


@dataclass(frozen=True)
class TenantConfig:
    """Per-tenant overrides read from `TENANTS_FILE` (TOML, one `[tenants."<id>"]` table each);
    None: the global setting."""

    debounce_window_s: float | None = None
    max_wait_s: float | None = None
    system_prompt: str | None = None
    access_token: str | None = None
    template: str | None = None
    template_language: str = "en_US"
    # The AI of this tenant: `AI_MODEL`, `AI_MAX_TOKENS`, `MEMORY_TURNS`, and the language its
    # answers are in (a name, "Spanish", or a locale, "es-AR": a hint in the system prompt).
    model: str | None = None
    max_tokens: int | None = None
    memory_turns: int | None = None
    language: str | None = None
    # Sent when the AI's answer is empty (else the batch goes to review as `empty_answer`).
    fallback_text: str | None = None
    # Sent when the AI hands the conversation over to a person (`hand_over_to_human`).
    hand_over_text: str | None = None
    # Sent when a person opens the chat (`request_welcome`); None: `WELCOME_TEXT`.
    welcome_text: str | None = None
    # The time zone of the date and time the AI is shown (an IANA name; else `TIMEZONE`).
    timezone: str | None = None
    # How long the bot stays silent for a person a human took over (else `HUMAN_PAUSE_S`).
    human_pause_s: float | None = None


NO_OVERRIDES = TenantConfig()


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
        for key in ("debounce_window_s", "max_wait_s", "human_pause_s"):
            if key in table and (not isinstance(table[key], int | float) or table[key] <= 0):
                raise ConfigError(
                    f"TENANTS_FILE {path!r}: tenants.{tenant_id}.{key} must be a number > 0"
                )
        problem = _ai_problem(table)
        if problem:
            raise ConfigError(f"TENANTS_FILE {path!r}: tenants.{tenant_id}.{problem}")
        out[str(tenant_id)] = TenantConfig(**table)
    return out


def _ai_problem(table: Mapping[str, Any]) -> str:
    """What is wrong with a tenant's AI keys ("" if nothing): `key must be ...`."""
    for key, least in (("max_tokens", 1), ("memory_turns", 0)):
        value = table.get(key, least)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            return f"{key} must be a whole number >= {least}"
    for key in ("model", "language"):
        value = table.get(key, "x")
        if not isinstance(value, str) or not value.strip():
            return f"{key} must be a non-empty string"
    for key in ("system_prompt", "welcome_text"):
        if not isinstance(table.get(key, ""), str):
            return f"{key} must be a string"
    zone = table.get("timezone", "UTC")
    if not isinstance(zone, str) or time_zone_problem(zone):
        return f"timezone must be an IANA time zone name, got {zone!r}"
    return ""
