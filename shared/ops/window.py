"""The 24-hour window of people, as the ops page shows it: the provider ts of each one's
latest message while the window is open, read from the tenant's book of windows by
`lastin_get.lua` (shared/lua/lib/lastin.lua; the key each of the release before is read too).
"""

from __future__ import annotations

from typing import Any

from shared.conversation.batch import SERVICE_WINDOW_S
from shared.keys import TenantKeys
from shared.storage.scripts import Scripts, shared_scripts


async def last_inbound(
    redis: Any, k: TenantKeys, people: list[str], scripts: Scripts | None = None
) -> list[tuple[int, int]]:
    """Each person's (latest message's provider ts in unix s, seconds until the window
    closes) while their window is open, else (0, 0), in the order given."""
    if not people:
        return []
    script = (scripts or shared_scripts()).lastin_get
    found = await script(redis, k, people=people, service_window_s=SERVICE_WINDOW_S)
    return [(int(ts or 0), int(left or 0)) for ts, left in found]
