"""What the Chatwoot stand-in keeps of its conversations and messages, shaped as Chatwoot's API
answers them (the catch-up reads it: worker/fleet/chatwoot_catchup.py).

As Chatwoot does (app/finders/conversation_finder.rb, message_finder.rb, the jbuilder views of
`api/v1/accounts/conversations`):

- `GET /api/v1/accounts/{a}/conversations?status=all&inbox_id=&page=&sort_by=`: 25 a page,
  newest `last_activity_at` first (Chatwoot's default order, and `last_activity_at_desc`;
  `last_activity_at_asc` the other way), only `status` (default `open`; `all`: every one) and
  `inbox_id` when given. Answer `{"data": {"meta": {"all_count": ..}, "payload": [..]}}`, each
  conversation with `id`, `inbox_id`, `account_id`, `status`, `timestamp` and
  `last_activity_at` (unix s), `created_at`, `meta.sender` (the contact), `meta.assignee`.
- `GET .../conversations/{c}/messages`: the newest 20, oldest first; `before=<id>`: the 20
  before that id, oldest first; `after=<id>`: up to 100 after it, oldest first; both: those
  between (up to 1000). Answer `{"meta": {..}, "payload": [..]}`, each message as
  `api/v1/models/_message`: `id`, `content`, `inbox_id`, `conversation_id`, `message_type`
  (0 incoming, 1 outgoing, 2 activity, 3 template), `content_type`, `content_attributes`,
  `created_at` (unix s), `private`, `source_id`, `sender` (with `type`: contact, user,
  agent_bot), `attachments` (only when there are any).

Ids are the stand-in's one counter, so they grow with time as Chatwoot's do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

PAGE_SIZE = 25  # Kaminari's default, which Chatwoot's conversation list uses
MESSAGES_BEFORE = 20
MESSAGES_AFTER = 100
MESSAGES_BETWEEN = 1000
INCOMING, OUTGOING, ACTIVITY, TEMPLATE = 0, 1, 2, 3


def contact(name: str = "Ana Pérez", contact_id: int = 7) -> dict[str, Any]:
    """A contact as a message's `sender` (`Contact#push_event_data`)."""
    return {
        "id": contact_id,
        "name": name,
        "phone_number": "+5491155550000",
        "thumbnail": "",
        "type": "contact",
    }


@dataclass
class Conversation:
    account: int
    id: int
    inbox_id: int
    created_at: float
    last_activity_at: float
    contact: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)


class ChatwootHistory:
    """Conversations and their messages, by (account, conversation id). Not thread-safe on its
    own: the stand-in calls it under its lock."""

    def __init__(self) -> None:
        self.conversations: dict[tuple[int, int], Conversation] = {}

    def clear(self) -> None:
        self.conversations.clear()

    def conversation(
        self, account: int, conversation: int, inbox_id: int, now: float | None = None
    ) -> Conversation:
        """The conversation, created (as of `now`) when new."""
        key = (account, conversation)
        found = self.conversations.get(key)
        if found is None:
            when = time.time() if now is None else now
            found = self.conversations[key] = Conversation(
                account, conversation, inbox_id, when, when, contact()
            )
        return found

    def add(
        self,
        account: int,
        conversation: int,
        inbox_id: int,
        *,
        message_id: int,
        content: str | None,
        message_type: int,
        sender: dict[str, Any] | None,
        private: bool = False,
        created_at: float | None = None,
        attachments: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Keep one message (API-shaped) and move the conversation's last activity to it."""
        when = time.time() if created_at is None else created_at
        kept = self.conversation(account, conversation, inbox_id, when)
        message: dict[str, Any] = {
            "id": message_id,
            "content": content,
            "inbox_id": kept.inbox_id,
            "conversation_id": conversation,
            "message_type": message_type,
            "content_type": "text",
            "status": "sent",
            "content_attributes": {},
            "created_at": int(when),
            "private": private,
            "source_id": f"wamid.CW{message_id}" if message_type == INCOMING else None,
        }
        if sender is not None:
            message["sender"] = sender
        if attachments:
            message["attachments"] = [
                {"id": message_id * 10 + i, "message_id": message_id, **a}
                for i, a in enumerate(attachments)
            ]
        kept.messages.append(message)
        kept.messages.sort(key=lambda m: m["id"])
        # Chatwoot moves `last_activity_at` on every message but activity ones.
        if message_type != ACTIVITY:
            kept.last_activity_at = max(kept.last_activity_at, when)
        return message

    def messages_of(self, account: int, conversation: int) -> list[dict[str, Any]]:
        kept = self.conversations.get((account, conversation))
        return list(kept.messages) if kept else []

    # ------------------------------------------------------------------ the API's answers

    def conversation_list(self, account: int, params: dict[str, str], state: Any) -> dict[str, Any]:
        """`GET conversations`; `state(account, conversation)` gives `status` and
        `assignee` as the stand-in has them."""
        status = params.get("status", "open")
        inbox = params.get("inbox_id")
        chosen = []
        for kept in self.conversations.values():
            if kept.account != account:
                continue
            if inbox and str(kept.inbox_id) != inbox:
                continue
            now = state(account, kept.id)
            if status != "all" and now["status"] != status:
                continue
            chosen.append((kept, now))
        ascending = params.get("sort_by") == "last_activity_at_asc"
        chosen.sort(key=lambda pair: (pair[0].last_activity_at, pair[0].id), reverse=not ascending)
        page = max(1, int(params.get("page") or 1))
        shown = chosen[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        return {
            "data": {
                "meta": {"all_count": len(chosen)},
                "payload": [self._conversation_json(kept, now) for kept, now in shown],
            }
        }

    def message_list(self, account: int, conversation: int, params: dict[str, str]) -> Any:
        """`GET messages` (None: no such conversation, 404)."""
        kept = self.conversations.get((account, conversation))
        if kept is None:
            return None
        messages = kept.messages
        after, before = params.get("after"), params.get("before")
        if after and before:
            shown = [m for m in messages if int(after) <= m["id"] < int(before)]
            shown = shown[:MESSAGES_BETWEEN]
        elif before:
            shown = [m for m in messages if m["id"] < int(before)][-MESSAGES_BEFORE:]
        elif after:
            shown = [m for m in messages if m["id"] > int(after)][:MESSAGES_AFTER]
        else:
            shown = messages[-MESSAGES_BEFORE:]
        return {
            "meta": {"labels": [], "contact": kept.contact, "additional_attributes": {}},
            "payload": shown,
        }

    @staticmethod
    def _conversation_json(kept: Conversation, now: dict[str, Any]) -> dict[str, Any]:
        last = int(kept.last_activity_at)
        return {
            "id": kept.id,
            "account_id": kept.account,
            "inbox_id": kept.inbox_id,
            "status": now["status"],
            "timestamp": last,
            "last_activity_at": last,
            "created_at": int(kept.created_at),
            "can_reply": True,
            "meta": {
                "sender": kept.contact,
                "assignee": now["assignee"],
                "channel": "Channel::Whatsapp",
            },
            "messages": kept.messages[-1:],
        }
