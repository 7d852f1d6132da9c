"""Per-tenant settings: `TENANTS_FILE` and one tenant's effective values, `TenantConfig`.

`TENANTS_FILE` is a TOML file with one `[tenants."<id>"]` table each (docs/configuration.md).
A tenant's values win over the global settings (shared/settings/__init__.py); anything it leaves
out falls back to them. `Settings.tenant(tenant_id)` answers a `TenantConfig` holding the values
that apply to that tenant, resolved once per `Settings`; a tenant not in the file gets the global
values. A file that cannot be read, an unknown key or a bad value stops start-up like any other
bad setting (`ConfigError` naming the file).

Adding a per-tenant override is one field of `TenantConfig`, declared with `override(...)`: the
rule a value in the file must follow and the global setting the tenant falls back to (or a
default when there is none). The file's key is the field's name; reading, checking and resolving
follow from the declaration. Then show the key in docs/configuration.md ("Per-tenant overrides").
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from shared.settings.spec import ConfigError, time_zone_problem

OVERRIDE = "tenant_override"  # the field-metadata key an Override is stored under

Rule = tuple[Callable[[Any], bool], str]  # (valid?, "be a ..."): what a value in the file must be


@dataclass(frozen=True)
class Override:
    """How one field of `TenantConfig` is read from the file and resolved."""

    rule: Rule
    fallback: str  # the Settings field a tenant that does not set it gets ("": `default`)
    default: Any
    key: str  # the file's key, when it is not the field's name
    blank_is_a_value: bool  # "" in the file is kept (else it means "the global value")
    clean: Callable[[Any], Any] | None  # applied to the value, the tenant's or the global one

    def value(self, table: Mapping[str, Any], name: str, settings: object) -> Any:
        """The effective value of field `name` for a tenant whose file table is `table`."""
        value = table.get(self.key or name)
        if value is not None and self.clean is not None:
            value = self.clean(value)
        if value is not None and (value != "" or self.blank_is_a_value):
            return value
        value = getattr(settings, self.fallback) if self.fallback else self.default
        return value if self.clean is None else self.clean(value)


def override(
    rule: Rule,
    fallback: str = "",
    *,
    default: Any = None,
    key: str = "",
    blank_is_a_value: bool = False,
    clean: Callable[[Any], Any] | None = None,
    secret: bool = False,
) -> Any:
    """A `TenantConfig` field a tenant may set in `TENANTS_FILE` (see `Override`); a secret is
    left out of the repr."""
    declared = Override(rule, fallback, default, key, blank_is_a_value, clean)
    return field(metadata={OVERRIDE: declared}, repr=not secret)


def _whole(least: int) -> Rule:
    return (
        lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= least,
        f"be a whole number >= {least}",
    )


POSITIVE: Rule = (lambda v: isinstance(v, int | float) and v > 0, "be a number > 0")
STRING: Rule = (lambda v: isinstance(v, str), "be a string")
NON_EMPTY: Rule = (lambda v: isinstance(v, str) and bool(v.strip()), "be a non-empty string")
TIME_ZONE: Rule = (
    lambda v: isinstance(v, str) and not time_zone_problem(v),
    "be an IANA time zone name",
)


@dataclass(frozen=True)
class TenantConfig:
    """The settings that apply to one tenant: its `TENANTS_FILE` values over the global ones
    (`Settings.tenant(tenant_id)`). Each field names its global setting."""

    debounce_window_s: float = override(POSITIVE, "debounce_window_s")
    max_wait_s: float = override(POSITIVE, "max_wait_s")
    system_prompt: str = override(STRING, "system_prompt")
    # The file's `access_token`: the number's Graph API token, or a Chatwoot inbox's API token.
    whatsapp_access_token: str = override(
        STRING, "whatsapp_access_token", key="access_token", secret=True
    )
    chatwoot_api_access_token: str = override(
        STRING, "chatwoot_api_access_token", key="access_token", secret=True
    )
    # Sent when the 24-hour window is closed ("": none, the batch goes to review).
    template: str = override(STRING, default="")
    template_language: str = override(STRING, default="en_US", blank_is_a_value=True)
    model: str = override(NON_EMPTY, "ai_model")
    max_tokens: int = override(_whole(1), "ai_max_tokens")
    memory_turns: int = override(_whole(0), "memory_turns")
    # The language its answers are in (a name, "Spanish", or a locale, "es-AR": a hint after the
    # system prompt); "": no hint.
    language: str = override(NON_EMPTY, default="")
    # Sent when the AI's answer is empty ("": the batch goes to review as `empty_answer`).
    fallback_text: str = override(STRING, "ai_fallback_text", clean=str.strip)
    # Sent when the AI hands the conversation over to a person (`hand_over_to_human`).
    hand_over_text: str = override(STRING, "ai_hand_over_text")
    # Sent when a person opens the chat (`request_welcome`); "", even the tenant's own: such
    # events start no turn.
    welcome_text: str = override(STRING, "welcome_text", blank_is_a_value=True, clean=str.strip)
    # The time zone of the date and time the AI is shown.
    timezone: str = override(TIME_ZONE, "timezone")
    # How long the bot stays silent for a person a human took over.
    human_pause_s: float = override(POSITIVE, "human_pause_s")

    @classmethod
    def resolve(cls, table: Mapping[str, Any], settings: object) -> TenantConfig:
        """The effective settings of a tenant whose `TENANTS_FILE` table is `table` ({}: a
        tenant not in the file). `settings` is the global `Settings`, read by field name (each
        override's `fallback`), so this module needs no import of it."""
        return cls(**{name: o.value(table, name, settings) for name, o in OVERRIDES})


OVERRIDES: tuple[tuple[str, Override], ...] = tuple(
    (f.name, f.metadata[OVERRIDE]) for f in fields(TenantConfig)
)
# The file's keys and their rules (`access_token` serves two fields).
RULES: dict[str, Rule] = {o.key or name: o.rule for name, o in OVERRIDES}


def load_tenants(path: str) -> dict[str, dict[str, Any]]:
    """The tables of `TENANTS_FILE` by tenant id, checked (`check_tenants`)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"TENANTS_FILE {path!r} cannot be read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"TENANTS_FILE {path!r} is not valid TOML: {exc}") from exc
    tables = data.get("tenants", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"TENANTS_FILE {path!r}: [tenants] must be a table")
    out: dict[str, dict[str, Any]] = {}
    for tenant_id, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError(f"TENANTS_FILE {path!r}: tenants.{tenant_id} must be a table")
        out[str(tenant_id)] = table
    check_tenants(out, path)
    return out


def check_tenants(tables: Mapping[str, Mapping[str, Any]], path: str) -> None:
    """Raise `ConfigError` naming the file, the tenant and the key for a table that has an
    unknown key or a value its rule rejects (`Settings.validate` checks tables given to
    `with_overrides` too)."""
    for tenant_id, table in tables.items():
        problem = _problem(table)
        if problem:
            raise ConfigError(f"TENANTS_FILE {path!r}: tenants.{tenant_id}{problem}")


def _problem(table: Mapping[str, Any]) -> str:
    """What is wrong with a tenant's table ("" if nothing)."""
    unknown = set(table) - set(RULES)
    if unknown:
        return f" has unknown keys {sorted(unknown)}"
    for key, value in table.items():
        valid, what = RULES[key]
        if not valid(value):
            return f".{key} must {what}, got {value!r}"
    return ""
