"""How one setting is declared: its variable, its rules, how it is read and how it is shown.

`setting(...)` is the default of a `Settings` field and carries a `Spec` in the field's
metadata; `specs_of(Settings)` completes each spec with its field's name, type and default.
Everything else (parsing, validation, masking, the variable list, the docs table) reads specs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar, get_type_hints
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

T = TypeVar("T")

SPEC = "setting"  # the field-metadata key a Spec is stored under


class ConfigError(ValueError):
    """A configuration value is missing or malformed; the message names the variable."""


@dataclass(frozen=True)
class Spec:
    """One environment variable and what it may hold; `name`, `kind` and `default` come from
    the dataclass field it is declared on.

    Reading follows the kind: a number or a flag left empty takes its default; a string with a
    default is trimmed and may not be set empty, one without (a secret, a path) is taken as
    given; `tuple[str, ...]` is a comma-separated list (several secrets during a rotation).
    """

    env: str
    doc: str
    secret: bool = False  # logs show "***" instead (a list: one "***" per item)
    above: float | None = None  # the value must be greater than this
    at_least: float | None = None  # ...or at least this
    choices: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()  # the value must start with one of these
    rule: tuple[Callable[[Any], bool], str] | None = None  # (valid?, "be a ..."), for the rest
    normalize: Callable[[str], str] | None = None  # applied to a read string
    default_when_set: tuple[str, str] | None = None  # (other field, value): default if it is set
    show: Callable[[Any], Any] | None = None  # how logs and errors show a value that is not secret
    shown_default: str | None = None  # the docs table's default, when the value is too long
    name: str = ""
    kind: Any = None
    default: Any = None

    def read(self, env: Mapping[str, str], earlier: Mapping[str, Any]) -> Any:
        """The value from `env`; `earlier` holds the fields declared before this one."""
        default = self.default
        if self.default_when_set is not None:
            other, value = self.default_when_set
            default = value if earlier[other] else default
        raw = env.get(self.env)
        if self.kind is str:
            return self._read_str(raw, default)
        if self.kind == tuple[str, ...]:
            return tuple(s.strip() for s in (raw or "").split(",") if s.strip())
        if raw is None or raw == "":
            return default
        if self.kind is bool:
            return self._read_bool(raw)
        return self._read_number(raw)

    def check(self, value: Any) -> None:
        """Raise ConfigError, naming the variable, unless `value` keeps every rule."""
        shown = self.shown(value)
        if self.above is not None and not value > self.above:
            raise ConfigError(f"{self.env} must be > {self.above:g}, got {shown!r}")
        if self.at_least is not None and not value >= self.at_least:
            raise ConfigError(f"{self.env} must be >= {self.at_least:g}, got {shown!r}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.env} must be {_either(self.choices)}, got {shown!r}")
        if self.prefixes and not value.startswith(self.prefixes):
            raise ConfigError(f"{self.env} must start with {_either(self.prefixes)}, got {shown!r}")
        if self.rule is not None and not self.rule[0](value):
            raise ConfigError(f"{self.env} must {self.rule[1]}, got {shown!r}")

    def shown(self, value: Any) -> Any:
        """The value as logs may show it: secrets masked, and whatever `show` hides."""
        if self.secret and value:
            return "***" if isinstance(value, str) else ["***"] * len(value)
        return self.show(value) if self.show is not None else value

    def _read_str(self, raw: str | None, default: str) -> str:
        if raw is None:
            return default
        value = raw
        if self.default:  # one with a default is trimmed, and set empty it is a mistake
            value = raw.strip()
            if not value:
                raise ConfigError(f"{self.env} is set but empty")
        return self.normalize(value) if self.normalize is not None else value

    def _read_bool(self, raw: str) -> bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{self.env} must be true or false, got {raw!r}")

    def _read_number(self, raw: str) -> int | float:
        try:
            value: int | float = self.kind(raw.strip())
        except ValueError:
            word = "an integer" if self.kind is int else "a number"
            raise ConfigError(f"{self.env} must be {word}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{self.env} must be a finite number, got {raw!r}")
        return value


def setting(env: str, default: T, doc: str, **rules: Any) -> T:
    """A `Settings` field read from `env` (see `Spec` for the rules)."""
    spec = Spec(env, doc, **rules)
    return field(default=default, metadata={SPEC: spec})


def specs_of(cls: type) -> tuple[Spec, ...]:
    """The declared settings of a dataclass, in declaration order, each knowing its field."""
    hints = get_type_hints(cls)
    return tuple(
        replace(f.metadata[SPEC], name=f.name, kind=hints[f.name], default=f.default)
        for f in fields(cls)
        if SPEC in f.metadata
    )


def mask_url(url: str) -> str:
    """A URL without its credentials: `redis://***@host:6379/0`."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    return f"{scheme}{sep}***@{rest.split('@', 1)[1]}"


def time_zone_problem(name: str) -> str:
    """What is wrong with time zone `name` ("" when zoneinfo knows it)."""
    try:
        ZoneInfo(name)
    except (ValueError, ZoneInfoNotFoundError):  # a bad key is a ValueError
        return f"unknown time zone {name!r}"
    return ""


def _either(options: tuple[str, ...]) -> str:
    """`a, b or c`, for messages."""
    *head, last = options
    return f"{', '.join(head)} or {last}" if head else last
