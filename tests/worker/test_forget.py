"""Forgetting a person (shared/ops/forget.py, shared/lua/forget.lua, the `worker.forget` CLI).

Each person's state is built by the real scripts (ingest, claim, record a part, finish), so
what the forget must find is what the worker really writes.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from shared import events
from shared.conversation.burst_shards import burst_shard_of
from shared.keys import CONVERSATION_KINDS, LASTIN, Keys, TenantKeys
from shared.ops import audit, outbound, takeover, window
from shared.ops.forget import ForgetError, ForgetReport, forget_person
from shared.senders.loading import OutboxSender
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts
from tests.delivery.support import push_failed_status
from tests.worker.support import message_event, run_module
from worker.conversation_store import ConversationStore

TENANT, OTHER_TENANT = "106500000000021", "106500000000022"
PERSON, OTHER_PERSON = "5491155550021", "5491155550022"
USER_ID = "AR.1234567890"  # a WhatsApp username's business-scoped user id
RETENTION_S = 30 * 86400.0


class Conversations:
    """Builds a person's state through the worker's own scripts."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.keys = Keys(settings.key_prefix)
        self.scripts = Scripts()
        committer = GroupCommitter(redis, self.scripts)
        self.store = ConversationStore(
            settings.with_overrides(debounce_window_s=0.01, max_wait_s=0.01),
            self.scripts,
            committer,
        )
        self.outbox = OutboxSender(self.keys, committer)
        self._seq = 0

    async def message(self, tenant: str, person: str, text: str, user_id: str = "") -> None:
        self._seq += 1
        ev = message_event(tenant, person, f"wamid.in.{person}.{self._seq}", text)
        if user_id:
            ev["from_user_id"] = user_id
        k = self.keys.tenant(tenant)
        await self.scripts.ingest(
            self.redis,
            k,
            seen=[k.seen(events.dedupe_id(ev))],
            dedupe_ttl_s=60,
            events=[events.encode(ev)],
        )
        await self.redis.sadd(self.keys.tenants, tenant)  # as the receiver does
        await self.store.claim(tenant, 0, "t")  # intake only

    async def claim_one(self, tenant: str, person: str) -> Any:
        await asyncio.sleep(0.05)  # past the debounce
        claim = await self.store.claim(tenant, 5, "t")
        (batch,) = [b for b in claim.batches if b.person == person]
        return batch, claim.now_ms

    async def turns(self, tenant: str, person: str, user_id: str = "") -> None:
        """A review item with a sent part, an answered turn (memory, window, outbound record,
        outbox entry)."""
        await self.scripts.load(self.redis)
        await self.message(tenant, person, "parked", user_id)
        batch, now_ms = await self.claim_one(tenant, person)
        assert await self.store.record_part(batch, 0, f"wamid.out.{tenant}.{person}.1")
        assert await self.store.finish_review(batch, "max_attempts", "boom", now_ms)
        # That review paused the bot for the person (a human's turn); lift it to go on.
        await takeover.resume(self.redis, self.keys, tenant, person, by="ana")
        await self.message(tenant, person, "answered")
        batch, _ = await self.claim_one(tenant, person)
        await self.outbox.send(batch, "the reply", 0)
        remember = orjson.dumps({"user": "answered", "assistant": "the reply"})
        assert await self.store.finish_done(
            batch, remember, last_part=(0, f"wamid.out.{tenant}.{person}.2")
        )

    async def waiting(self, tenant: str, person: str) -> None:
        """What waits for the person's next turn: a context event, a message; and an
        unroutable entry, an audit entry (after every turn: a claim would take them)."""
        k = self.keys.tenant(tenant)
        await self.redis.rpush(k.context(person), orjson.dumps({"what": "reaction"}))
        await self.redis.rpush(k.unroutable, orjson.dumps({"v": 1, "person": person}))
        await self.message(tenant, person, "waiting")
        await audit.record(
            self.redis,
            self.keys,
            who="ana",
            action="reply",
            tenant=tenant,
            person=person,
            detail="replied: my address is Calle 1",
            retention_s=RETENTION_S,
        )
        # As a Chatwoot conversation's silence would be (lib/silence.lua writes it at intake);
        # last: messages that arrive while it lasts go to the memory, not the pending list.
        await self.redis.set(k.silent(person), orjson.dumps({"why": "assignee"}))

    async def everything(self, *people: tuple[str, str, str]) -> None:
        """Turns, then what waits, of each (tenant, person, user id)."""
        for tenant, person, user_id in people:
            await self.turns(tenant, person, user_id)
        for tenant, person, _ in people:
            await self.waiting(tenant, person)


