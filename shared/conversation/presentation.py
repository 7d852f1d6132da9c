"""How a batch is shown to the model: one presentation, used by the built-in brain
(worker/brains/prompt.py) and available to custom brains (`present(batch, tenant, settings)`).

A presentation has two parts, sent as the two text blocks of the current user turn and
remembered as they were sent (the exchange's `header` and `user`), so the next turn renders them
byte for byte the same and the prompt cache holds:

- `header`: when the batch arrived, in the tenant's time zone (`timezone` in `TENANTS_FILE`,
  else `TIMEZONE`), and who sent it (the WhatsApp profile name); when the batch is answered
  `LATE_AFTER_S` or more after its latest message (a webhook the provider redelivered after an
  outage, a batch requeued from review, a long wait for the AI), also the time of the answer and
  how late it is, so the model does not answer as if they had just written;
- `body`: each message of the burst, in order, rendered from the raw message the receiver
  stored (`raw`), so nothing is lost: a list reply's description, a button's payload, a Flow
  reply's answers, an order's product ids, quantities and prices, a contact card's phones and
  emails, a location's coordinates, the click-to-WhatsApp ad that started the chat, forwarded
  markers, and the text a reply quotes when it is known (a message of the same burst, or one
  of the remembered exchanges: their inbound message ids and the ids of our reply's parts are
  remembered beside them). A message Meta could not deliver in full (an `errors` entry,
  `unsupported`, an interactive message or a button without its reply) is one sentence the model
  can act on (shared/conversation/files.py `could_not_show`). A file (an image, a voice note, a
  Chatwoot attachment, ...) is said once: by the receiver's label (`[image: caption]`) in its
  place, or, when the brain shows the files beside the text (`files_beside`: the built-in
  brain's worker/brains/media.py, label and file together), not in the body at all. A message of
  another type, or from another channel, shows the receiver's text (`Message.text`).

No I/O: the same batch and memory always give the same presentation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson

from shared.chatwoot import CHANNEL as CHATWOOT
from shared.conversation.batch import Batch, Message, plain_text
from shared.conversation.files import (
    A_KIND,
    FILE_TYPES,
    chatwoot_content,
    could_not_show,
    items_of_message,
    undelivered,
)
from shared.conversation.kept_files import files_of
from shared.conversation.when import late_note, local_time
from shared.settings import Settings, TenantConfig

HEADER_START = "Date and time: "
# An exchange whose reply a person of the business wrote (a reply by hand,
# worker/manual_reply.py; an echo of what the business wrote from the WhatsApp Business app,
# shared/lua/lib/human.lua) has `"by": BY_HUMAN`; the model is shown it with these notes
# (`remembered`), so it knows the words were not its own and can go on from them.
BY_HUMAN = "human"
HUMAN_REPLY_NOTE = "[Written by a person of the business, not by you:]"
NO_NEW_MESSAGE = "[The customer wrote nothing new before this reply.]"
# Types the receiver's text says in full (an edit's new content, a system notice, ...).
SAID_BY_THE_RECEIVER = frozenset({"edit", "revoke", "reaction", "system", "request_welcome"})
QUOTE_CHARS = 300  # a quoted text longer than this is cut (with "…")


@dataclass(frozen=True)
class Presentation:
    """What the model is shown of a batch: `header` (date, time, sender) and `body` (the
    messages, one paragraph each)."""

    header: str
    body: str

    @property
    def blocks(self) -> list[str]:
        """The text blocks of the user turn: the header, then the body."""
        return [self.header, self.body]

    @property
    def text(self) -> str:
        """The header, a blank line, the body: the presentation as one string."""
        return f"{self.header}\n\n{self.body}" if self.body else self.header


def present(
    batch: Batch, tenant: TenantConfig, settings: Settings, *, files_beside: bool = False
) -> Presentation:
    """The presentation of `batch` for a tenant, `settings.tenant(batch.tenant)` (its time
    zone; `settings` itself is not read, the parameter stays for custom brains' calls).
    `files_beside`: the brain shows the batch's files after the text, each with its label
    (worker/brains/media.py), so the body leaves them out rather than say them twice.
    Computed once per batch, time zone and `files_beside` (a batch does not change): the
    prompt and the memory's exchange read the same one."""
    key = f"{tenant.timezone}\x00files" if files_beside else tenant.timezone
    shown: Presentation | None = batch.presented.get(key)
    if shown is None:
        shown = batch.presented[key] = _present(batch, tenant, files_beside)
    return shown


def _present(batch: Batch, tenant: TenantConfig, files_beside: bool) -> Presentation:
    written = batch_time(batch)
    header = [f"{HEADER_START}{local_time(written, tenant.timezone)}"]
    for message in reversed(batch.messages):  # the latest name the person goes by
        if message.name:
            header.append(f"From: {message.name}")
            break
    late = late_note(written, batch.claimed_ms / 1000, tenant.timezone)
    if late:
        header.append(late)
    quotes = Quotes(batch)
    body = [present_message(m, quotes, files_beside) for m in batch.messages]
    return Presentation("\n".join(header), "\n".join(filter(None, body)))


def batch_time(batch: Batch) -> float:
    """Unix seconds of the batch: its latest message's provider time, else its claim."""
    latest = 0
    for m in batch.messages:  # a loop, not a list: every batch is presented
        if m.ts and (not latest or m.ts > latest):
            latest = m.ts
    return float(latest) if latest else batch.claimed_ms / 1000


class Quotes:
    """The texts a reply may quote: the burst's own messages, the remembered exchanges' inbound
    messages (`ids`) and our replies to them (`out`: the provider ids of the reply's parts)."""

    def __init__(self, batch: Batch) -> None:
        self._batch = batch

    @cached_property
    def texts(self) -> dict[str, str]:
        """Made when first read: most batches quote nothing, and every batch is presented."""
        batch, texts = self._batch, {}
        for exchange in batch.history:
            if not isinstance(exchange, dict):
                continue
            user, assistant = _joined(exchange.get("user")), _joined(exchange.get("assistant"))
            for wamid in _strings(exchange.get("ids")):
                texts[wamid] = f'their earlier message "{_cut(user)}"'
            # Written by a person of the business (a reply by hand, an echo), not by the AI.
            human = exchange.get("by") == BY_HUMAN
            for wamid in _strings(exchange.get("out")):
                texts[wamid] = (
                    f'the message "{_cut(assistant)}" a person of the business wrote'
                    if human
                    else f'your message "{_cut(assistant)}"'
                )
        for message in batch.messages:
            texts[message.id] = f'their message "{_cut(message.text)}"'
        return texts

    def of(self, wamid: str) -> str:
        return self.texts.get(wamid, "a message not in this conversation's memory")


def present_message(message: Message, quotes: Quotes, files_beside: bool = False) -> str:
    """One message as the model reads it: what surrounds it (the ad that brought the person,
    forwarded markers, the message it quotes) on lines of their own, then its content. With
    `files_beside`, a file is left to the brain's blocks (its label goes with the file)."""
    if plain_text(message):  # nearly every message: nothing to render but its text
        return message.text
    raw = message.raw if isinstance(message.raw, dict) else None
    if message.channel == CHATWOOT and raw is not None:
        return chatwoot_content(message, raw, files_beside)
    if message.channel != "whatsapp" or raw is None:
        return message.text
    surroundings = _surroundings(raw, message, quotes)
    why = undelivered(raw)
    if why or message.type == "unsupported":
        content = could_not_show(_undelivered_kind(raw, message.type), why)
    elif message.type in FILE_TYPES:
        content = message.text
        if files_beside and items_of_message(message):
            # Its label comes with the file; in its place, only a pointer when lines about it
            # (forwarded, quoting, an ad) would otherwise stand over nothing.
            content = f"[sent {A_KIND[message.type]}, shown below]" if surroundings else ""
    elif render := _RENDERERS.get(message.type):
        content = render(raw.get(message.type), message)
    elif message.type in SAID_BY_THE_RECEIVER:
        content = message.text
    else:  # a type Meta added since, or a message without one: never a bare `[type]`
        content = could_not_show(message.type)
    return "\n".join(x for x in (*surroundings, content) if x)


def _undelivered_kind(raw: dict[str, Any], kind: str) -> str:
    """`interactive`, `unsupported: poll`, `image with the caption "..."`: the message's type
    as the sentence names it, with what the customer wrote that did arrive."""
    if kind == "unsupported":
        return f"unsupported: {field_str(raw.get('unsupported'), 'type') or 'unknown'}"
    caption = field_str(raw.get(kind), "caption")
    return f'{kind} with the caption "{caption}"' if caption else kind


def _surroundings(raw: dict[str, Any], message: Message, quotes: Quotes) -> list[str]:
    lines = []
    referral = raw.get("referral")
    if isinstance(referral, dict):
        lines.append(_referral(referral))
    context = raw.get("context")
    if isinstance(context, dict):
        if context.get("frequently_forwarded") is True:
            lines.append("(forwarded many times)")
        elif context.get("forwarded") is True:
            lines.append("(forwarded)")
        quoted = field_str(context, "id")
        if quoted and quoted != message.id:
            lines.append(f"(replying to {quotes.of(quoted)})")
        product = context.get("referred_product")
        if isinstance(product, dict):
            lines.append(f"(asking about product {field_str(product, 'product_retailer_id')})")
    return lines


def _referral(referral: dict[str, Any]) -> str:
    source = field_str(referral, "source_type") or "ad"
    parts = [
        f'headline "{field_str(referral, "headline")}"' if field_str(referral, "headline") else "",
        f'text "{field_str(referral, "body")}"' if field_str(referral, "body") else "",
        field_str(referral, "source_url"),
    ]
    article = "an" if source[:1] in "aeiou" else "a"
    return f"(came from {article} {source}: {', '.join(p for p in parts if p)})"


# Each renderer gets the message's `<type>` value and the message.


def _text(body: Any, message: Message) -> str:
    return field_str(body, "body") or message.text


def _interactive(body: Any, message: Message) -> str:
    if not isinstance(body, dict):
        return could_not_show("interactive")
    kind = field_str(body, "type")
    reply = body.get(kind)
    if kind == "button_reply" and isinstance(reply, dict):
        return f'[pressed the button "{field_str(reply, "title")}" (id {field_str(reply, "id")})]'
    if kind == "list_reply" and isinstance(reply, dict):
        chosen = f'[chose "{field_str(reply, "title")}" from a list (id {field_str(reply, "id")})'
        description = field_str(reply, "description")
        return f"{chosen}: {description}]" if description else f"{chosen}]"
    if kind == "nfm_reply" and isinstance(reply, dict):
        return _flow_reply(reply)
    # No reply this product can read (Meta left it out, or a kind it does not know yet).
    return could_not_show(f"interactive {kind}" if kind else "interactive")


def _flow_reply(reply: dict[str, Any]) -> str:
    """A WhatsApp Flow's answers: `response_json`, parsed, one `key: value` line each."""
    lines = [f"[filled in the form {field_str(reply, 'name') or 'flow'}]"]
    try:
        answers = orjson.loads(field_str(reply, "response_json") or "{}")
    except orjson.JSONDecodeError:
        answers = field_str(reply, "response_json")
    if isinstance(answers, dict):
        for key, value in answers.items():
            if key != "flow_token":  # ours, not the person's
                lines.append(f"{key}: {_value(value)}")
    elif answers:
        lines.append(str(answers))
    return "\n".join(lines)


def _button(body: Any, message: Message) -> str:
    text, payload = field_str(body, "text"), field_str(body, "payload")
    if not text and not payload:
        return could_not_show("button")
    return f'[pressed the button "{text}" (payload {payload})]'


def _order(body: Any, message: Message) -> str:
    if not isinstance(body, dict):
        return message.text
    lines = [f"[order from catalog {field_str(body, 'catalog_id')}]"]
    for item in objects(body.get("product_items")):
        price = _value(item.get("item_price"))
        currency = field_str(item, "currency")
        lines.append(
            f"- product {_value(item.get('product_retailer_id'))}:"
            f" quantity {_value(item.get('quantity'))}, {price} {currency} each".rstrip()
        )
    note = field_str(body, "text")
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _contacts(body: Any, message: Message) -> str:
    cards = objects(body)
    if not cards:
        return message.text
    lines = []
    for card in cards:
        name = field_str(card.get("name"), "formatted_name") or "(no name)"
        details = [_labelled(p, "phone") for p in objects(card.get("phones"))]
        details += [_labelled(e, "email") for e in objects(card.get("emails"))]
        company = field_str(card.get("org"), "company")
        if company:
            details.append(company)
        shown = ", ".join(d for d in details if d)
        lines.append(f"[shared a contact: {name}{': ' + shown if shown else ''}]")
    return "\n".join(lines)


def _labelled(entry: dict[str, Any], key: str) -> str:
    value, label = field_str(entry, key), field_str(entry, "type")
    return f"{value} ({label.lower()})" if value and label else value


def _location(body: Any, message: Message) -> str:
    if not isinstance(body, dict):
        return message.text
    parts = [field_str(body, "name"), field_str(body, "address")]
    latitude, longitude = body.get("latitude"), body.get("longitude")
    if latitude is not None and longitude is not None:
        parts.append(f"{_value(latitude)}, {_value(longitude)}")
    parts.append(field_str(body, "url"))
    return f"[shared a location: {'; '.join(p for p in parts if p)}]"


_RENDERERS: dict[str, Callable[[Any, Message], str]] = {
    "text": _text,
    "interactive": _interactive,
    "button": _button,
    "order": _order,
    "contacts": _contacts,
    "location": _location,
}


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value)
    return orjson.dumps(value).decode() if isinstance(value, dict) else str(value)


