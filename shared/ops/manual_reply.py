"""Replies written by hand by a person of the business, sent through the tenant's provider.

    python -m worker.manual_reply --tenant 106540352242922 --person 5491155550001 \\
        --by ana "Hola, soy Ana: ya le confirmo el turno."

The ops page calls `ManualReplies.reply` and the CLI above does the same. A reply by hand:

- holds the person's turn lock with a token of its own (`manual_begin.lua`), so it never
  overlaps a worker's turn (invariant 3): refused while a turn holds the lock or a batch is in
  flight; the lock's lease is renewed before each part and each send is bounded under it;
- checks the 24-hour window as the worker does (`lastin`; WhatsApp only): open, the text goes
  out, split as a turn splits a reply, as written (no Markdown conversion: a person writes
  WhatsApp's own `*bold*`); closed, the tenant's template goes out instead (`template=True`),
  and without a template the reply is refused;
- then (`manual_end.lua`, one atomic step) records each part's outbound record (so delivery
  statuses apply), takes the pending messages it answered out of the pending list (those that
  arrived meanwhile stay, due as their own burst says), and appends the exchange to the
  person's memory marked `"by": "human"` (shared/conversation/presentation.py shows it to the AI as
  written by a person of the business).

Whatever refuses the reply (bad input, an unknown tenant or person, a turn running, the
provider refusing or not answering) raises `ManualReplyError` with a sentence for a person and
changes nothing: the lock is released, the pending messages stay, the memory is untouched. Only
a reply of several parts whose later part failed has changed something: the parts that went out
are recorded and remembered, and the error lists them (`provider_ids`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import RedisError

from shared import chatwoot
from shared.conversation.batch import SERVICE_WINDOW_S, Batch, Message
from shared.conversation.errors import DeliveryUnknown, NeedsReview, RetryLater
from shared.conversation.presentation import BY_HUMAN, exchange
from shared.conversation.turn_state import Delivery
from shared.fleet import wake
from shared.keys import OUTBOUND_TTL_S, KeyError_, Keys, TenantKeys
from shared.senders.loading import load_senders
from shared.senders.split import WHATSAPP_MAX_CHARS
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.redis_client import explain
from shared.storage.script_settings import ScriptSettings
from shared.storage.scripts import Scripts

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 4 * WHATSAPP_MAX_CHARS  # a reply by hand longer than four messages is a mistake
MAX_BY_CHARS = 200
TOKEN_PREFIX = "manual:"  # a reply by hand's lock token; a worker's is its claim's
# A send may take this share of the lease at most, so the lock outlives every send.
SEND_SHARE_OF_LEASE = 0.8
BUSY = "a turn is running for this person; try again in a moment"
# What manual_end.lua gets for the values a "release" does not use (shared/lua/manual_end.lua).
_END_UNUSED: dict[str, Any] = {
    "remember": b"",
    "memory_turns": 0,
    "memory_ttl_ms": 0,
    "answered": b"[]",
    "pause_ms": 0,
    "by": "",
    "provider_ids": [],
}


class ManualReplyError(Exception):
    """Why a reply by hand was not sent, for a person to read. `provider_ids`: the parts that
    went out all the same (a later part failed); empty when nothing changed."""

    def __init__(self, message: str, provider_ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.provider_ids = list(provider_ids or [])


@dataclass(frozen=True)
class ManualReplyResult:
    provider_ids: list[str]  # ids the provider gave the parts sent
    template: bool  # the window was closed: the tenant's template went out instead
    answered: int  # how many waiting messages the reply answered


@dataclass(frozen=True)
class _Hold:
    """The person's lock as `manual_begin.lua` gave it, and what was waiting then."""

    k: TenantKeys
    token: str
    since_ms: int
    batch: Batch
    channel: str
    answered: list[str]  # ids of the waiting messages (and of those their edits replaced)


@dataclass
class _Sent:
    provider_ids: list[str]
    parts_total: int
    texts: list[str]
    template: bool = False


