"""Webhooks as the providers send them: the bodies and the signed headers of Meta's WhatsApp
Cloud API (`X-Hub-Signature-256`) and of Chatwoot (`X-Chatwoot-Signature`).

The one place that spells them for everything that plays a provider: the stand-ins (status
webhooks, `message_created` echoes), `scripts/simulate`, the chaos workload, the fleet
benchmark and the tests (tests/fixtures/ holds real captured bodies of the same shapes).
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

# Meta: the test WhatsApp Business Account, and the number the messages are written to.
WABA_ID = "102200000000001"
DISPLAY_PHONE_NUMBER = "15550001001"
META_USER_AGENT = "facebookexternalua"
CHATWOOT_USER_AGENT = "rest-client/2.1.0 (linux x86_64) ruby/3.3.3p89"

# ---------------------------------------------------------------------- Meta (WhatsApp)


def sign_body(app_secret: str, body: bytes) -> str:
    """The `X-Hub-Signature-256` value Meta sends: `sha256=<hex HMAC-SHA256(secret, body)>`."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def meta_headers(app_secret: str, body: bytes) -> dict[str, str]:
    """The headers of a webhook POST from Meta, signed with `app_secret`."""
    return {
        "Content-Type": "application/json",
        "User-Agent": META_USER_AGENT,
        "X-Hub-Signature-256": sign_body(app_secret, body),
    }


def whatsapp_webhook(
    value: dict[str, Any],
    *,
    phone_number_id: str,
    display_phone_number: str = DISPLAY_PHONE_NUMBER,
    waba_id: str = WABA_ID,
) -> dict[str, Any]:
    """Meta's envelope around one `messages` change to business number `phone_number_id` (our
    tenant); `value` adds `contacts` and `messages`, or `statuses`."""
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": waba_id,
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {
                                "display_phone_number": display_phone_number,
                                "phone_number_id": phone_number_id,
                            },
                            **value,
                        },
                    }
                ],
            }
        ],
    }


def inbound_webhook(
    phone_number_id: str,
    person: str,
    messages: Iterable[dict[str, Any]],
    *,
    name: str = "Ana",
    display_phone_number: str = DISPLAY_PHONE_NUMBER,
    waba_id: str = WABA_ID,
) -> dict[str, Any]:
    """Messages `person` (a wa_id, shown as `name`) wrote to business number `phone_number_id`."""
    return whatsapp_webhook(
        {
            "contacts": [{"profile": {"name": name}, "wa_id": person}],
            "messages": list(messages),
        },
        phone_number_id=phone_number_id,
        display_phone_number=display_phone_number,
        waba_id=waba_id,
    )


def text_message(message_id: str, text: str, person: str, ts: int | None = None) -> dict[str, Any]:
    """One text message of an inbound webhook (`ts`: its Unix time, default now)."""
    return {
        "from": person,
        "id": message_id,
        "timestamp": str(int(time.time()) if ts is None else ts),
        "type": "text",
        "text": {"body": text},
    }


# ---------------------------------------------------------------------- Chatwoot


