"""Chatwoot webhooks: authenticated, and their bodies turned into inbox events (messages, agents'
messages, conversation events).

`ChatwootInbound` is the receiver's half of the Chatwoot provider (see receiver/providers/base.py),
serving `POST /webhooks/chatwoot` for an account webhook or an agent bot. No I/O here.

Authentication (invariant 8: never accept unauthenticated traffic):
- `CHATWOOT_WEBHOOK_SECRET` set and the request signed: `X-Chatwoot-Signature:
  sha256=<hex HMAC-SHA256(secret, "{X-Chatwoot-Timestamp}.{raw body}")>`, compared in constant
  time on the raw bytes, with a timestamp at most 5 minutes off (a replayed request is stale).
- otherwise `CHATWOOT_WEBHOOK_TOKEN`: older Chatwoot versions and agent bots do not sign, so
  the URL carries a shared token (`/webhooks/chatwoot?token=...`), compared in constant time.
- neither configured: every request is refused (403), as WhatsApp's route without a secret.
Missing credentials answer 401, wrong or stale ones 403.

What is stored:
- `message_created` that is `incoming` and not private: a customer's message (kind "message").
- `message_created` that is `outgoing`, not private, sent by a `user`: an agent's message (kind
  "human"): it enters the memory and silences the bot in that conversation. The bot's own
  replies come back the same way when its token is a user's; the intake knows them by their
  recorded ids (shared/lua/lib/silence.lua). Sent with an agent bot's token they say
  `agent_bot` and are ignored here.
- the conversation events that start or end the bot's silence (kind "conversation",
  receiver/providers/chatwoot_conversations.py).
Templates, private notes, activity messages and every other event are valid but not for us:
reported in `ignored_fields`, never stored, never dead-lettered. With
`CHATWOOT_ONLY_PENDING=true` only customers' messages of conversations in status `pending`
(Chatwoot's "with the bot" state) are taken in, so one handed over to a person (`open`) gets
no more bot replies (and its messages do not reach the memory).

Identity: tenant = the inbox of an account (`cw-<account>-<inbox>`, shared/chatwoot.py),
person = the conversation id, message id = Chatwoot's message id, which is also the dedupe key:
a webhook re-sent (Chatwoot retries with the same `X-Chatwoot-Delivery`) or duplicated (a known
Chatwoot bug: a new delivery id, the same message) is the same message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs

import orjson

from receiver.providers.base import WebhookRequest
from receiver.providers.chatwoot_conversations import conversation_change, is_conversation_event
from receiver.providers.chatwoot_fields import chatwoot_id, field, label, timestamp
from receiver.providers.parsing import Invalid, Parsed
from receiver.providers.signature import BadSignature, MissingSignature, token_matches
from shared.chatwoot import CHANNEL, tenant_id
from shared.events import message_event

SIGNATURE = b"x-chatwoot-signature"
TIMESTAMP = b"x-chatwoot-timestamp"
DELIVERY = b"x-chatwoot-delivery"
PREFIX = "sha256="
MAX_SKEW_S = 300  # a signed request more than 5 minutes off is a replay (or a broken clock)

# Chatwoot's attachment file types, as the inbox event's `type` (WhatsApp's names where equal).
ATTACHMENT_TYPES = {"file": "document", "contact": "contacts"}


class ChatwootInbound:
    """Verifies and parses `POST /webhooks/chatwoot`."""

    channel = CHANNEL
    path = "/webhooks/chatwoot"
    header_names = frozenset({SIGNATURE, TIMESTAMP, DELIVERY})
    # Agent bots retry a 429 or a 500 (three times, 3 s apart), never a 503; account webhooks
    # retry nothing (docs/providers/chatwoot.md).
    unavailable_status = 500

    def __init__(
        self,
        secrets: Iterable[str],
        tokens: Iterable[str],
        *,
        only_pending: bool = False,
        max_skew_s: float = MAX_SKEW_S,
    ) -> None:
        self._keys = tuple(s.encode() for s in secrets if s)
        self._tokens = tuple(t for t in tokens if t)
        self._only_pending = only_pending
        self._max_skew_s = max_skew_s
        # Read on every request: a plain attribute, not a property (the secrets never change).
        self.configured = bool(self._keys or self._tokens)

    def verify(self, request: WebhookRequest, now_s: float) -> None:
        """Return when the request is signed or carries the token, else raise why not."""
        if not self.configured:
            raise BadSignature("no Chatwoot webhook secret or token configured")
        signature = request.header(SIGNATURE)
        if self._keys and signature is not None:
            self._check_signature(request, signature, now_s)
        elif self._tokens:
            self._check_token(request.query_string)
        else:
            raise MissingSignature("no X-Chatwoot-Signature header")

    def _check_signature(self, request: WebhookRequest, signature: str, now_s: float) -> None:
        stamp = request.header(TIMESTAMP)
        if stamp is None:
            raise MissingSignature("no X-Chatwoot-Timestamp header")
        try:
            if len(stamp) > 20:  # no clock needs more digits; a huge int cannot be a float
                raise ValueError
            sent_s = int(stamp.strip())
        except ValueError:
            raise BadSignature("malformed X-Chatwoot-Timestamp header") from None
        if abs(now_s - sent_s) > self._max_skew_s:
            raise BadSignature("stale X-Chatwoot-Timestamp (more than 5 minutes off)")
        if not signature.startswith(PREFIX):
            raise BadSignature("malformed X-Chatwoot-Signature header")
        given = signature[len(PREFIX) :].strip().lower().encode("utf-8", "surrogatepass")
        signed = stamp.strip().encode("latin-1") + b"." + request.body
        matched = False
        for key in self._keys:  # no early exit: the time spent does not tell which one matched
            expected = hmac.new(key, signed, hashlib.sha256).hexdigest().encode()
            matched |= hmac.compare_digest(expected, given)
        if not matched:
            raise BadSignature("signature does not match")

    def _check_token(self, query_string: bytes) -> None:
        given = parse_qs(query_string.decode("latin-1")).get("token")
        if not given:
            raise MissingSignature("no token in the webhook URL")
        matched = False
        for token in self._tokens:
            matched |= token_matches(given[0], token)
        if not matched:
            raise BadSignature("token does not match")

    def parse(self, request: WebhookRequest, received_ms: int) -> Parsed:
        return parse_body(
            request.body, received_ms, request.header(DELIVERY) or "", self._only_pending
        )


def parse_body(
    body: bytes, received_ms: int, delivery: str = "", only_pending: bool = False
) -> Parsed:
    """The inbox event of a body: a customer's or an agent's `message_created`, or a
    conversation event that starts or ends the bot's silence; anything else is ignored."""
    parsed = Parsed()
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed.problems.append("body is not JSON")
        return parsed
    if not isinstance(payload, dict):
        parsed.problems.append("body is not an object")
        return parsed
    try:
        if is_conversation_event(payload):
            change = conversation_change(payload, body, received_ms)
            if isinstance(change, str):
                parsed.ignored_fields.append(change)
            else:
                parsed.add(*change)
            return parsed
        kind = "human" if is_agent_message(payload) else "message"
        ignored = "" if kind == "human" else ignored_because(payload, only_pending)
        if ignored:
            parsed.ignored_fields.append(ignored)
            return parsed
        parsed.add(*message_from(payload, received_ms, delivery, kind))
    except Invalid as exc:
        parsed.problems.append(str(exc))
    return parsed


