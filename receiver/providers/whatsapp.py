"""WhatsApp Cloud API webhooks: Meta's signature checked, bodies turned into inbox events (no I/O).

`WhatsAppInbound` is the receiver's half of the WhatsApp provider (see receiver/providers/base.py).

Meta batches many updates into one POST (several entries, changes, messages and statuses, even
several tenants), so every level is walked, never only `[0]`.

Partially valid bodies: every item that can be understood becomes an event, and each one that
cannot (a message without id or sender, an id not of the shape Meta documents, an entry that is
not an object, ...) is recorded as a *problem*. The caller stores the good items
and, when there is any problem, also keeps the whole raw body on the dead-letter list. Storing
the good items means one bad item never holds a customer's other messages hostage; keeping
the body means nothing that was skipped is lost (re-driving it later is safe: the good items
are deduplicated). Changes whose `field` is not "messages" are not problems: they are other
subscriptions and are only reported in `ignored_fields`, except `smb_message_echoes`: what the
business itself wrote from the WhatsApp Business app (coexistence), stored as echo events
(shared/events.py), deduplicated like messages. Echoes never take the one-item fast path, so
they add nothing to a plain message's cost.

A missing or malformed `timestamp` is not a problem either: the event gets the receive time.

Ids (shared/ids.py): the tenant (`phone_number_id`) and media ids are digits, a person is a
phone number (digits) or a business-scoped user id (`US.1349…`), and so is a `from_user_id`
beside a number; a message or status id is a wamid (base64, at most 256 characters). A
number change's new `wa_id` is digits. Anything else is a problem: the item is skipped and the
body dead-lettered, so no id Meta would not send ever becomes a key or reaches a URL.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

import orjson

from receiver.providers.base import WebhookRequest
from receiver.providers.parsing import Invalid, Parsed, checked_id
from receiver.providers.signature import SignatureChecker
from receiver.providers.whatsapp_plain import plain_text_event, timestamp
from receiver.providers.whatsapp_text import describe_as, field_str, message_type, objects
from shared.events import dedupe_id, echo_event, encode, message_event, status_event
from shared.ids import (
    is_media_id,
    is_message_id,
    is_person_id,
    is_phone_number_id,
    is_user_id,
    is_wa_id,
)

CHANNEL = "whatsapp"
EXPECTED_OBJECT = "whatsapp_business_account"
ECHOES_FIELD = "smb_message_echoes"  # what the business sent from the WhatsApp Business app
MEDIA_TYPES = frozenset({"image", "audio", "video", "document", "sticker"})  # carry a media id
NO_TENANT = "tenant id missing or unusable in a Redis key"


class WhatsAppInbound:
    """The receiver's half of the WhatsApp provider: Meta's signature, Meta's body shape."""

    channel = CHANNEL
    path = "/webhooks/whatsapp"
    header_names = frozenset({b"x-hub-signature-256"})
    unavailable_status = 503  # Meta retries any answer but 200, for up to 7 days

    def __init__(self, app_secrets: tuple[str, ...]) -> None:
        self.signatures = SignatureChecker(app_secrets)
        # Read on every request: a plain attribute, not a property (the secrets never change).
        self.configured = self.signatures.configured

    def verify(self, request: WebhookRequest, now_s: float) -> None:
        self.signatures.check(request.body, request.headers.get(b"x-hub-signature-256"))

    def parse(self, request: WebhookRequest, received_ms: int) -> Parsed:
        return parse_body(request.body, received_ms)


