"""How the review pages name tenants and people, and say when, for a person reading them.

A review item keeps the customer's messages as the webhook gave them (shared/events.py): each
with `received_ms` (our clock) and `ts` (the provider's, unix seconds), and `name` (the
contact's profile name) when the provider sent one. From those: how long the customer has
waited (since the first of them, not since the item was parked), and who they are. Times are
shown in the tenant's time zone (its `timezone` setting), as the thread shows them
(shared/ops/thread.py `local`). Pure functions of what the page already read: no Redis.
"""

from __future__ import annotations

import re
from typing import Any

from shared.chatwoot import TENANT_PREFIX
from shared.events import received_ms
from shared.ops.thread import int_of, local, str_of

_CHATWOOT = re.compile(r"cw-([0-9]{1,16})-([0-9]{1,16})")  # shared/chatwoot.py's spelling


def is_chatwoot(tenant: Any) -> bool:
    """A Chatwoot inbox (no 24-hour window, no WhatsApp formatting), not a WhatsApp number."""
    return str_of(tenant).startswith(TENANT_PREFIX)


def tenant_label(tenant: Any) -> str:
    """`Chatwoot inbox 3 (account 1)` for `cw-1-3`; `WhatsApp <phone_number_id>` otherwise."""
    tenant = str_of(tenant)
    found = _CHATWOOT.fullmatch(tenant)
    if found:
        return f"Chatwoot inbox {found.group(2)} (account {found.group(1)})"
    return f"WhatsApp {tenant}" if tenant else ""


def _messages(item: Any) -> list[dict[str, Any]]:
    messages = item.get("messages") if isinstance(item, dict) else None
    return [m for m in messages or [] if isinstance(m, dict)]


def message_ms(message: dict[str, Any]) -> int:
    """When the message reached us (`received_ms`), else the provider's `ts`; 0 if unknown."""
    return received_ms(message) or int_of(message.get("ts")) * 1000


def first_message_ms(item: Any) -> int:
    """When the first of the item's messages came: since then the customer has waited."""
    times = [t for t in (message_ms(m) for m in _messages(item)) if t > 0]
    return min(times) if times else 0


def contact_name(item: Any) -> str:
    """The contact's name the item's messages carry (the newest given), or ""."""
    names = [str_of(m.get("name")).strip() for m in _messages(item)]
    names = [n for n in names if n]
    return names[-1] if names else ""


def local_time(at_ms: Any, zone: str) -> str:
    """`2026-12-03 12:04 (America/Argentina/Buenos_Aires)`; "?" when unknown."""
    shown = local(int_of(at_ms), zone)
    return f"{shown} ({zone})" if shown else "?"
