"""The environment of test worker processes: none of a developer's own settings leak in.

`_CONTRACT_VARS` (what `WorkerFleet` strips) is derived from `shared.settings.env_names()`,
the variables `Settings.from_env` actually reads, so a new setting is stripped without a list
to keep in step."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from shared.settings import env_names
from tests.worker.support import _CONTRACT_VARS, REPO, WorkerFleet

# A sample of every group of settings, the Chatwoot ones included.
EXPECTED = {
    "REDIS_URL",
    "REDIS_CLUSTER",
    "KEY_PREFIX",
    "WHATSAPP_ACCESS_TOKEN",
    "WHATSAPP_API_BASE_URL",
    "CHATWOOT_BASE_URL",
    "CHATWOOT_API_ACCESS_TOKEN",
    "CHATWOOT_WEBHOOK_SECRET",
    "CHATWOOT_WEBHOOK_TOKEN",
    "CHATWOOT_ONLY_PENDING",
    "AI_TIMEOUT_S",
    "MEMORY_TURNS",
    "LOG_FORMAT",
    "DEDUPE_TTL_S",
    "POLL_INTERVAL_S",
}


def test_env_names_are_the_variables_settings_reads() -> None:
    names = env_names()
    assert names >= EXPECTED
    assert all(name.isupper() and " " not in name for name in names)


def test_every_setting_has_a_row_in_the_configuration_page() -> None:
    page = REPO / "docs" / "configuration.md"
    rows = [line for line in page.read_text().splitlines() if line[:3] == "| `"]
    missing = sorted(n for n in env_names() if not any(f"`{n}`" in row for row in rows))
    assert missing == []


def test_worker_processes_get_none_of_the_developers_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in env_names() | {"ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"}:
        monkeypatch.setenv(name, "from-the-developer")
    monkeypatch.setenv("UNRELATED_VARIABLE", "kept")
    env = WorkerFleet(Redis(), "redis://127.0.0.1:1/0", "wtenv", tmp_path).env()
    assert sorted(k for k, v in env.items() if v == "from-the-developer") == []
    assert env["UNRELATED_VARIABLE"] == "kept"
    assert set(_CONTRACT_VARS) >= env_names()