def _joined(value: Any) -> str:
    return value if isinstance(value, str) else ""


def exchange(
    batch: Batch,
    settings: Settings,
    reply: str,
    sent: Iterable[str],
    media: Iterable[str] = (),
) -> dict[str, Any]:
    """What the memory keeps of a turn: the presentation the model was shown (`header`, and its
    body as `user`, which brains reading the memory have always found there), its reply, the
    batch's message ids, the provider ids of the reply's parts `sent` (what a later reply may
    quote), when its messages came and the reply went (`in`, provider unix s; `at`, ms) and,
    when the batch had files, the texts the model read of them (`media`: a voice
    note's transcription, a file's label; shared/conversation/turn_state.py `record_media`)."""
    notes = list(filter(None, media))
    # The files were shown beside the text when the brain recorded texts of them (the
    # built-in brain always does): the memory keeps the body the model was sent.
    shown = present(batch, settings.tenant(batch.tenant), settings, files_beside=bool(notes))
    remembered: dict[str, Any] = {
        "header": shown.header,
        "user": shown.body,
        "assistant": reply,
        "ids": [m.id for m in batch.messages],
        "out": list(filter(None, sent)),
        # When: the batch's latest message (provider unix s) and the reply (ms), for the ops
        # page's thread; exchanges remembered before these were kept have neither.
        "in": int(batch_time(batch)),
        "at": int(time.time() * 1000),
    }
    if notes:
        remembered["media"] = notes
    # A plain text has no file: asked first, it spares a call or three per message.
    files = [f.to_json() for m in batch.messages if not plain_text(m) for f in files_of(m)]
    if files:  # the thread shows them (an image through the ops page's media route)
        remembered["files"] = files
    return remembered


def remembered(exchange: dict[str, Any]) -> tuple[Any, Any]:
    """The user text and the answer of a remembered exchange as the model is shown them: as
    stored, but a reply a person of the business wrote by hand carries `HUMAN_REPLY_NOTE`
    (and an empty user text, a reply nobody's message came before, `NO_NEW_MESSAGE`). The
    same exchange gives the same bytes every turn (the prompt cache)."""
    user, answer = exchange.get("user"), exchange.get("assistant")
    if exchange.get("by") != BY_HUMAN:
        return user, answer
    if not isinstance(user, str) or not user.strip():
        user = NO_NEW_MESSAGE
    return user, f"{HUMAN_REPLY_NOTE}\n{_joined(answer)}"


def field_str(obj: Any, key: str) -> str:
    """`obj[key]` when obj is an object and that value a string, else ""."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


def objects(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 1] + "…"