def parse_body(body: bytes, received_ms: int) -> Parsed:
    """Parse raw webhook bytes; a body that is not JSON yields a `Parsed` with one problem."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Parsed(problems=["body is not JSON"])
    return _one_item(payload, received_ms) or parse_payload(payload, received_ms)


def _one_item(payload: Any, received_ms: int) -> Parsed | None:
    """The commonest bodies, one message or one status, in one pass; None for anything else.

    Meta sends most updates one per POST: an inbound message, or one of the sent / delivered /
    read receipts every reply brings. The general walk below spends about 30 small calls on
    such a body (a type guard per level, the contacts table, the sender rule); this does the
    same checks inline and builds the same event, with fewer instructions per request
    (docs/benchmarks/receiver.md). It only says yes when the general path would find
    no problem and ignore nothing, so the two always agree (tests/receiver/test_fast_path.py
    compares them on every fixture and on generated bodies). `type(x) is dict` is exact here:
    the payload comes straight from orjson, which makes no subclasses.
    """
    if type(payload) is not dict or payload.get("object", EXPECTED_OBJECT) != EXPECTED_OBJECT:
        return None
    entries = payload.get("entry")
    if type(entries) is not list or len(entries) != 1 or type(entries[0]) is not dict:
        return None
    changes = entries[0].get("changes")
    if type(changes) is not list or len(changes) != 1 or type(changes[0]) is not dict:
        return None
    change = changes[0]
    value = change.get("value")
    if change.get("field") != "messages" or type(value) is not dict:
        return None
    metadata = value.get("metadata")
    if type(metadata) is not dict:
        return None
    tenant = metadata.get("phone_number_id")
    if type(tenant) is not str or not is_phone_number_id(tenant):
        return None
    messages = value.get("messages")
    statuses = value.get("statuses")
    if statuses is None and type(messages) is list and len(messages) == 1:
        event = _lone_message(messages[0], value.get("contacts"), tenant, received_ms)
    elif messages is None and type(statuses) is list and len(statuses) == 1:
        event = _lone_status(statuses[0], tenant, received_ms)
    else:
        return None
    if event is None:
        return None
    try:
        data = encode(event)
    except orjson.JSONEncodeError:
        return None  # the general path records it as a problem
    return Parsed.one(tenant, event, (dedupe_id(event), data))


def _lone_message(
    message: Any, contacts: Any, tenant: str, received_ms: int
) -> dict[str, Any] | None:
    """`message_from`'s event for a message with one contact beside it, or None."""
    if type(message) is not dict or type(contacts) is not list or len(contacts) != 1:
        return None
    contact = contacts[0]
    message_id = message.get("id")
    kind = message.get("type")
    if type(contact) is not dict or type(message_id) is not str or not is_message_id(message_id):
        return None
    if kind == "text" and len(message) == 5:
        event = plain_text_event(message, contact, message_id, received_ms)
        if event is not None:
            return event
    # `_sender`'s rule: the number, else the user id (BSUID), else the lone contact's user id
    user_id = message.get("from_user_id")
    if user_id and not _is_user_id(user_id):
        return None
    person = message.get("from") or user_id or field_str(contact, "user_id")
    if not _is_person(person) or type(kind) is not str or not kind:
        return None
    if kind != "text" and not _media_id_fits(kind, message):
        return None
    profile = contact.get("profile")
    name = profile.get("name") if type(profile) is dict else ""
    is_sender = contact.get("wa_id") == person or contact.get("user_id") == person
    if type(name) is not str or not is_sender:
        name = ""
    context = message.get("context")
    context_id = context.get("id") if type(context) is dict else None
    event = message_event(
        channel=CHANNEL,
        person=person,
        message_id=message_id,
        type=kind,
        text=describe_as(kind, message),
        ts=timestamp(message.get("timestamp"), received_ms),
        received_ms=received_ms,
        name=name,
        context=context_id if type(context_id) is str else "",
        raw=message,
    )
    return None if _bad_new_person(event) else event


def _lone_status(status: Any, tenant: str, received_ms: int) -> dict[str, Any] | None:
    """`status_from`'s event, or None."""
    if type(status) is not dict:
        return None
    person = status.get("recipient_id") or status.get("recipient_user_id")
    status_id = status.get("id")
    state = status.get("status")
    if not _is_person(person) or type(status_id) is not str or not is_message_id(status_id):
        return None
    if type(state) is not str or not state:
        return None
    errors = status.get("errors")
    return status_event(
        channel=CHANNEL,
        person=person,
        message_id=status_id,
        status=state,
        ts=timestamp(status.get("timestamp"), received_ms),
        received_ms=received_ms,
        errors=errors if type(errors) is list else [],
        raw=status,
    )


