"""Forgetting a person: delete what the product holds about one person of one tenant.

For privacy requests (docs/operating.md#forgetting-a-person). One call deletes:

- the person's conversation, in one Lua call (shared/lua/forget.lua): every conversation key
  (each kind of `shared.keys.CONVERSATION_KINDS`: pending messages, memory, context, window
  marker, ...), the person's due, running and burst entries, and the `users` fields that map
  a WhatsApp user id to them (or are them). A batch no turn holds (a retry, a late delivery
  failure or an AI wait, maybe parked behind a human's pause) is one of those keys: it goes
  too. Refused (`ForgetError`) only while a turn holds the person's lock: the worker owns the
  conversation until its finish;
- the person's review items (`person` field), read with `HSCAN`, and their review webhook
  events not sent yet;
- the person's outbound records (shared/ops/outbound.py): found with a `SCAN` of the
  whole keyspace (every key of every tenant is looked at once, about 1 s per few million keys;
  fine for a rare action, run it off-peak on a very large Redis);
- the person's replies on the tenant's `outbox` list and entries on its `unroutable` list;
- what the audit log says about them (shared/ops/audit.py `forget_person`: only that something
  happened is kept).

Then one audit entry `action="forget"` records who asked and when. Its `person` is
`audit.FORGOTTEN`, not the number nor a hash of it: phone numbers are few enough that any
hash without a secret can be reversed by trying them all.

Not found here: events of the person still in the tenant's inbox (taken in by a worker within
about a second; a list scan per forget would cost as much as the inbox is long). The report's
`inbox_waiting` says how many events of the tenant were waiting, and `arrived_meanwhile` if
the person wrote again during the call: forget again a minute later then. Messages the
person sends after the forget are new data and are kept like anyone's. Dedupe markers hold
provider ids only, and expire; the dead-letter list holds raw bodies that could not be parsed
(read and delete it by hand).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import orjson

from shared.keys import CONVERSATION_KINDS, LOCK, KeyError_, Keys, TenantKeys
from shared.ops import audit, outbound
from shared.storage.scripts import Scripts, shared_scripts

SCAN_COUNT = 1000  # keys, fields or entries looked at per SCAN/HSCAN round trip
_LOCKED = -1  # forget.lua's state when a turn holds the lock


class ForgetError(Exception):
    """The person cannot be forgotten now, or the ids are wrong; the message says why."""


@dataclass(frozen=True)
class ForgetReport:
    """How many of each thing were deleted, and what may need a second forget."""

    tenant: str
    conversation_keys: int = 0
    queue_entries: int = 0  # due, running, burst, conversations-index entries, windows
    users_fields: int = 0
    review_items: int = 0
    outbound_records: int = 0
    outbox_entries: int = 0
    unroutable_entries: int = 0
    audit_entries: int = 0  # rewritten to keep only that something happened
    inbox_waiting: int = 0  # the tenant's events not taken in yet (not searched)
    arrived_meanwhile: bool = False  # the person has conversation keys again afterwards

    @property
    def deleted(self) -> int:
        """Everything deleted or rewritten."""
        counted = [f.name for f in fields(self) if f.name not in _NOT_COUNTED]
        return sum(int(getattr(self, name)) for name in counted)

    def summary(self) -> str:
        """One line of counts, for the audit entry and the CLI (nothing about the person)."""
        return ", ".join(
            f"{name}={value}" for name, value in asdict(self).items() if name != "tenant"
        )


_NOT_COUNTED = {"tenant", "inbox_waiting", "arrived_meanwhile"}


async def forget_person(
    redis: Any,
    keys: Keys,
    tenant: str,
    person: str,
    *,
    by: str,
    retention_s: float,
    scripts: Scripts | None = None,
) -> ForgetReport:
    """Delete what is held about `person` of `tenant`; `by` is who asked (audit log).

    An unknown person gives a report of zeros (nothing was held: the request is met). Raises
    `ForgetError` for ids that cannot be keys, a tenant that never had traffic, an empty `by`,
    and while a turn of the person runs (nothing deleted then)."""
    k = _tenant_keys(keys, tenant, person)
    if not by.strip():
        raise ForgetError("say who asks for the forget (by): it goes to the audit log")
    if not await redis.sismember(keys.tenants, tenant):
        raise ForgetError(f"tenant {tenant!r} never received traffic: check the id")
    await _refuse_if_running(redis, k, person)
    user_ids = await _users_of(redis, k, person)
    state, conversation_keys, queue_entries, users_fields = await (scripts or Scripts()).forget(
        redis, k, person=person, kinds=",".join(CONVERSATION_KINDS), user_ids=user_ids
    )
    _refuse(int(state), person, "started meanwhile")
    report = ForgetReport(
        tenant,
        conversation_keys=int(conversation_keys),
        queue_entries=int(queue_entries),
        users_fields=int(users_fields),
        review_items=await _forget_review_items(redis, k, person),
        outbound_records=await outbound.forget(redis, k, person),
        outbox_entries=await _forget_list_entries(redis, k.outbox, person),
        unroutable_entries=await _forget_list_entries(redis, k.unroutable, person),
        audit_entries=await audit.forget_person(redis, keys, tenant, person),
        inbox_waiting=int(await redis.llen(k.inbox)),
        arrived_meanwhile=await _held_again(redis, k, person),
    )
    await audit.record(
        redis,
        keys,
        who=by,
        action="forget",
        tenant=tenant,
        person=audit.FORGOTTEN,
        detail=report.summary(),
        retention_s=retention_s,
    )
    return report


def _tenant_keys(keys: Keys, tenant: str, person: str) -> TenantKeys:
    try:
        k = keys.tenant(tenant)
        k.pending(person)  # checks the person id
    except KeyError_ as exc:
        raise ForgetError(str(exc)) from None
    if person != person.strip() or any(ch.isspace() for ch in person):
        raise ForgetError(f"person {person!r} holds white space: not an id the product uses")
    return k


async def _refuse_if_running(redis: Any, k: TenantKeys, person: str) -> None:
    """Before anything is deleted; forget.lua checks again, atomically."""
    if await redis.exists(k.lock(person)):
        _refuse(_LOCKED, person, "runs")


def _refuse(state: int, person: str, when: str) -> None:
    if state == _LOCKED:
        raise ForgetError(
            f"a turn of person {person} {when} (its lock {LOCK} is held): "
            "forget again once it ended (seconds; at most the lease)"
        )


async def _users_of(redis: Any, k: TenantKeys, person: str) -> list[str]:
    """The users fields (WhatsApp user ids) that point at `person`."""
    found = []
    async for field, value in redis.hscan_iter(k.users, count=SCAN_COUNT):
        if _text(value) == person:
            found.append(str(_text(field)))
    return found


async def _forget_review_items(redis: Any, k: TenantKeys, person: str) -> int:
    ids = []
    async for item_id, raw in redis.hscan_iter(k.review, count=SCAN_COUNT):
        if _person_of(raw) == person:
            ids.append(item_id)
    if not ids:
        return 0
    # The items go with their index entries (review_remove.lua); a pending review webhook
    # event holds a copy of the item (shared/lua/lib/review.lua).
    deleted = await shared_scripts().review_remove(redis, k, item_ids=ids)
    pipe = redis.pipeline(transaction=True)
    pipe.zrem(k.review_notify, *ids)
    pipe.hdel(k.review_notify_events, *ids)
    await pipe.execute()
    return int(deleted)


async def _forget_list_entries(redis: Any, key: str, person: str) -> int:
    """Entries of a short list (outbox: capped; unroutable: meant to be empty) that are JSON
    objects naming `person`; each removed by its exact value."""
    removed = 0
    for raw in set(await redis.lrange(key, 0, -1)):
        if _person_of(raw) == person:
            removed += int(await redis.lrem(key, 0, raw))
    return removed


async def _held_again(redis: Any, k: TenantKeys, person: str) -> bool:
    return bool(await redis.exists(*(k.conversation(person, kind) for kind in CONVERSATION_KINDS)))


def _person_of(raw: bytes | str) -> str | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    person = value.get("person") if isinstance(value, dict) else None
    return person if isinstance(person, str) else None


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
