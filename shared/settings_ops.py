"""Settings of the people who work beside the bot: the ops page, retention of what they see.

A group of its own (composed into `Settings` like those of shared/settings_fields.py), so the
ops page and the human takeover grow here without crowding the pipeline's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.setting_spec import setting

_DAY_S = 86400.0


@dataclass(frozen=True)
class OpsSettings:
    """The ops page (docs/operating.md#the-ops-page) and how long review items and its audit
    log are kept."""

    ops_token: str = setting(
        "OPS_TOKEN",
        "",
        "the token that signs in to the ops page under `/ops` (unset: `/ops` is 404)",
        secret=True,
    )
    ops_session_s: float = setting(
        "OPS_SESSION_S",
        12 * 3600.0,
        "how long a sign-in to the ops page lasts (changing `OPS_TOKEN` ends every sign-in)",
        above=0,
    )
    review_retention_s: float = setting(
        "REVIEW_RETENTION_S",
        30 * _DAY_S,
        "review items and ops audit entries older than this are deleted",
        above=0,
    )
