"""Loads a user's own brain, sender or tools from `package.module:attr`."""

from __future__ import annotations

import importlib
from typing import Any

from shared.settings import ConfigError, Settings


def import_object(spec: str, var: str) -> Any:
    """What `package.module:attr` names, as is; a ConfigError naming `var` if it cannot be."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{var} must be a built-in name or 'package.module:attr', got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{var}={spec!r} cannot be loaded: {exc}") from exc


def load_object(spec: str, var: str, settings: Settings, method: str) -> Any:
    """`attr` may be the object itself, or a class/factory called with the settings."""
    obj: Any = import_object(spec, var)
    if isinstance(obj, type) or not hasattr(obj, method):
        try:
            obj = obj(settings)
        except TypeError as exc:  # not callable, or not with the settings as argument
            raise ConfigError(
                f"{var}={spec!r} is neither an object with {method}() nor a factory "
                f"taking the settings: {exc}"
            ) from exc
    if not callable(getattr(obj, method, None)):
        raise ConfigError(f"{var}={spec!r} has no {method}() method")
    return obj