def _is_person(value: Any) -> TypeGuard[str]:
    """A phone number or a business-scoped user id (shared/ids.py)."""
    return type(value) is str and is_person_id(value)


def _is_user_id(value: Any) -> TypeGuard[str]:
    return type(value) is str and bool(is_user_id(value))


def _media_id_fits(kind: str, message: dict[str, Any]) -> bool:
    """False when a media message names a media id that is not digits: the worker puts it in
    a Graph URL it calls with the tenant's token (`/{version}/{media-id}`)."""
    if kind not in MEDIA_TYPES:
        return True
    body = message.get(kind)
    media_id = body.get("id") if type(body) is dict else None
    return media_id is None or (type(media_id) is str and bool(is_media_id(media_id)))


def _bad_new_person(event: dict[str, Any]) -> bool:
    """A number change whose new `wa_id` is not a phone number (it would become the person)."""
    new = event.get("new_person")
    return type(new) is str and new != "" and not is_wa_id(new)


def parse_payload(payload: Any, received_ms: int) -> Parsed:
    """Every message and status of every change of every entry, grouped by tenant in order."""
    parsed = Parsed()
    try:
        entries = _entries(payload)
    except Invalid as exc:
        parsed.problems.append(str(exc))
        return parsed
    for entry in entries:
        try:
            changes = _list(_dict(entry, "entry").get("changes"), "entry.changes")
        except Invalid as exc:
            parsed.problems.append(str(exc))
            continue
        for change in changes:
            _parse_change(change, received_ms, parsed)
    return parsed


def _entries(payload: Any) -> list[Any]:
    body = _dict(payload, "body")
    obj = body.get("object", EXPECTED_OBJECT)
    if obj != EXPECTED_OBJECT:
        raise Invalid("object is not whatsapp_business_account")
    return _list(body.get("entry"), "body.entry")


def _parse_change(change: Any, received_ms: int, parsed: Parsed) -> None:
    try:
        change = _dict(change, "change")
        name = change.get("field")
        if name != "messages" and name != ECHOES_FIELD:
            parsed.ignored_fields.append(name if isinstance(name, str) else repr(type(name)))
            return
        value = _dict(change.get("value"), "change.value")
        metadata = _dict(value.get("metadata"), "metadata")
        tenant = checked_id(metadata.get("phone_number_id"), is_phone_number_id, NO_TENANT)
    except Invalid as exc:
        parsed.problems.append(str(exc))
        return
    if name == ECHOES_FIELD:
        for echo in _optional_list(value.get("message_echoes"), "message_echoes", parsed):
            try:
                parsed.add(tenant, echo_from(echo, tenant, received_ms))
            except Invalid as exc:
                parsed.problems.append(str(exc))
        return
    contacts = Contacts.parse(value.get("contacts"))
    for message in _optional_list(value.get("messages"), "messages", parsed):
        try:
            parsed.add(tenant, message_from(message, tenant, contacts, received_ms))
        except Invalid as exc:
            parsed.problems.append(str(exc))
    for status in _optional_list(value.get("statuses"), "statuses", parsed):
        try:
            parsed.add(tenant, status_from(status, tenant, received_ms))
        except Invalid as exc:
            parsed.problems.append(str(exc))


def message_from(message: Any, tenant: str, contacts: Contacts, received_ms: int) -> dict[str, Any]:
    """The inbox event of one inbound message; `contacts` gives the sender's profile name."""
    message = _dict(message, "message")
    message_id = checked_id(message.get("id"), is_message_id, "message without id")
    person = _sender(message, contacts)
    context = message.get("context")
    context_id = context.get("id") if isinstance(context, dict) else None
    kind = message_type(message)
    if not _media_id_fits(kind, message):
        raise Invalid("media id is not digits")
    event = message_event(
        channel=CHANNEL,
        person=person,
        message_id=message_id,
        type=kind,
        text=describe_as(kind, message),
        ts=timestamp(message.get("timestamp"), received_ms),
        received_ms=received_ms,
        name=contacts.names.get(person, ""),
        context=context_id if isinstance(context_id, str) else "",
        raw=message,
    )
    if _bad_new_person(event):
        raise Invalid("number change to a wa_id that is not digits")
    return event


