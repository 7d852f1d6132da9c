"""How the sender of each conversation is chosen, and a plug-in's sender made a `Sender`.

Each conversation is answered by the sender of the channel its messages came from
(`load_senders`): WhatsApp conversations by the one `SENDER` names, `whatsapp` (the default
when `WHATSAPP_ACCESS_TOKEN` is set), `outbox` (otherwise), or `package.module:attr`;
Chatwoot conversations by the `chatwoot` sender when `CHATWOOT_API_ACCESS_TOKEN` is set, else
by the `SENDER` one unless that is `whatsapp`, which cannot reach them (they then go to review
as `no_sender`).

Every sender the worker and the ops page use is a `shared.senders.base.Sender`. A plug-in's
object (`SENDER=package.module:attr`, or one a test hands in) needs only
`async def send(self, batch, text, part)`; one that does not subclass `Sender` is adapted here,
once, as it is loaded (`as_sender`): each optional method it has is used, each it lacks is the
base class's default, the class attributes it sets (`max_part_chars`, `resumes_hand_over`) are
read, and its `send`, `hand_over` and `send_template` get the turn's `Delivery` only when they
declare a keyword parameter `delivery` (or `**kwargs`): a sender written before it existed is
called as before.

The `outbox` sender records replies on the tenant's outbox list in Redis (capped), for local
runs and tests: `redis-cli LRANGE 'wa:{<tenant>}:outbox' 0 9`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import orjson

from shared.conversation.batch import Batch
from shared.conversation.turn_state import Delivery
from shared.keys import Keys
from shared.plugins import load_object
from shared.senders.base import Sender
from shared.senders.split import WHATSAPP_MAX_CHARS
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter

__all__ = ["AdaptedSender", "OutboxSender", "PlainSender", "Sender", "as_sender", "load_senders"]

OUTBOX_MAX = 10_000
T = TypeVar("T")


class PlainSender(Protocol):
    """What a plug-in's sender must have at least (`as_sender` makes it a `Sender`)."""

    async def send(self, batch: Batch, text: str, part: int) -> str | None: ...


class OutboxSender(Sender):
    def __init__(self, keys: Keys, committer: GroupCommitter) -> None:
        self._keys = keys
        self._committer = committer

    async def send(
        self, batch: Batch, text: str, part: int, *, delivery: Delivery | None = None
    ) -> str | None:
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
        await self._committer.run([("LPUSH", outbox, entry), ("LTRIM", outbox, 0, OUTBOX_MAX - 1)])
        return None  # no provider id: no delivery statuses will follow


def load_senders(
    settings: Settings,
    keys: Keys,
    committer: GroupCommitter,
    default: Sender | PlainSender | None = None,
    given: Mapping[str, Sender | PlainSender] | None = None,
) -> dict[str, Sender]:
    """Channel -> the sender answering its conversations. `default` replaces the `SENDER`
    one, `given` the sender of a channel (tests hand in senders with their own clients)."""
    from shared.senders.chatwoot import ChatwootSender
    from shared.senders.whatsapp import WhatsAppSender

    seen: dict[int, Sender] = {}

    def adapted_once(sender: Sender | PlainSender) -> Sender:  # one object handed in twice
        return seen.setdefault(id(sender), as_sender(sender))

    adapted = {channel: adapted_once(sender) for channel, sender in (given or {}).items()}
    chosen = adapted_once(default) if default is not None else None
    if chosen is None:
        chosen = adapted.get("whatsapp") or load_sender(settings, keys, committer)
    senders: dict[str, Sender] = {"whatsapp": chosen}
    if "chatwoot" in adapted:
        senders["chatwoot"] = adapted["chatwoot"]
    elif settings.chatwoot_api_access_token:
        senders["chatwoot"] = ChatwootSender(settings)
    elif not isinstance(chosen, WhatsAppSender):
        senders["chatwoot"] = chosen  # the outbox, or a custom sender: any channel
    senders.update(adapted)
    return senders


