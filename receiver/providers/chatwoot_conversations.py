"""Chatwoot's conversation events: which ones start or end the bot's silence in a conversation.

A person of the business handles a conversation (an agent assigned to it, or it left `pending`
for `open`): the bot is silent there. It speaks again once the conversation is back with the
bot (`pending`) or was resolved (the customer's next message reopens it). No I/O; the intake
(shared/lua/lib/silence.lua) applies the effect.

What Chatwoot sends (app/listeners/webhook_listener.rb, agent_bot_listener.rb): the body is the
conversation's `push_data` (Conversations::EventDataPresenter: `id` = the conversation's display
id, `inbox_id`, `status`, `meta.assignee` = the assigned user or null, `messages` = its last
message, which carries `account_id`) plus `event` and, for the account webhook's
`conversation_status_changed` and `conversation_updated`, `changed_attributes`: a list of
`{attribute: {"previous_value": ..., "current_value": ...}}`. Account webhooks get
`conversation_created`, `conversation_status_changed`, `conversation_updated`; agent bots get
`conversation_opened` and `conversation_resolved` instead.

Effects (`effect`, `why`):
- status becomes `pending` -> speak (pending); becomes `resolved`, `conversation_resolved` ->
  speak (resolved); `resolved` -> `open` -> speak (reopened);
- `pending` -> `open`, `conversation_opened` -> silence (opened);
- `assignee_id` becomes a user -> silence (assignee); an unassignment changes nothing.
Anything else (labels, a team, priority, `conversation_created`) is valid but not for us.
"""

from __future__ import annotations

import hashlib
from typing import Any

from receiver.providers.chatwoot_fields import chatwoot_id, field, label, timestamp
from shared.chatwoot import CHANNEL, tenant_id
from shared.events import conversation_event

CONVERSATION_EVENTS = frozenset(
    {
        "conversation_created",
        "conversation_status_changed",
        "conversation_updated",
        "conversation_opened",
        "conversation_resolved",
    }
)
Change = tuple[Any, Any]  # (previous value, current value)


def effect_of(payload: dict[str, Any]) -> tuple[str, str] | None:
    """("silence" | "speak", why) of a conversation event, None when it changes neither."""
    name = payload.get("event")
    if name == "conversation_opened":
        return "silence", "opened"
    if name == "conversation_resolved":
        return "speak", "resolved"
    if name == "conversation_created":
        return None
    changes = changed_attributes(payload.get("changed_attributes"))
    if "status" in changes:
        previous, current = changes["status"]
    elif name == "conversation_status_changed":
        previous, current = None, payload.get("status")
    else:
        previous = current = None
    if current == "pending":
        return "speak", "pending"
    if current == "resolved":
        return "speak", "resolved"
    if current == "open" and previous == "resolved":
        return "speak", "reopened"
    if current == "open" and previous == "pending":
        return "silence", "opened"
    if "assignee_id" in changes and changes["assignee_id"][1] is not None:
        return "silence", "assignee"
    return None


def changed_attributes(value: Any) -> dict[str, Change]:
    """Chatwoot's `changed_attributes` (a list of one-key objects; an object is read the same)
    as attribute -> (previous, current); anything unreadable is left out."""
    entries = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
    changes: dict[str, Change] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        for attribute, change in entry.items():
            if isinstance(attribute, str) and isinstance(change, dict):
                changes[attribute] = (change.get("previous_value"), change.get("current_value"))
    return changes


def conversation_change(
    payload: dict[str, Any], body: bytes, received_ms: int
) -> tuple[str, dict[str, Any]] | str:
    """(tenant, conversation event) of a conversation event that starts or ends the silence,
    else why it is not for us; receiver.providers.parsing.Invalid when it matters but cannot be
    routed."""
    name = str(payload.get("event"))
    effect = effect_of(payload)
    if effect is None:
        return f"event {label(name)}"  # e.g. labels, a team, priority: nothing for the bot
    person = chatwoot_id(payload.get("id"), "conversation event without conversation id")
    account = chatwoot_id(_account_of(payload), "conversation event without account id")
    inbox = chatwoot_id(payload.get("inbox_id"), "conversation event without inbox id")
    assignee = field(payload.get("meta"), "assignee")
    name_of_assignee = field(assignee, "name")
    changes = payload.get("changed_attributes")
    raw = {
        "event": name,
        "status": payload.get("status") if isinstance(payload.get("status"), str) else None,
        "changed_attributes": changes if isinstance(changes, list | dict) else None,
        "assignee": {k: assignee.get(k) for k in ("id", "name", "type")}
        if isinstance(assignee, dict)
        else None,
    }
    # One event delivered twice (a retry, Chatwoot's duplicate-event bug) is the same body.
    digest = hashlib.sha1(body, usedforsecurity=False).hexdigest()[:16]
    event = conversation_event(
        channel=CHANNEL,
        person=person,
        event_id=f"{name}:{person}:{digest}",
        type=name,
        effect=effect[0],
        why=effect[1],
        name=name_of_assignee if isinstance(name_of_assignee, str) else "",
        ts=timestamp(payload.get("updated_at") or payload.get("timestamp"), received_ms),
        received_ms=received_ms,
        raw=raw,
    )
    return tenant_id(int(account), int(inbox)), event


def _account_of(payload: dict[str, Any]) -> Any:
    """The account id: a conversation's `push_data` has none of its own, but its last message
    (`messages[0]`) carries `account_id`; `account_id` / `account.id` where a version adds it."""
    for value in (payload.get("account_id"), field(payload.get("account"), "id")):
        if value is not None:
            return value
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if field(message, "account_id") is not None:
                return field(message, "account_id")
    return None


def is_conversation_event(payload: dict[str, Any]) -> bool:
    name = payload.get("event")
    return isinstance(name, str) and name in CONVERSATION_EVENTS