class ManualReplies:
    """Replies by hand for every tenant; one per process (its senders keep connections)."""

    def __init__(self, redis: Any, keys: Keys, scripts: Scripts, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._scripts = scripts
        self._settings = settings
        self._units = ScriptSettings.of(settings)
        self._send_bound_s = settings.lease_s * SEND_SHARE_OF_LEASE
        # The outbox sender writes through a committer; the provider senders use their own
        # HTTP clients, as a worker's do (per-tenant tokens from TENANTS_FILE included).
        self._senders = load_senders(settings, keys, GroupCommitter(redis, scripts))

    async def aclose(self) -> None:
        closed: set[int] = set()
        for sender in self._senders.values():
            if id(sender) not in closed:
                closed.add(id(sender))
                await sender.aclose()

    async def reply(self, tenant: str, person: str, text: str, *, by: str) -> ManualReplyResult:
        """Send `text` to `person` of `tenant` as written by `by`; see the module docstring."""
        text, by = _checked_text(text), _checked_by(by)
        try:
            k = self._keys.tenant(tenant)
            k.lock(person)
        except KeyError_ as exc:
            raise ManualReplyError(str(exc)) from None
        try:
            known = await self._redis.sismember(self._keys.tenants, tenant)
        except (RedisError, OSError) as exc:
            raise ManualReplyError(f"Redis did not answer: {explain(exc)}") from exc
        if not known:
            raise ManualReplyError(f"unknown tenant {tenant!r}: it never received a message")
        hold = await self._take(k, tenant, person)
        try:
            sent = await self._send(hold, text)
        except _SendFailed as exc:
            if not exc.sent.provider_ids:
                await self._release(hold)
                raise ManualReplyError(str(exc)) from exc.__cause__
            # Earlier parts went out: they are recorded and remembered like a whole reply.
            await self._end(hold, exc.sent, by)
            n, total = len(exc.sent.provider_ids), exc.sent.parts_total
            raise ManualReplyError(
                f"only {n} of {total} parts went out, the rest did not: {exc}",
                exc.sent.provider_ids,
            ) from exc.__cause__
        except BaseException:
            await self._release(hold)  # a cancelled call too: never keep the person locked
            raise
        answered = await self._end(hold, sent, by)
        return ManualReplyResult(sent.provider_ids, sent.template, answered)

    async def _take(self, k: TenantKeys, tenant: str, person: str) -> _Hold:
        token = f"{TOKEN_PREFIX}{uuid.uuid4().hex}"
        lease_ms = self._units.lease_ms
        try:
            reply = await self._scripts.manual_begin(
                self._redis,
                k,
                person=person,
                token=token,
                lease_ms=lease_ms,
                service_window_s=SERVICE_WINDOW_S,
            )
        except (RedisError, OSError) as exc:
            raise ManualReplyError(f"Redis did not answer: {explain(exc)}") from exc
        row = [_s(x) for x in reply]
        if row[0] == "busy":
            if row[1].startswith(TOKEN_PREFIX):
                raise ManualReplyError(
                    "another reply by hand is being sent to this person; try again in a moment"
                )
            raise ManualReplyError(BUSY)
        if row[0] == "none":
            raise ManualReplyError(f"tenant {tenant!r} has no conversation with {person!r}")
        since_ms, last_inbound, history = int(row[1]), int(row[2] or 0), orjson.loads(row[3])
        events = [orjson.loads(e) for e in row[4:]]
        channel = chatwoot.CHANNEL if tenant.startswith(chatwoot.TENANT_PREFIX) else "whatsapp"
        messages = [Message.from_event(e, person) for e in events]
        if messages:
            channel = messages[-1].channel
        if channel == "whatsapp" and not last_inbound:
            # manual_begin.lua answers 0 once the window closed (lib/lastin.lua). 1 (1970)
            # says so to the sender, whose check treats 0 as "unknown".
            last_inbound = 1
        batch = Batch(
            tenant=tenant,
            person=person,
            id=f"manual-{since_ms}-{token[-8:]}",
            token=token,
            attempt=0,
            claimed_ms=since_ms,
            due_ms=since_ms,
            requeued=False,
            messages=messages,
            messages_json=orjson.dumps(events),
            history=[h for h in history if isinstance(h, dict)],
            last_inbound_ts=last_inbound,
        )
        answered = [str(e[f]) for e in events for f in ("id", "target") if e.get(f)]
        return _Hold(k, token, since_ms, batch, channel, answered)

    async def _send(self, hold: _Hold, text: str) -> _Sent:
        """Send the parts (or the template), renewing the lock before each; raises
        `_SendFailed` carrying what went out before the failure."""
        batch = hold.batch
        sender = self._senders.get(hold.channel)
        if sender is None:
            raise _SendFailed(
                f"no sender is configured for {hold.channel} conversations", _Sent([], 1, [])
            )
        if not sender.can_send_text(batch):
            parts = [""]  # the window is closed: the sender sends the tenant's template
        else:
            parts = sender.reply_parts(text)  # as written: no Markdown conversion
        sent = _Sent([], len(parts), [])
        delivery = Delivery()
        for index, part in enumerate(parts):
            if index:
                await self._renew(hold, sent)
            try:
                async with asyncio.timeout(self._send_bound_s):
                    provider_id = await sender.send(batch, part, index, delivery=delivery)
            except Exception as exc:
                raise _SendFailed(self._why(exc, batch.tenant), sent) from exc
            sent.provider_ids.append(str(provider_id or ""))
            if delivery.state.template_sent:
                sent.template = True  # in place of this part and every later one
                break
            sent.texts.append(part)
        return sent

    async def _renew(self, hold: _Hold, sent: _Sent) -> None:
        k, person = hold.k, hold.batch.person
        try:
            (held,) = await self._scripts.renew(
                self._redis, k, lease_ms=self._units.lease_ms, turns=[(person, hold.token)]
            )
        except (RedisError, OSError) as exc:
            raise _SendFailed(f"Redis did not answer: {explain(exc)}", sent) from exc
        if not int(held):
            raise _SendFailed("the lock on this person was lost (Redis failed over?)", sent)

    def _why(self, exc: Exception, tenant: str) -> str:
        """What a person reads when a part did not go out (`DeliveryUnknown` is a kind of
        `NeedsReview`: looked at first)."""
        if isinstance(exc, DeliveryUnknown):
            return (
                f"the provider did not answer ({exc.detail}); the reply may have reached the"
                " person: look at the conversation before sending it again"
            )
        if isinstance(exc, NeedsReview):
            if exc.reason == "window_closed":
                return (
                    f"the 24-hour window is closed and tenant {tenant!r} has no template"
                    " (TENANTS_FILE `template`): the person cannot be written to now"
                )
            return f"the provider refused the reply ({exc.reason}): {exc.detail}"
        if isinstance(exc, TimeoutError):
            return (
                f"the provider did not answer within {self._send_bound_s:.0f} s; the reply may"
                " have reached the person: look at the conversation before sending it again"
            )
        if isinstance(exc, RetryLater):
            return f"the provider could not take the reply now ({exc}); try again later"
        return f"the provider refused the reply: {exc}"

    async def _end(self, hold: _Hold, sent: _Sent, by: str) -> int:
        """Record what went out and take the answered messages out of pending; how many."""
        batch, tenant = hold.batch, hold.batch.tenant
        s, own = self._settings, self._settings.tenant(tenant)
        if sent.template:
            name = own.template
            said = f'[The 24-hour window had closed: the WhatsApp template "{name}" went out.]'
        else:
            said = "\n\n".join(sent.texts)
        remember = {
            **exchange(batch, s, said, sent.provider_ids),
            "by": BY_HUMAN,
            "who": by,
            **({"template": own.template} if sent.template else {}),
        }
        t = self._units.tenant(tenant)
        try:
            held, taken = await self._manual_end(
                hold,
                "sent",
                remember=orjson.dumps(remember),
                memory_turns=t.memory_turns,
                memory_ttl_ms=self._units.memory_ttl_ms,
                answered=orjson.dumps(hold.answered),
                # A person is talking with the customer on WhatsApp: the bot waits (takeover);
                # Chatwoot has its own silence, set by the agent's message coming back.
                pause_ms=t.human_pause_ms if hold.channel == "whatsapp" else 0,
                by=by,
                provider_ids=sent.provider_ids,
            )
            await self._wake(tenant)
        except (RedisError, OSError) as exc:
            raise ManualReplyError(
                f"the reply went out ({', '.join(sent.provider_ids)}) but Redis did not record"
                f" it: {explain(exc)}; the waiting messages may be answered by the bot too",
                sent.provider_ids,
            ) from exc
        if not int(held):
            log.warning("reply by hand outlived its lock tenant=%s batch=%s", tenant, batch.id)
        return int(taken)

    async def _release(self, hold: _Hold) -> None:
        """Unlock, as if nothing happened (only this reply's token); best effort: else the
        lease ends it."""
        try:
            await self._manual_end(hold, "release")
            await self._wake(hold.batch.tenant)
        except (RedisError, OSError) as exc:
            log.warning("could not release a reply by hand's lock (its lease ends it): %r", exc)

    async def _manual_end(self, hold: _Hold, outcome: str, **used: Any) -> Any:
        """manual_end.lua for `outcome` with the values it uses (`used`); the others blank."""
        t = self._units.tenant(hold.batch.tenant)
        return await self._scripts.manual_end(
            self._redis,
            hold.k,
            person=hold.batch.person,
            token=hold.token,
            outcome=outcome,
            reply_id=hold.batch.id,
            outbound_ttl_s=OUTBOUND_TTL_S,
            window_ms=t.window_ms,
            max_wait_ms=t.max_wait_ms,
            since_ms=hold.since_ms,
            **{**_END_UNUSED, **used},
        )

    async def _wake(self, tenant: str) -> None:
        """A worker claims the tenant again: what is still waiting gets its due time served
        (a claim during the reply put it off to the lock's end)."""
        await wake.add(self._redis, self._keys.wake_queue, [tenant])


class _SendFailed(Exception):
    def __init__(self, message: str, sent: _Sent) -> None:
        super().__init__(message)
        self.sent = sent


def _checked_text(text: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ManualReplyError("the reply is empty")
    text = text.strip()
    if len(text) > MAX_TEXT_CHARS:
        raise ManualReplyError(
            f"the reply is {len(text)} characters long, more than {MAX_TEXT_CHARS}: shorten it"
        )
    return text


def _checked_by(by: str) -> str:
    if not isinstance(by, str) or not by.strip():
        raise ManualReplyError("say who writes the reply (by)")
    if len(by.strip()) > MAX_BY_CHARS:
        raise ManualReplyError(f"`by` is longer than {MAX_BY_CHARS} characters")
    return by.strip()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
