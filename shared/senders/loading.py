"""Senders deliver a reply: the outbound half of a provider (shared/provider.py).

Each conversation is answered by the sender of the channel its messages came from
(`load_senders`): WhatsApp conversations by the one `SENDER` names, `whatsapp` (the default
when `WHATSAPP_ACCESS_TOKEN` is set), `outbox` (otherwise), or `package.module:attr`;
Chatwoot conversations by the `chatwoot` sender when `CHATWOOT_API_ACCESS_TOKEN` is set, else
by the `SENDER` one unless that is `whatsapp`, which cannot reach them (they then go to review
as `no_sender`).

A sender is any object with `async def send(self, batch, text, part) -> str | None` that sends
part number `part` of the reply and returns the provider's message id (None if the provider
gives none; delivery statuses are tracked by that id). It may also have
`async def begin_turn(self, batch)` (read receipt, typing indicator; called before the AI),
`async def keep_typing(self, batch)` (called every `TYPING_REFRESH_S` while the AI works),
`def can_send_text(self, batch) -> bool` (False: no AI is asked, `send(batch, "", 0)` sends the
provider's fallback, WhatsApp's template outside the 24-hour window),
`max_part_chars` (how long one part may be; 4096 if absent), and
`async def hand_over(self, batch, reason, detail) -> bool | str` (the batch was parked for
review: give the conversation to a person; True if the provider was told, a text for the
review item when it is not that simple). `send` and `hand_over` that declare a keyword
parameter `delivery` get the turn's `shared.conversation.turn_state.Delivery` with it: what the
turn has
done so far (`delivery.state`: the template noted, the review journal, a send nobody can
confirm) and the writes a sender makes about it (`note_template`, `save_journal`), persisted
under the lease; senders without it are called as before. A hand-over is called at most once
per batch, unless the sender sets `resumes_hand_over = True` and itself skips the steps it
began, as journaled in `delivery.state.journal` (shared/conversation/review_journal.py). `send`
raises
`shared.conversation.errors.NeedsReview` for what a person must handle, `DeliveryUnknown` when its
request
may have reached the provider without an answer (never retried: shared/conversation/unknowns.py),
and
anything else to be retried.

The `outbox` sender records replies on the tenant's outbox list in Redis (capped), for local
runs and tests: `redis-cli LRANGE 'wa:{<tenant>}:outbox' 0 9`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from shared.conversation.batch import Batch
from shared.keys import Keys
from shared.plugins import load_object
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter

OUTBOX_MAX = 10_000

if TYPE_CHECKING:
    from shared.provider import OutboundProvider
    from shared.senders.chatwoot import ChatwootSender
    from shared.senders.whatsapp import WhatsAppSender

    # The built-in providers implement the whole interface (mypy checks this line).
    _PROVIDERS: tuple[type[OutboundProvider], ...] = (WhatsAppSender, ChatwootSender)


class Sender(Protocol):
    async def send(self, batch: Batch, text: str, part: int) -> str | None: ...


class OutboxSender:
    def __init__(self, keys: Keys, committer: GroupCommitter) -> None:
        self._keys = keys
        self._committer = committer

    async def send(self, batch: Batch, text: str, part: int) -> str | None:
        outbox = self._keys.tenant(batch.tenant).outbox
        entry = orjson.dumps(
            {
                "tenant": batch.tenant,
                "person": batch.person,
                "batch_id": batch.id,
                "text": text,
                "part": part,
                "message_ids": [m.id for m in batch.messages],
                "sent_ms": int(time.time() * 1000),
            }
        )
        await self._committer.run(
            [lambda p: p.lpush(outbox, entry), lambda p: p.ltrim(outbox, 0, OUTBOX_MAX - 1)]
        )
        return None  # no provider id: no delivery statuses will follow


def load_senders(
    settings: Settings,
    keys: Keys,
    committer: GroupCommitter,
    default: Sender | None = None,
    given: Mapping[str, Sender] | None = None,
) -> dict[str, Sender]:
    """Channel -> the sender answering its conversations. `default` replaces the `SENDER`
    one, `given` the sender of a channel (tests hand in senders with their own clients)."""
    from shared.senders.chatwoot import ChatwootSender
    from shared.senders.whatsapp import WhatsAppSender

    given = dict(given or {})
    if default is None:
        default = given.get("whatsapp") or load_sender(settings, keys, committer)
    senders: dict[str, Sender] = {"whatsapp": default}
    if "chatwoot" in given:
        senders["chatwoot"] = given["chatwoot"]
    elif settings.chatwoot_api_access_token:
        senders["chatwoot"] = ChatwootSender(settings)
    elif not isinstance(default, WhatsAppSender):
        senders["chatwoot"] = default  # the outbox, or a custom sender: any channel
    senders.update(given)
    return senders


def load_sender(settings: Settings, keys: Keys, committer: GroupCommitter) -> Sender:
    """The sender `SENDER` names (WhatsApp conversations, and others without their own)."""
    if settings.sender == "outbox":
        return OutboxSender(keys, committer)
    if settings.sender == "whatsapp":
        from shared.senders.whatsapp import WhatsAppSender

        return WhatsAppSender(settings)
    sender: Sender = load_object(settings.sender, "SENDER", settings, "send")
    return sender


_TAKES_DELIVERY: dict[Any, bool] = {}


def takes_delivery(method: Callable[..., Any]) -> bool:
    """Whether a sender's method declares the `delivery` keyword (or takes any keyword): a
    sender written before it existed is called as before. Read once per function, since a
    turn asks at every send."""
    function = getattr(method, "__func__", method)
    known = _TAKES_DELIVERY.get(function)
    if known is None:
        try:
            params = list(inspect.signature(method).parameters.values())
        except (TypeError, ValueError):
            params = []
        known = any(p.name == "delivery" or p.kind is p.VAR_KEYWORD for p in params)
        _TAKES_DELIVERY[function] = known
    return known
