"""Settings in the units the Lua scripts read (shared/storage/script_settings.py)."""

from __future__ import annotations

from shared.settings import Settings
from shared.storage.script_settings import ScriptSettings

TENANT = "106540352242922"


def test_seconds_become_the_scripts_units_once() -> None:
    settings = Settings().with_overrides(
        lease_s=90,
        memory_ttl_s=0.4,
        debounce_window_s=1.5,
        max_wait_s=4,
        human_pause_s=60,
        welcome_text="",
        tenants={TENANT: {"debounce_window_s": 0.25, "memory_turns": 3, "welcome_text": "hola"}},
    )
    units = ScriptSettings.of(settings)
    assert (units.lease_ms, units.memory_ttl_ms, units.memory_ttl_s) == (90_000, 400, 1)
    configured, other = units.tenant(TENANT), units.tenant("another")
    assert (configured.window_ms, configured.max_wait_ms) == (250, 4000)
    assert (configured.memory_turns, configured.welcome) == (3, 1)
    assert (other.window_ms, other.human_pause_ms, other.welcome) == (1500, 60_000, 0)
    assert other.memory_turns == settings.memory_turns