async def snapshot(redis: Redis) -> dict[str, Any]:
    """Every key and its content, comparable (the audit log aside)."""
    found: dict[str, Any] = {}
    async for raw in redis.scan_iter(match="*", count=1000):
        key = raw.decode()
        kind = (await redis.type(key)).decode()
        if kind == "string":
            found[key] = await redis.get(key)
        elif kind == "list":
            found[key] = await redis.lrange(key, 0, -1)
        elif kind == "hash":
            found[key] = await redis.hgetall(key)
        elif kind == "zset":
            found[key] = await redis.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            found[key] = await redis.smembers(key)
    return found


def about(
    person: str, k: TenantKeys, key: str, value: Any, items: frozenset[bytes] = frozenset()
) -> Any:
    """`value` of `key` without what concerns `person` of the tenant of `k`; None: the key is
    the person's own. `items`: the ids of the person's review items (their index entries go
    with them, and the counts drop by as many)."""
    if key == k.review_ix or key.startswith((k.review_ix_reason_prefix, f"{k.review_ix}:p:")):
        return [(m, s) for m, s in value if m.split(b":", 1)[1] not in items] or None
    if key == k.review_ix_of:
        return {f: v for f, v in value.items() if f not in items} or None
    if key == k.review_counts:
        return {
            r: str(int(n) - len(items)).encode() for r, n in value.items() if int(n) > len(items)
        } or None
    if key.startswith(f"{k.conversation_prefix}{person}:"):
        return None
    if key.startswith(k.outbound_prefix):
        return None if value.get(b"person") == person.encode() else value
    if key.startswith(k.lastin_book) and key != k.lastin_gens:  # the windows: person -> ts
        return {f: v for f, v in value.items() if f != person.encode()} or None
    if key.startswith(k.outbound_book) and key != k.outbound_gens:
        return {f: v for f, v in value.items() if outbound.person_of(v) != person} or None
    if key in (k.due, k.running, k.conversations):
        return [(m, s) for m, s in value if m != person.encode()] or None
    if key == k.burst or key.startswith(f"{k.burst}:"):  # the bursts, or a shard of them
        return {f: v for f, v in value.items() if f != person.encode()} or None
    if key == k.users:
        return {f: v for f, v in value.items() if v != person.encode()} or None
    if key == k.review:
        kept = {f: v for f, v in value.items() if orjson.loads(v)["person"] != person}
        return kept or None
    if key in (k.outbox, k.unroutable):
        return [v for v in value if orjson.loads(v)["person"] != person] or None
    return value


@pytest.mark.cluster
async def test_forget_deletes_everything_of_the_person_and_nothing_else(
    redis: Redis, settings: Settings
) -> None:
    made = Conversations(redis, settings)
    await made.everything(
        (TENANT, PERSON, USER_ID),
        (TENANT, OTHER_PERSON, ""),  # another number, same tenant
        (OTHER_TENANT, PERSON, ""),  # the same number, another tenant
    )
    # A person took the conversation over (shared/ops/takeover.py): the pause is forgotten too.
    await takeover.pause(redis, made.keys, TENANT, PERSON, by="ana", why="replying", seconds=600)
    k = made.keys.tenant(TENANT)
    await takeover.pause(redis, made.keys, TENANT, PERSON, by="ana", why="taking over", seconds=600)
    # As a late delivery failure's note would be (shared/lua/lib/outbound.lua).
    await redis.hset(k.late(PERSON), "template:b1", "sent")
    # The person has something under every kind of key listed to be forgotten, but a lock
    # and a batch (the forget is refused while those exist: tested below).
    # The window is a field of the book of windows, not a key (LASTIN: the release before's).
    for kind in set(CONVERSATION_KINDS) - {"lock", "batch", LASTIN}:
        assert await redis.exists(k.conversation(PERSON, kind)), kind
    assert (await window.last_inbound(redis, k, [PERSON]))[0][0] > 0, "the window is open"
    assert await redis.hget(k.users, USER_ID) == PERSON.encode()
    before = await snapshot(redis)

    report = await forget_person(
        redis, made.keys, TENANT, PERSON, by="ana", retention_s=RETENTION_S
    )

    assert report == ForgetReport(
        TENANT,
        conversation_keys=7,  # pending, memory, context, silent, human, sent, late
        queue_entries=4,  # due, burst, the conversations index (the inbox), the window
        users_fields=1,
        review_items=1,
        outbound_records=2,
        outbox_entries=1,
        unroutable_entries=1,
        audit_entries=1,
    )
    after = await snapshot(redis)
    audit_key = made.keys.audit
    items = frozenset(f for f, v in before[k.review].items() if orjson.loads(v)["person"] == PERSON)
    expected = {
        key: kept
        for key, value in before.items()
        if key != audit_key and (kept := about(PERSON, k, key, value, items)) is not None
    }
    assert {key: v for key, v in after.items() if key != audit_key} == expected
    # The audit log: the entry about the person keeps only that it happened, and the forget
    # itself is recorded without the number.
    entries = await audit.entries(redis, made.keys)
    assert PERSON.encode() not in orjson.dumps(
        [e for e in entries if e.tenant == TENANT and e.person != OTHER_PERSON]
    )
    forget = entries[0]
    assert (forget.action, forget.who, forget.tenant, forget.person) == (
        "forget",
        "ana",
        TENANT,
        audit.FORGOTTEN,
    )
    assert "review_items=1" in forget.detail
    # Both replies may share a millisecond, so their order in the log is not the point.
    assert sorted(e.detail for e in entries if e.tenant == TENANT and e.action == "reply") == [
        "",
        "replied: my address is Calle 1",  # the other person's
    ]
    # Once more: nothing is left, so a report of zeros.
    again = await forget_person(redis, made.keys, TENANT, PERSON, by="ana", retention_s=1e6)
    assert again.deleted == 0


