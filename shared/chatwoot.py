"""Chatwoot naming both sides agree on: the channel name and how a tenant id is spelled.

A Chatwoot tenant is one inbox of one account: `cw-<account id>-<inbox id>`, e.g. `cw-1-3`.
The `cw-` prefix keeps it apart from WhatsApp's numeric phone_number_ids, and it holds no
braces, so it is a valid Redis Cluster hash tag. The person is the conversation id.
"""

from __future__ import annotations

import re

CHANNEL = "chatwoot"
TENANT_PREFIX = "cw-"
_TENANT_RE = re.compile(r"cw-([0-9]{1,16})-([0-9]{1,16})")  # ASCII digits: `\d` is Unicode


def tenant_id(account_id: int, inbox_id: int) -> str:
    return f"{TENANT_PREFIX}{account_id}-{inbox_id}"


def account_of(tenant: str) -> str:
    """The account id of a Chatwoot tenant id; ValueError if it is not one."""
    match = _TENANT_RE.fullmatch(tenant)
    if match is None:
        raise ValueError(f"{tenant!r} is not a Chatwoot tenant id (cw-<account>-<inbox>)")
    return match.group(1)
