"""A message read from Chatwoot's API, turned into the inbox event its webhook would have made.

The catch-up (worker/fleet/chatwoot_catchup.py) reads messages through `GET .../messages`, whose
shape differs from a `message_created` webhook's: `message_type` is the enum's number (0
incoming, 1 outgoing, 2 activity, 3 template), `created_at` unix seconds, and the message knows
its conversation only by id. `webhook_body` rebuilds the webhook's body from the message and
the conversation it was listed with, and `parse_message` runs it through the webhook's own
parser (receiver/providers/chatwoot.py `parse_body`): one classification (customer's message,
agent's message, private note, the bot's own, activity) and one event shape, which cannot
drift apart. The dedupe id is the same (`chatwoot:<message id>`), so whichever of the webhook
and the catch-up comes second is a duplicate. No I/O here.
"""

from __future__ import annotations

from typing import Any

import orjson

from receiver.providers.chatwoot import parse_body
from receiver.providers.parsing import Parsed

# Chatwoot's `message_type` enum, as the webhook names it.
MESSAGE_TYPES = {0: "incoming", 1: "outgoing", 2: "activity", 3: "template"}


def webhook_body(
    message: dict[str, Any], conversation: dict[str, Any], account: int
) -> dict[str, Any]:
    """The `message_created` body Chatwoot would have posted for `message` (as the API
    answered it) of `conversation` (as the conversation list answered it)."""
    body = {k: v for k, v in message.items() if k not in ("conversation_id", "inbox_id")}
    body["event"] = "message_created"
    kind = message.get("message_type")
    body["message_type"] = MESSAGE_TYPES.get(kind, kind) if isinstance(kind, int) else kind
    inbox = message.get("inbox_id", conversation.get("inbox_id"))
    body["inbox"] = {"id": inbox}
    body["account"] = {"id": account}
    given = conversation.get("meta")
    meta: dict[str, Any] = given if isinstance(given, dict) else {}
    body["conversation"] = {
        "id": message.get("conversation_id", conversation.get("id")),
        "inbox_id": inbox,
        "status": conversation.get("status"),
        "meta": {"sender": meta.get("sender"), "assignee": meta.get("assignee")},
    }
    return body


def parse_message(
    message: dict[str, Any],
    conversation: dict[str, Any],
    account: int,
    received_ms: int,
    only_pending: bool = False,
) -> Parsed:
    """What the webhook of `message` would have stored: one event, or none (ignored)."""
    body = orjson.dumps(webhook_body(message, conversation, account))
    return parse_body(body, received_ms, "", only_pending)