async def test_a_message_after_the_forget_is_kept_whole_as_new_data(
    redis: Redis, settings: Settings
) -> None:
    made = Conversations(redis, settings)
    await made.everything((TENANT, PERSON, ""))
    await forget_person(redis, made.keys, TENANT, PERSON, by="ana", retention_s=RETENTION_S)
    k = made.keys.tenant(TENANT)

    await made.message(TENANT, PERSON, "hola otra vez")

    assert [orjson.loads(m)["text"] for m in await redis.lrange(k.pending(PERSON), 0, -1)] == [
        "hola otra vez"
    ]
    assert await redis.zscore(k.due, PERSON) is not None and await redis.hget(
        k.burst_shard(burst_shard_of(PERSON)), PERSON
    )
    batch, _ = await made.claim_one(TENANT, PERSON)
    assert batch.texts == ["hola otra vez"]


def test_every_kind_of_conversation_key_is_forgotten() -> None:
    """Each `TenantKeys` method that names one key of a person's conversation is a kind that
    forget.lua deletes: a new kind of key must join `CONVERSATION_KINDS`."""
    k = Keys().tenant(TENANT)
    for name, method in inspect.getmembers(k, inspect.ismethod):
        if list(inspect.signature(method).parameters) != ["person"]:
            continue
        key = method(PERSON)
        assert key.startswith(f"{k.conversation_prefix}{PERSON}:"), name
        assert key.rsplit(":", 1)[1] in CONVERSATION_KINDS, f"{name}: add it to CONVERSATION_KINDS"


async def test_refused_while_a_turn_runs_and_nothing_is_deleted(
    redis: Redis, settings: Settings
) -> None:
    made = Conversations(redis, settings)
    await made.everything((TENANT, PERSON, ""))
    await made.claim_one(TENANT, PERSON)  # the waiting message: a turn runs
    before = await snapshot(redis)

    with pytest.raises(ForgetError, match=r"a turn of person \d+ runs"):
        await forget_person(redis, made.keys, TENANT, PERSON, by="ana", retention_s=RETENTION_S)
    assert await snapshot(redis) == before


async def test_a_batch_waiting_for_a_retry_is_forgotten_with_the_rest(
    redis: Redis, settings: Settings
) -> None:
    """Issue 21: the batch a failed turn left to be retried is held by no turn (no lock): it
    went with everything else, instead of refusing until the retry ran."""
    made = Conversations(redis, settings)
    await made.everything((TENANT, PERSON, ""), (TENANT, OTHER_PERSON, ""))
    k = made.keys.tenant(TENANT)
    batch, _ = await made.claim_one(TENANT, PERSON)
    assert await made.store.finish_retry(batch, 60, "boom")
    assert not await redis.exists(k.lock(PERSON)) and await redis.exists(k.batch(PERSON))
    before = await snapshot(redis)

    report = await forget_person(
        redis, made.keys, TENANT, PERSON, by="ana", retention_s=RETENTION_S
    )

    assert report.conversation_keys == 4  # the batch, memory, silent, sent
    assert report.queue_entries == 3  # due: the retry's time; the conversations index; window
    assert await forgotten_alone(redis, made.keys, TENANT, PERSON, before)