def load_sender(settings: Settings, keys: Keys, committer: GroupCommitter) -> Sender:
    """The sender `SENDER` names (WhatsApp conversations, and others without their own)."""
    if settings.sender == "outbox":
        return OutboxSender(keys, committer)
    if settings.sender == "whatsapp":
        from shared.senders.whatsapp import WhatsAppSender

        return WhatsAppSender(settings)
    return as_sender(load_object(settings.sender, "SENDER", settings, "send"))


def as_sender(sender: Sender | PlainSender) -> Sender:
    """`sender` as a `Sender`: itself when it is one, else adapted (`AdaptedSender`)."""
    return sender if isinstance(sender, Sender) else AdaptedSender(sender)


def plugin_of(sender: Sender) -> object:
    """The object a plug-in handed in: the adapted one, or the sender itself."""
    return sender.plugin if isinstance(sender, AdaptedSender) else sender


class AdaptedSender(Sender):
    """A plug-in's sender that does not subclass `Sender`, seen as one (see the module
    docstring). Its methods and attributes are looked up once, here, and nowhere else."""

    def __init__(self, plugin: PlainSender) -> None:
        self.plugin = plugin
        found: Any = plugin  # its optional methods are not in PlainSender's type
        self._send = _passing_delivery(found.send)
        self._can_send_text = getattr(found, "can_send_text", None)
        self._begin_turn = getattr(found, "begin_turn", None)
        self._keep_typing = getattr(found, "keep_typing", None)
        self._hand_over = _optional(getattr(found, "hand_over", None))
        self._send_template = _optional(getattr(found, "send_template", None))
        self._aclose = getattr(found, "aclose", None)
        self.max_part_chars = getattr(found, "max_part_chars", WHATSAPP_MAX_CHARS)
        self.keeps_typing = self._keep_typing is not None
        self.hands_over = self._hand_over is not None
        self.resumes_hand_over = bool(getattr(found, "resumes_hand_over", False))
        self.sends_templates = self._send_template is not None

    async def send(self, batch: Batch, text: str, part: int, *, delivery: Delivery) -> str | None:
        result: str | None = await self._send(batch, text, part, delivery=delivery)
        return result

    def can_send_text(self, batch: Batch) -> bool:
        return self._can_send_text is None or bool(self._can_send_text(batch))

    async def begin_turn(self, batch: Batch) -> None:
        if self._begin_turn is not None:
            await self._begin_turn(batch)

    async def keep_typing(self, batch: Batch) -> None:
        if self._keep_typing is not None:
            await self._keep_typing(batch)

    async def hand_over(
        self, batch: Batch, reason: str, detail: str, *, delivery: Delivery
    ) -> bool | str:
        if self._hand_over is None:
            return False
        told: bool | str = await self._hand_over(batch, reason, detail, delivery=delivery)
        return told

    async def send_template(self, batch: Batch, part: int, *, delivery: Delivery) -> str:
        if self._send_template is None:
            return await super().send_template(batch, part, delivery=delivery)
        sent: str = await self._send_template(batch, part, delivery=delivery)
        return sent

    async def aclose(self) -> None:
        if self._aclose is not None:
            await self._aclose()


def _optional(
    method: Callable[..., Awaitable[Any]] | None,
) -> Callable[..., Awaitable[Any]] | None:
    return None if method is None else _passing_delivery(method)


def _passing_delivery(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """`method`, called with the keyword `delivery` only if it declares it (or takes any
    keyword): a plug-in's sender written before `Delivery` existed is called as before."""
    if _takes_delivery(method):
        return method

    async def without_delivery(*args: Any, delivery: Delivery) -> T:
        return await method(*args)

    return without_delivery


def _takes_delivery(method: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        params = []
    return any(p.name == "delivery" or p.kind is p.VAR_KEYWORD for p in params)