def sign_chatwoot(secret: str, body: bytes, timestamp: int | str) -> str:
    """The `X-Chatwoot-Signature` value: `sha256=<hex HMAC-SHA256(secret, "{ts}.{body}")>`."""
    signed = f"{timestamp}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def chatwoot_headers(
    body: bytes,
    secret: str | None = None,
    *,
    timestamp: int | None = None,
    delivery: str | None = None,
) -> dict[str, str]:
    """The headers Chatwoot sends with a webhook: signed when `secret` is given."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": CHATWOOT_USER_AGENT,
        "X-Chatwoot-Delivery": delivery or str(uuid.uuid4()),
    }
    if secret is not None:
        stamp = int(time.time()) if timestamp is None else timestamp
        headers["X-Chatwoot-Timestamp"] = str(stamp)
        headers["X-Chatwoot-Signature"] = sign_chatwoot(secret, body, stamp)
    return headers


def message_created(
    *,
    message_id: int,
    content: str | None,
    conversation: int,
    account: int = 1,
    inbox: int = 3,
    message_type: str = "incoming",
    private: bool = False,
    created_at: float | None = None,
    sender_name: str = "Ana Pérez",
    attachments: list[dict[str, Any]] | None = None,
    status: str = "pending",
    sender: dict[str, Any] | None = None,
    assignee: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `message_created` webhook body as Chatwoot shapes it (see the fixtures). `sender`
    replaces the default one (the contact for an incoming message, the agent bot otherwise):
    an agent's message is `{"id": .., "name": .., "type": "user"}`. `assignee`: the
    conversation's assigned user (`conversation.meta.assignee`), as `agent_user` builds it."""
    when = time.time() if created_at is None else created_at
    incoming = message_type == "incoming"
    body: dict[str, Any] = {
        "event": "message_created",
        "id": message_id,
        "content": content,
        "created_at": datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds"),
        "message_type": message_type,
        "content_type": "text",
        "content_attributes": {},
        "private": private,
        "source_id": f"wamid.CW{message_id}" if incoming else None,
        "sender": sender
        or {
            "id": 7 if incoming else 1,
            "name": sender_name if incoming else "Bot",
            "type": "contact" if incoming else "agent_bot",
        },
        "inbox": {"id": inbox, "name": "WhatsApp ventas"},
        "account": {"id": account, "name": "Turnos SRL"},
        "conversation": {
            "id": conversation,
            "inbox_id": inbox,
            "channel": "Channel::Whatsapp",
            "status": status,
            "can_reply": True,
            "meta": {"sender": _contact(sender_name), "assignee": assignee},
        },
    }
    if attachments:
        body["attachments"] = attachments
    return body


def agent_user(agent_id: int, name: str) -> dict[str, Any]:
    """An agent as Chatwoot shows one (`User#push_event_data`): a message's `sender`, a
    conversation's `meta.assignee`."""
    return {
        "id": agent_id,
        "name": name,
        "available_name": name.split()[0] if name.split() else name,
        "avatar_url": "",
        "type": "user",
        "availability_status": "online",
        "thumbnail": "",
    }


def conversation_webhook(
    event: str,
    *,
    conversation: int,
    account: int = 1,
    inbox: int = 3,
    status: str = "open",
    assignee: dict[str, Any] | None = None,
    changed_attributes: dict[str, tuple[Any, Any]] | None = None,
    at: float | None = None,
) -> dict[str, Any]:
    """A conversation event as Chatwoot sends it (app/listeners/webhook_listener.rb and
    agent_bot_listener.rb): the conversation's `push_data` (`id`, `inbox_id`, `status`,
    `meta.assignee`, its last message in `messages`, which carries `account_id`) with `event`
    and, where given, `changed_attributes` (attribute -> (previous, current)) written as
    Chatwoot writes them: `[{attribute: {"previous_value", "current_value"}}]`. See
    tests/fixtures/chatwoot/conversation_*.json."""
    when = time.time() if at is None else at
    body: dict[str, Any] = {
        "additional_attributes": {},
        "can_reply": True,
        "channel": "Channel::Whatsapp",
        "id": conversation,
        "inbox_id": inbox,
        "messages": [
            {
                "id": 1,
                "account_id": account,
                "inbox_id": inbox,
                "conversation_id": conversation,
                "message_type": 0,
                "content": "",
                "created_at": int(when),
                "private": False,
                "sender_type": "Contact",
                "sender_id": 7,
            }
        ],
        "labels": [],
        "meta": {"sender": _contact("Ana Pérez"), "assignee": assignee, "team": None},
        "status": status,
        "custom_attributes": {},
        "snoozed_until": None,
        "unread_count": 0,
        "priority": None,
        "agent_last_seen_at": int(when),
        "contact_last_seen_at": 0,
        "last_activity_at": int(when),
        "timestamp": int(when),
        "created_at": int(when),
        "updated_at": when,
        "event": event,
    }
    if changed_attributes is not None:
        body["changed_attributes"] = [
            {name: {"previous_value": before, "current_value": after}}
            for name, (before, after) in changed_attributes.items()
        ]
    return body


def _contact(name: str) -> dict[str, Any]:
    return {"id": 7, "name": name, "phone_number": "+5491155550001", "type": "contact"}