def is_agent_message(payload: dict[str, Any]) -> bool:
    """A public message a user (an agent, or the bot posting with a user's token) wrote to the
    customer. Chatwoot names the sender's kind: `user`, `agent_bot`, `contact`; automations
    and campaigns have none."""
    return (
        payload.get("event") == "message_created"
        and payload.get("message_type") in ("outgoing", 1)
        and not payload.get("private")
        and field(payload.get("sender"), "type") == "user"
    )


def ignored_because(payload: dict[str, Any], only_pending: bool = False) -> str:
    """Why a valid webhook is not a customer's message for the bot ("" when it is one)."""
    event = payload.get("event")
    if event != "message_created":
        return f"event {label(event)}"
    kind = payload.get("message_type")
    if kind not in ("incoming", 0):  # 0 is "incoming" where Chatwoot sends the enum's index
        return f"message_type {label(kind)}"
    if payload.get("private"):
        return "private note"
    if only_pending:
        status = field(payload.get("conversation"), "status")
        if status != "pending":
            return f"conversation status {label(status)}"
    return ""


def message_from(
    payload: dict[str, Any], received_ms: int, delivery: str = "", event_kind: str = "message"
) -> tuple[str, dict[str, Any]]:
    """(tenant, inbox event) of one message: a customer's ("message") or an agent's ("human")."""
    message_id = chatwoot_id(payload.get("id"), "message without id")
    conversation = _dict(payload.get("conversation"), "message without conversation")
    account = chatwoot_id(field(payload.get("account"), "id"), "message without account id")
    inbox = field(payload.get("inbox"), "id")
    if inbox is None:
        inbox = conversation.get("inbox_id")
    inbox_id = chatwoot_id(inbox, "message without inbox id")
    person = chatwoot_id(conversation.get("id"), "message without conversation id")
    attributes = payload.get("content_attributes")
    reply_to = field(attributes, "in_reply_to")
    raw = {k: v for k, v in payload.items() if k != "conversation"}
    raw["conversation_id"] = int(person)
    status = conversation.get("status")
    if isinstance(status, str):
        # A customer's message while the conversation is `pending` and nobody's (with the bot
        # again) ends the bot's silence there (shared/lua/lib/silence.lua).
        raw["conversation_status"] = status[:20]
        raw["conversation_assigned"] = (
            field(field(conversation.get("meta"), "assignee"), "id") is not None
        )
    if delivery:
        raw["delivery"] = delivery
    kind, text = describe(payload)
    sender_name = field(payload.get("sender"), "name")
    event = message_event(
        channel=CHANNEL,
        person=person,
        message_id=message_id,
        type=kind,
        text=text,
        ts=timestamp(payload.get("created_at"), received_ms),
        received_ms=received_ms,
        raw=raw,
        name=sender_name if isinstance(sender_name, str) else "",
        context=str(reply_to) if isinstance(reply_to, int | str) and reply_to != "" else "",
        kind=event_kind,
    )
    return tenant_id(int(account), int(inbox_id)), event


def describe(payload: dict[str, Any]) -> tuple[str, str]:
    """(type, text): the content for text; attachments bracketed like WhatsApp's media,
    the content as the first one's caption: `[image: así está la canilla]`."""
    content = payload.get("content")
    text = content if isinstance(content, str) else ""
    listed = payload.get("attachments")
    attachments = [a for a in listed if isinstance(a, dict)] if isinstance(listed, list) else []
    if not attachments:
        return "text", text
    kinds = [_attachment_type(a) for a in attachments]
    first = f"[{kinds[0]}: {text}]" if text else f"[{kinds[0]}]"
    return kinds[0], " ".join([first, *(f"[{k}]" for k in kinds[1:])])


def _attachment_type(attachment: dict[str, Any]) -> str:
    kind = attachment.get("file_type")
    if not isinstance(kind, str) or not kind:
        return "attachment"
    return ATTACHMENT_TYPES.get(kind, kind)


def _dict(value: Any, problem: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(problem)
    return value