def echo_from(echo: Any, tenant: str, received_ms: int) -> dict[str, Any]:
    """The inbox event of one message the business sent from the WhatsApp Business app.

    Meta's `message_echoes[]` item: `from` (the business' number), `to` (the person; Meta's
    reference shows it both as `16505551234` and `+16505551234`, while inbound messages name
    the person without the `+`, so a leading `+` is dropped to reach the same conversation),
    `id`, `timestamp`, `type` and the content under the type's name, as in a sent message.
    A person known only by a username is taken from `to_user_id` when `to` is absent.
    """
    echo = _dict(echo, "message echo")
    to = echo.get("to") or echo.get("to_user_id")
    person = to[1:] if isinstance(to, str) and to.startswith("+") else to
    kind = message_type(echo)
    if not _media_id_fits(kind, echo):
        raise Invalid("media id is not digits")
    return echo_event(
        channel=CHANNEL,
        person=checked_id(person, is_person_id, "message echo without to"),
        message_id=checked_id(echo.get("id"), is_message_id, "message echo without id"),
        type=kind,
        text=describe_as(kind, echo),
        ts=timestamp(echo.get("timestamp"), received_ms),
        received_ms=received_ms,
        raw=echo,
    )


def status_from(status: Any, tenant: str, received_ms: int) -> dict[str, Any]:
    """The inbox event of one delivery receipt (sent, delivered, read, failed, played)."""
    status = _dict(status, "status")
    errors = status.get("errors")
    person = status.get("recipient_id") or status.get("recipient_user_id")
    return status_event(
        channel=CHANNEL,
        person=checked_id(person, is_person_id, "status without recipient"),
        message_id=checked_id(status.get("id"), is_message_id, "status without id"),
        status=_required_str(status.get("status"), "status without status"),
        ts=timestamp(status.get("timestamp"), received_ms),
        received_ms=received_ms,
        errors=errors if isinstance(errors, list) else [],
        raw=status,
    )


def _sender(message: dict[str, Any], contacts: Contacts) -> str:
    user_id = message.get("from_user_id")
    if user_id and not _is_user_id(user_id):
        raise Invalid("from_user_id is not a business-scoped user id")
    person = message.get("from") or user_id or contacts.sole_user_id
    return checked_id(person, is_person_id, "message without from")


class Contacts(NamedTuple):
    """The `contacts` of one change: profile name by wa_id and user_id.

    A NamedTuple, not a frozen dataclass: one is built per change on the hot path, and a
    frozen dataclass' __init__ (one object.__setattr__ per field) costs several times more.
    """

    names: dict[str, str]
    sole_user_id: str | None  # the sender when a lone contact has no number

    @classmethod
    def parse(cls, value: Any) -> Contacts:
        names: dict[str, str] = {}
        contacts = objects(value)
        for contact in contacts:
            profile = contact.get("profile")
            name = profile.get("name") if isinstance(profile, dict) else ""
            if not isinstance(name, str):
                name = ""
            for id_key in ("wa_id", "user_id"):
                contact_id = contact.get(id_key)
                if isinstance(contact_id, str) and contact_id:
                    names.setdefault(contact_id, name)
        sole = field_str(contacts[0], "user_id") if len(contacts) == 1 else ""
        return cls(names, sole or None)

    def name(self, person: str) -> str:
        return self.names.get(person, "")


# --- small type guards -----------------------------------------------------------------------


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise Invalid(f"{what} is not a list")
    return value


def _optional_list(value: Any, what: str, parsed: Parsed) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        parsed.problems.append(f"{what} is not a list")
        return []
    return value


def _required_str(value: Any, problem: str) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid(problem)
    return value