async def test_a_late_failure_waiting_behind_a_human_pause_is_forgotten_by_the_cli(
    redis: Redis, settings: Settings
) -> None:
    """Issue 21: Meta reports a sent reply failed while a human has the conversation. The late
    failure becomes a batch that no turn holds (the claim skips a paused person until the
    pause ends); the forget was refused (409 on the ops page) until someone resumed the bot and
    it ran an AI turn and a reply. Now the CLI forgets that batch with the rest (the pause
    too), and another person's state is untouched."""
    made = Conversations(redis, settings)
    for person in (PERSON, OTHER_PERSON):
        await made.turns(TENANT, person)
        await takeover.pause(redis, made.keys, TENANT, person, by="ana", why="mine", seconds=600)
        wamid = f"wamid.out.{TENANT}.{person}.2"
        await push_failed_status(redis, settings.key_prefix, person, wamid, 131026, TENANT)
    k = made.keys.tenant(TENANT)
    claim = await made.store.claim(TENANT, 5, "t")
    assert claim.batches == []  # both paused: no turn
    late = await redis.hgetall(k.batch(PERSON))
    assert b"late_jobs" in late and not await redis.exists(k.lock(PERSON))
    assert (await redis.zscore(k.due, PERSON) or 0) > claim.now_ms  # the pause's end
    before = await snapshot(redis)

    done = forget_cli(settings, "--tenant", TENANT, "--person", PERSON, "--by", "ana", "--yes")

    assert done.returncode == 0, done.stderr
    assert f"forgot {PERSON} in tenant {TENANT}" in done.stdout
    assert await forgotten_alone(redis, made.keys, TENANT, PERSON, before)
    assert not await redis.exists(k.batch(PERSON), k.late(PERSON), k.human(PERSON))
    assert await redis.exists(k.batch(OTHER_PERSON)), "the other person's late failure waits"
    # Nothing is left for a worker to claim: the claim finds no batch and makes none.
    assert (await made.store.claim(TENANT, 5, "t")).batches == []
    assert not await redis.exists(k.batch(PERSON))


async def forgotten_alone(
    redis: Redis, keys: Keys, tenant: str, person: str, before: dict[str, Any]
) -> bool:
    """Nothing of `person` is left, and everything else is as in `before` (the audit aside)."""
    k = keys.tenant(tenant)
    review = before.get(k.review, {})
    items = frozenset(f for f, v in review.items() if orjson.loads(v)["person"] == person)
    expected = {
        key: kept
        for key, value in before.items()
        if key != keys.audit and (kept := about(person, k, key, value, items)) is not None
    }
    after = {key: v for key, v in (await snapshot(redis)).items() if key != keys.audit}
    assert after == expected
    return True


def forget_cli(settings: Settings, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`python -m worker.forget` against the test's Redis."""
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "REDIS_CLUSTER": "false",
        "KEY_PREFIX": settings.key_prefix,
    }
    return run_module("worker.forget", *args, env=env, stdin=stdin, timeout_s=60)


async def test_the_script_checks_the_lock_itself(redis: Redis, settings: Settings) -> None:
    """A turn that starts between the first check and the script: the script refuses."""
    made = Conversations(redis, settings)
    await made.everything((TENANT, PERSON, ""))
    k = made.keys.tenant(TENANT)
    await redis.set(k.lock(PERSON), "tok", px=60_000)
    before = await snapshot(redis)
    kinds = ",".join(CONVERSATION_KINDS)
    refused = await made.scripts.forget(redis, k, person=PERSON, kinds=kinds, user_ids=[])
    assert refused == [-1, 0, 0, 0]
    assert await snapshot(redis) == before


async def test_bad_input_gets_a_clear_error_and_changes_nothing(
    redis: Redis, settings: Settings
) -> None:
    made = Conversations(redis, settings)
    await made.everything((TENANT, PERSON, ""))
    keys = made.keys
    before = await snapshot(redis)
    cases = [
        (TENANT, "{x}", "ana", "cannot be used in a Redis key"),
        (TENANT, "", "ana", "cannot be used in a Redis key"),
        (TENANT, "549 1155", "ana", "white space"),
        ("a{b", PERSON, "ana", "cannot be used in a Redis key"),
        ("106500000000099", PERSON, "ana", "never received traffic"),
        (TENANT, PERSON, " ", "say who asks"),
    ]
    for tenant, person, by, error in cases:
        with pytest.raises(ForgetError, match=error):
            await forget_person(redis, keys, tenant, person, by=by, retention_s=RETENTION_S)
    assert await snapshot(redis) == before
    assert len(await audit.entries(redis, keys)) == 1  # the one `everything` wrote


