"""Chatwoot webhooks: authenticated, and `message_created` bodies turned into inbox events.

`ChatwootInbound` is the receiver's half of the Chatwoot provider (see shared/provider.py),
serving `POST /webhooks/chatwoot` for an account webhook or an agent bot. No I/O here.

Authentication (invariant 8: never accept unauthenticated traffic):
- `CHATWOOT_WEBHOOK_SECRET` set and the request signed: `X-Chatwoot-Signature:
  sha256=<hex HMAC-SHA256(secret, "{X-Chatwoot-Timestamp}.{raw body}")>`, compared in constant
  time on the raw bytes, with a timestamp at most 5 minutes off (a replayed request is stale).
- otherwise `CHATWOOT_WEBHOOK_TOKEN`: older Chatwoot versions and agent bots do not sign, so
  the URL carries a shared token (`/webhooks/chatwoot?token=...`), compared in constant time.
- neither configured: every request is refused (403), as WhatsApp's route without a secret.
Missing credentials answer 401, wrong or stale ones 403.

What is stored: only `message_created` events that are `incoming` and not private. The bot's
own replies, agents' messages, templates and private notes come back as `message_created`
too, and every other event (conversation_status_changed, ...) is valid but not for us: all of
them are reported in `ignored_fields`, never stored, never dead-lettered. With
`CHATWOOT_ONLY_PENDING=true` only conversations in status `pending` (Chatwoot's "with the
bot" state) are answered, so one handed over to a person (`open`) gets no more bot replies.

Identity: tenant = the inbox of an account (`cw-<account>-<inbox>`, shared/chatwoot.py),
person = the conversation id, message id = Chatwoot's message id, which is also the dedupe key:
a webhook re-sent (Chatwoot retries with the same `X-Chatwoot-Delivery`) or duplicated (a known
Chatwoot bug: a new delivery id, the same message) is the same message.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import orjson

from receiver.parsing import Invalid, Parsed
from receiver.signature import BadSignature, MissingSignature, token_matches
from shared.chatwoot import CHANNEL, tenant_id
from shared.events import message_event
from shared.provider import WebhookRequest

SIGNATURE = b"x-chatwoot-signature"
TIMESTAMP = b"x-chatwoot-timestamp"
DELIVERY = b"x-chatwoot-delivery"
PREFIX = "sha256="
MAX_SKEW_S = 300  # a signed request more than 5 minutes off is a replay (or a broken clock)
MAX_TS = 2**53

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

    @property
    def configured(self) -> bool:
        return bool(self._keys or self._tokens)

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
    """The inbox event of an incoming `message_created` body; anything else is ignored."""
    parsed = Parsed()
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed.problems.append("body is not JSON")
        return parsed
    if not isinstance(payload, dict):
        parsed.problems.append("body is not an object")
        return parsed
    ignored = ignored_because(payload, only_pending)
    if ignored:
        parsed.ignored_fields.append(ignored)
        return parsed
    try:
        tenant, event = message_from(payload, received_ms, delivery)
        parsed.add(tenant, event)
    except Invalid as exc:
        parsed.problems.append(str(exc))
    return parsed


def ignored_because(payload: dict[str, Any], only_pending: bool = False) -> str:
    """Why a valid webhook is not a customer's message for the bot ("" when it is one)."""
    event = payload.get("event")
    if event != "message_created":
        return f"event {_label(event)}"
    kind = payload.get("message_type")
    if kind not in ("incoming", 0):  # 0 is "incoming" where Chatwoot sends the enum's index
        return f"message_type {_label(kind)}"
    if payload.get("private"):
        return "private note"
    if only_pending:
        status = _get(payload.get("conversation"), "status")
        if status != "pending":
            return f"conversation status {_label(status)}"
    return ""


def message_from(
    payload: dict[str, Any], received_ms: int, delivery: str = ""
) -> tuple[str, dict[str, Any]]:
    """(tenant, inbox event) of one incoming message."""
    message_id = _id(payload.get("id"), "message without id")
    conversation = _dict(payload.get("conversation"), "message without conversation")
    account = _id(_get(payload.get("account"), "id"), "message without account id")
    inbox = _get(payload.get("inbox"), "id")
    if inbox is None:
        inbox = conversation.get("inbox_id")
    inbox_id = _id(inbox, "message without inbox id")
    person = _id(conversation.get("id"), "message without conversation id")
    attributes = payload.get("content_attributes")
    reply_to = _get(attributes, "in_reply_to")
    raw = {k: v for k, v in payload.items() if k != "conversation"}
    raw["conversation_id"] = int(person)
    if delivery:
        raw["delivery"] = delivery
    kind, text = describe(payload)
    sender_name = _get(payload.get("sender"), "name")
    event = message_event(
        channel=CHANNEL,
        tenant=tenant_id(int(account), int(inbox_id)),
        person=person,
        message_id=message_id,
        type=kind,
        text=text,
        ts=timestamp(payload.get("created_at"), received_ms),
        received_ms=received_ms,
        raw=raw,
        name=sender_name if isinstance(sender_name, str) else "",
        context=str(reply_to) if isinstance(reply_to, int | str) and reply_to != "" else "",
    )
    return event["tenant"], event


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


def timestamp(value: Any, received_ms: int) -> int:
    """Unix seconds of `created_at` (ISO 8601 or a number); the receive time when unusable."""
    ts: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        ts = value
    elif isinstance(value, str):
        try:
            ts = float(value)
        except ValueError:
            try:
                ts = datetime.fromisoformat(value).timestamp()
            except (ValueError, OverflowError, OSError):  # not a date, or out of range
                ts = None
    if ts is None or not math.isfinite(ts) or not 0 <= ts < MAX_TS:
        return received_ms // 1000
    return int(ts)


def _attachment_type(attachment: dict[str, Any]) -> str:
    kind = attachment.get("file_type")
    if not isinstance(kind, str) or not kind:
        return "attachment"
    return ATTACHMENT_TYPES.get(kind, kind)


def _id(value: Any, problem: str) -> str:
    """Chatwoot's numeric ids (an int, or a string of digits) as a string."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TS:
        return str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 16:
        return str(int(value))
    raise Invalid(problem)


def _dict(value: Any, problem: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(problem)
    return value


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


def _label(value: Any) -> str:
    if isinstance(value, str):
        return value[:40]
    return type(value).__name__ if value is not None else "missing"