async def test_an_unknown_person_gets_a_report_of_zeros_and_an_audit_entry(
    redis: Redis, settings: Settings
) -> None:
    made = Conversations(redis, settings)
    await made.everything((TENANT, PERSON, ""))
    before = await snapshot(redis)

    report = await forget_person(
        redis, made.keys, TENANT, "5491100000000", by="ana", retention_s=RETENTION_S
    )

    assert report == ForgetReport(TENANT) and report.deleted == 0
    after = await snapshot(redis)
    assert after.pop(made.keys.audit) != before.pop(made.keys.audit)
    assert after == before
    newest = (await audit.entries(redis, made.keys))[0]
    assert (newest.action, newest.person) == ("forget", audit.FORGOTTEN)


async def test_the_report_says_when_to_forget_again(redis: Redis, settings: Settings) -> None:
    """An event of the tenant still in the inbox is not searched: the report counts them."""
    made = Conversations(redis, settings)
    await made.everything((TENANT, PERSON, ""))
    k = made.keys.tenant(TENANT)
    ev = events.encode({"v": 1, "kind": "message", "person": PERSON, "id": "x"})
    await made.scripts.ingest(redis, k, seen=[k.seen("whatsapp:x")], dedupe_ttl_s=60, events=[ev])

    report = await forget_person(
        redis, made.keys, TENANT, PERSON, by="ana", retention_s=RETENTION_S
    )

    assert report.inbox_waiting == 1 and not report.arrived_meanwhile


async def test_cli_end_to_end(redis: Redis, settings: Settings) -> None:
    made = Conversations(redis, settings)
    await made.everything((TENANT, PERSON, ""))
    k = made.keys.tenant(TENANT)

    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return forget_cli(settings, *args, stdin=stdin)

    who = ["--tenant", TENANT, "--person", PERSON, "--by", "ana"]
    declined = cli(*who, stdin="no\n")
    assert declined.returncode == 2 and "nothing deleted" in declined.stderr
    assert await redis.exists(k.memory(PERSON))

    done = cli(*who, stdin="yes\n")
    assert done.returncode == 0, done.stderr
    assert f"forgot {PERSON} in tenant {TENANT}" in done.stdout
    assert "review_items=1" in done.stdout
    assert not await redis.exists(k.memory(PERSON))

    again = cli(*who, "--yes")
    assert again.returncode == 0 and "nothing held about" in again.stdout

    bad = cli("--tenant", TENANT, "--person", "{x}", "--by", "ana", "--yes")
    assert bad.returncode == 1 and "cannot be used in a Redis key" in bad.stderr

    await redis.set(k.lock(PERSON), "tok", px=60_000)
    busy = cli(*who, "--yes")
    assert busy.returncode == 1 and "forget again once it ended" in busy.stderr

    nowhere = settings.with_overrides(redis_url="redis://127.0.0.1:1/0")  # nothing listens there
    down = forget_cli(nowhere, *who, "--yes")
    assert down.returncode == 1 and "cannot reach Redis" in down.stderr


async def test_a_review_items_webhook_event_not_sent_yet_is_forgotten_with_it(
    redis: Redis, settings: Settings
) -> None:
    """With a review webhook configured, each review item has a pending event holding a copy
    of it (shared/lua/lib/review.lua): forgetting the person deletes that copy too, and no
    other person's (no worker runs here, so nothing is sent meanwhile)."""
    hooked = settings.with_overrides(
        review_webhook_url="http://127.0.0.1:9/review", review_webhook_secret="s"
    )
    made = Conversations(redis, hooked)
    await made.turns(TENANT, PERSON)
    await made.turns(TENANT, OTHER_PERSON)
    k = made.keys.tenant(TENANT)
    assert await redis.zcard(k.review_notify) == 2
    assert await redis.hlen(k.review_notify_events) == 2

    report = await forget_person(
        redis, made.keys, TENANT, PERSON, by="ana", retention_s=RETENTION_S
    )

    assert report.review_items == 1
    (left,) = await redis.zrange(k.review_notify, 0, -1)
    (event,) = (await redis.hgetall(k.review_notify_events)).values()
    assert PERSON.encode() not in left + event
    assert OTHER_PERSON.encode() in event
