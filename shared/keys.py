"""Every Redis key of the product is spelled here, and only here.

All keys of one tenant carry the tenant id as a Redis Cluster hash tag (`{tenant}`), so every
Lua script touches one slot and the same code runs on one Redis or on a cluster. The few
fleet-wide keys (the tenant registry, the wake-up queues, the dead-letter list, the sweep
guard, the AI pause) are never used together with a tenant's keys inside one script.

Every key, with its type and what it holds, is a row of the key table in docs/architecture.md
("Redis key layout"; tests/test_docs.py fails when a key spelled here has no row there, or a row no
key). Each property below says the same in a line or two. A tenant's keys look like
`wa:{106540352242922}:due`, a person's like `wa:{106540352242922}:c:16505551234:pending`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

# Outbound records live as long as a provider may still send statuses: Meta retries a webhook
# for up to 7 days, so a `failed` status may come that long after it happened.
OUTBOUND_TTL_S = 7 * 24 * 3600


class KeyError_(ValueError):
    """An id that cannot be used inside a key (it would break the hash tag)."""


def _check(part: str, what: str) -> str:
    if not part or "{" in part or "}" in part:
        raise KeyError_(f"{what} {part!r} cannot be used in a Redis key")
    return part


# How many tenants' keys a process keeps worked out (a fleet serves a few hundred; past that
_TENANTS_CACHED = 10_000  # each call spells them again).
# The product's Redis function libraries -> ms of their last load (shared/storage/functions.py):
FUNCTIONS = "wa:functions"  # server-wide like the functions, so not under KEY_PREFIX


@dataclass(frozen=True)
class Keys:
    prefix: str = "wa"
    # Tenant id -> its keys (`tenant`), up to `_TENANTS_CACHED` of them.
    _tenants: dict[str, TenantKeys] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    # --- fleet-wide ---------------------------------------------------------------------
    @property
    def tenants(self) -> str:
        return f"{self.prefix}:tenants"

    @property
    def wake_queue(self) -> str:
        """Tenants with new events to take in; every worker takes from it (shared/fleet/wake.py)."""
        return f"{self.prefix}:wake"

    @property
    def relay_queue(self) -> str:
        """Tenants with a conversation due that their worker could not start (no free slot,
        shutting down), relayed to the fleet; only workers with a free slot take from it."""
        return f"{self.prefix}:relay"

    @property
    def legacy_relay_queue(self) -> str:
        """The relay queue's name before the release that renamed it: workers of that
        release still relay there during a rolling deploy, so new workers drain it too
        (shared/fleet/wake.py). Remove after one release."""
        return f"{self.prefix}:handoff"

    @property
    def worker_client_prefix(self) -> str:
        """What the names of the workers' wake-up connections start with (`CLIENT LIST`)."""
        return f"{self.prefix}:worker:"

    def worker_client_name(self, worker_id: str) -> str:
        """The name of a worker's wake-up connections: spaces and newlines are not allowed."""
        return self.worker_client_prefix + "".join("_" if ch.isspace() else ch for ch in worker_id)

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}:deadletter"

    @property
    def sweep_guard(self) -> str:
        """Set NX with a PX by the worker that does the fleet's safety sweep this interval."""
        return f"{self.prefix}:sweep"

    @property
    def ai_paused(self) -> str:
        """While the AI fails as a whole, the fleet's pause: JSON `until_ms`, `level`, `why`
        (worker/brains/ai_pause.py); outlives the pause a while, to remember how long the last
        was."""
        return f"{self.prefix}:ai:paused"

    @property
    def ai_probe(self) -> str:
        """Set NX with a PX by the one worker that asks the AI again when a pause ends."""
        return f"{self.prefix}:ai:probe"

    @property
    def workers(self) -> str:
        """Worker id -> its last heartbeat, JSON (shared/fleet/heartbeats.py); the workers write
        and prune it."""
        return f"{self.prefix}:workers"

    @property
    def audit(self) -> str:
        """What people did on the ops page and with the CLIs: JSON entries scored by ms
        (shared/ops/audit.py), kept `REVIEW_RETENTION_S`."""
        return f"{self.prefix}:ops:audit"

    def ops_session(self, session_id: str) -> str:
        """One signed-in session of the ops page: who, PX the session's lifetime. The cookie
        names it; signing out deletes it, which revokes the cookie and its CSRF token in every
        receiver process (receiver/ops/auth.py)."""
        return f"{self.prefix}:ops:session:{session_id}"

    @property
    def ops_sessions(self) -> str:
        """The sessions of the ops page as its sessions page lists them: HASH session id ->
        JSON who, admin, since_ms, expires_ms, address. Only a list: `ops_session` decides
        whether a session is live, and entries whose key is gone are dropped when read."""
        return f"{self.prefix}:ops:sessions"

    def ops_signin_client(self, address: str) -> str:
        """Failed sign-ins to the ops page from one client address: `failures`, `until_ms`
        (receiver/ops/backoff.py). The `{signin}` hash tag puts it in one slot with the
        name's counter, which one script reads and counts together."""
        return f"{self.prefix}:ops:{{signin}}:client:{address}"

    def ops_signin_name(self, name: str) -> str:
        """Failed sign-ins to the ops page under one name (casefolded), as
        `ops_signin_client`. Braces in the name are harmless: the first `{…}` is the tag."""
        return f"{self.prefix}:ops:{{signin}}:name:{name}"

    def ops_bulk(self, job: str) -> str:
        """One bulk action of the ops page (receiver/ops/bulk.py): its filter, counts, each
        tenant's cursor and its state, kept a day."""
        return f"{self.prefix}:ops:bulk:{{{_check(job, 'job')}}}"

    def ops_bulk_run(self, job: str) -> str:
        """Held (SET NX PX) by the one process running the bulk action."""
        return f"{self.ops_bulk(job)}:run"

    @property
    def review_notify_queue(self) -> str:
        """Tenants with a review notification to send now (worker/fleet/review_notifier.py): the
        sweep and shutting-down workers add them (`ZADD NX`), any worker takes them."""
        return f"{self.prefix}:review:notify"

    @property
    def chatwoot_catchup_lock(self) -> str:
        """Set NX PX (renewed) by the one worker running the Chatwoot catch-up."""
        return f"{self.prefix}:cw:catchup:lock"

    @property
    def chatwoot_catchup_due(self) -> str:
        """Set NX PX `CHATWOOT_CATCHUP_INTERVAL_S` by the worker that starts a periodic run."""
        return f"{self.prefix}:cw:catchup:due"

    @property
    def chatwoot_catchup_wanted(self) -> str:
        """Chatwoot tenant -> ms of a webhook a receiver could not store: a catch-up is owed."""
        return f"{self.prefix}:cw:catchup:wanted"

    @property
    def chatwoot_catchup_cursor(self) -> str:
        """Chatwoot tenant -> the last activity (unix s) its catch-up read through."""
        return f"{self.prefix}:cw:catchup:cursor"

    @property
    def chatwoot_catchup_resume(self) -> str:
        """Chatwoot tenant -> "position floor top": where an unfinished pass goes on."""
        return f"{self.prefix}:cw:catchup:resume"

    # --- per tenant ---------------------------------------------------------------------
    def tenant(self, tenant: str) -> TenantKeys:
        """A tenant's keys; one object per tenant, so each name is spelled once per process
        (a turn's script calls read five or six of them)."""
        keys = self._tenants.get(tenant)
        if keys is None:
            keys = TenantKeys(f"{self.prefix}:{{{_check(tenant, 'tenant')}}}")
            if len(self._tenants) < _TENANTS_CACHED:
                self._tenants[tenant] = keys
        return keys


@dataclass(frozen=True)
class TenantKeys:
    base: str

    @cached_property
    def inbox(self) -> str:
        return f"{self.base}:inbox"

    def seen(self, dedupe_id: str) -> str:
        """The dedupe marker of one item as the release before kept it (a key each). The
        ingest script reads it (one may live `DEDUPE_TTL_S` after an upgrade), hashes its name
        into the tenant's book of markers (`seen_book`) and writes only there."""
        return f"{self.base}:{SEEN}:{dedupe_id}"

    @cached_property
    def seen_book(self) -> str:
        """The prefix of the tenant's dedupe markers, packed by shared/lua/lib/book.lua."""
        return f"{self.base}:{SEEN_BOOK}:"

    @cached_property
    def seen_gens(self) -> str:
        """The generations of `seen_book` (lib/book.lua)."""
        return f"{self.seen_book}{BOOK_GENS}"

    def seen_shard(self, start: str, shard: str) -> str:
        """One shard of a generation of `seen_book` (the scripts build these names)."""
        return f"{self.seen_book}{start}:{shard}"

    @cached_property
    def seen_book_pattern(self) -> str:
        """A SCAN MATCH pattern for every key of `seen_book`, its generations included."""
        return f"{_glob_escape(self.seen_book)}*"

    @cached_property
    def due(self) -> str:
        return f"{self.base}:due"

    @cached_property
    def running(self) -> str:
        return f"{self.base}:running"

    @cached_property
    def burst(self) -> str:
        return f"{self.base}:burst"

    def burst_shard(self, shard: str) -> str:  # shared/conversation/burst_shards.py
        return f"{self.burst}:{shard}"

    @cached_property
    def review(self) -> str:
        return f"{self.base}:review"

    @cached_property
    def conversations(self) -> str:
        """Person -> the ms of their conversation's last activity (shared/conversation/index.py):
        written by the claim, the finish and a reply by hand, never by the receiver."""
        return f"{self.base}:convs"

    @cached_property
    def review_notify(self) -> str:
        """Review item id -> when its webhook may next be tried (ms): queued with the item by
        shared/lua/lib/review.lua when `REVIEW_WEBHOOK_URL` is set
        (worker/fleet/review_notifier.py)."""
        return f"{self.review}:notify"

    @cached_property
    def review_notify_events(self) -> str:
        """Review item id -> its notification (JSON); lib/review.lua finds it as
        `review_notify` + ':' + NOTIFY_EVENTS."""
        return f"{self.review_notify}:{NOTIFY_EVENTS}"

    @cached_property
    def review_ix(self) -> str:
        """Every review item as "<ms, 16 digits>:<id>" (score 0, read BYLEX), kept by the
        scripts that add and remove items (shared/lua/lib/review.lua)."""
        return f"{self.review}:{REVIEW_IX}"

    @cached_property
    def review_ix_reason_prefix(self) -> str:
        """Scripts append a reason to this to reach that reason's index (as `review_ix`)."""
        return f"{self.review_ix}:{REVIEW_IX_REASON}:"

    def review_ix_reason(self, reason: str) -> str:
        return f"{self.review_ix_reason_prefix}{reason}"

    def review_ix_person(self, person_id: str) -> str:
        """One person's review items, as `review_ix` (the conversation view reads it). Not a
        conversation key: it goes when the person's last item does (forgetting a person
        removes the items, shared/ops/forget.py)."""
        return f"{self.review_ix}:{REVIEW_IX_PERSON}:{_check(person_id, 'person')}"

    @cached_property
    def review_ix_of(self) -> str:
        """Review item id -> JSON {at, reason, person}: where its index entries are."""
        return f"{self.review_ix}:{REVIEW_IX_OF}"

    @cached_property
    def review_counts(self) -> str:
        """Reason -> how many review items, kept by the same scripts (never recounted)."""
        return f"{self.review_ix}:{REVIEW_COUNTS}"

    @cached_property
    def review_ix_fill(self) -> str:
        """The HSCAN cursor of the backfill that indexes items parked by the previous release
        (shared/ops/review_index.py)."""
        return f"{self.review_ix}:fill"

    @cached_property
    def outbox(self) -> str:
        return f"{self.base}:outbox"

    @cached_property
    def stats(self) -> str:
        return f"{self.base}:stats"

    @cached_property
    def unroutable(self) -> str:
        return f"{self.base}:unroutable"

    @cached_property
    def users(self) -> str:
        """A person's business-scoped user id -> the phone number their conversation is keyed
        by (claim.lua), so one seen with both keeps one conversation."""
        return f"{self.base}:users"

    @cached_property
    def conversation_prefix(self) -> str:
        """Scripts append `<person>:pending|batch|lock` to this to reach a conversation's keys."""
        return f"{self.base}:c:"

    def pending(self, person: str) -> str:
        return f"{self.conversation_prefix}{_check(person, 'person')}:{PENDING}"

    def batch(self, person: str) -> str:
        return f"{self.conversation_prefix}{_check(person, 'person')}:{BATCH}"

    def lock(self, person: str) -> str:
        return f"{self.conversation_prefix}{_check(person, 'person')}:{LOCK}"

    def last_inbound(self, person: str) -> str:
        """A 24-hour window of the release before (a key each): read, never written."""
        return f"{self.conversation_prefix}{_check(person, 'person')}:{LASTIN}"

    @cached_property
    def lastin_book(self) -> str:
        """The tenant's book of 24-hour windows, person -> ts (shared/lua/lib/lastin.lua)."""
        return f"{self.base}:{LASTIN_BOOK}:"

    @cached_property
    def lastin_gens(self) -> str:
        return f"{self.lastin_book}{BOOK_GENS}"

    def memory(self, person: str) -> str:
        return f"{self.conversation_prefix}{_check(person, 'person')}:{MEMORY}"

    def context(self, person: str) -> str:
        return f"{self.conversation_prefix}{_check(person, 'person')}:{CONTEXT}"

    def conversation(self, person: str, kind: str) -> str:
        """The key of one kind (one of CONVERSATION_KINDS) of a person's conversation."""
        return f"{self.conversation_prefix}{_check(person, 'person')}:{kind}"

    def silent(self, person: str) -> str:
        """While a person of the business handles a Chatwoot conversation, the bot is silent
        there: JSON `why`, `since_ms`, `since_s`, `by` (shared/lua/lib/silence.lua)."""
        return f"{self.conversation_prefix}{_check(person, 'person')}:{SILENT}"

    def human(self, person: str) -> str:
        """While it exists a human has the conversation and the bot sends nothing to this
        person (shared/ops/takeover.py): JSON `by`, `why`, `since_ms`, `until_ms`, PX the pause."""
        return f"{self.conversation_prefix}{_check(person, 'person')}:{HUMAN}"

    def sent(self, person: str) -> str:
        """The last batches answered (messages and reply, JSON), newest first: what a late
        delivery failure's review item carries (shared/lua/lib/outbound.lua)."""
        return f"{self.conversation_prefix}{_check(person, 'person')}:{SENT}"

    def late(self, person: str) -> str:
        """Late delivery failures (`failed` statuses of parts Meta had accepted) waiting for
        the worker, and per batch whether its template was already sent."""
        return f"{self.conversation_prefix}{_check(person, 'person')}:{LATE}"

    def conversations_pattern(self, kind: str) -> str:
        """A SCAN MATCH pattern for one kind of conversation key (PENDING, BATCH, ...) of
        every person of the tenant; `person_in` reads the person back from a match."""
        return f"{_glob_escape(self.conversation_prefix)}*:{kind}"

    def person_in(self, key: str, kind: str) -> str | None:
        """The person of a conversation key of `kind`, or None if `key` is not one."""
        head, tail = self.conversation_prefix, f":{kind}"
        if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
            return key[len(head) : -len(tail)]
        return None

    @cached_property
    def outbound_prefix(self) -> str:
        """What scripts are given to reach the outbound records: a provider id appended to it
        names the key of a status that came before its record (`outbound`), and
        lib/keys.lua's `out_book` turns it into `outbound_book`."""
        return f"{self.base}:{OUTBOUND}:"

    def outbound(self, provider_id: str) -> str:
        """A status parked before its part's record existed, or a record of the release
        before (a hash each); records themselves are in `outbound_book`."""
        return f"{self.outbound_prefix}{provider_id}"

    @cached_property
    def outbound_pattern(self) -> str:
        """A SCAN MATCH pattern for every `outbound` key of the tenant."""
        return f"{_glob_escape(self.outbound_prefix)}*"

    @cached_property
    def outbound_book(self) -> str:
        """The prefix of the tenant's outbound records, packed by shared/lua/lib/book.lua."""
        return f"{self.base}:{OUTBOUND_BOOK}:"

    @cached_property
    def outbound_gens(self) -> str:
        """The generations of `outbound_book` (lib/book.lua)."""
        return f"{self.outbound_book}{BOOK_GENS}"

    def outbound_shard(self, start: str, shard: str) -> str:
        """One shard of a generation of `outbound_book` (the scripts build these names)."""
        return f"{self.outbound_book}{start}:{shard}"

    @cached_property
    def outbound_book_pattern(self) -> str:
        """A SCAN MATCH pattern for every key of `outbound_book`, its generations included."""
        return f"{_glob_escape(self.outbound_book)}*"


# Suffixes of a conversation's keys. Scripts that visit many conversations (claim, intake)
# cannot receive every key through KEYS; they get the tenant's conversation prefix, and the
# loader writes these suffixes into shared/lua/lib/keys.lua, so this module stays the only place
# a key is spelled.
PENDING, BATCH, LOCK, LASTIN, MEMORY = "pending", "batch", "lock", "lastin", "memory"
CONTEXT, HUMAN, SENT, LATE, SILENT = "context", "human", "sent", "late", "silent"
# The suffix of a tenant's review notifications (after its notification queue's key), written
# into shared/lua/lib/review.lua by the loader like the suffixes above.
NOTIFY_EVENTS = "events"
# The suffixes of a tenant's review index (after its review hash's key), written into
# shared/lua/lib/review.lua the same way: `<review>:ix`, `:ix:r:<reason>`, `:ix:of`, `:ix:n`.
REVIEW_IX, REVIEW_IX_REASON, REVIEW_IX_OF, REVIEW_COUNTS = "ix", "r", "of", "n"
REVIEW_IX_PERSON = "p"

# The dedupe markers and the outbound records: the keys of the release before (`seen:<id>`,
# `out:<id>`) and the books that replaced them (lib/book.lua: `<book>:gens`, its generations,
# and `<book>:<start>:<shard>`); lib/keys.lua gets these by the loader too.
SEEN, SEEN_BOOK = "seen", "s"
OUTBOUND, OUTBOUND_BOOK = "out", "o"
LASTIN_BOOK = "w"  # the 24-hour windows' book (`c:<person>:lastin` before)
BOOK_GENS = "gens"

# Every kind of conversation key: forgetting a person (shared/ops/forget.py) deletes the keys of
# each kind listed here, so a new kind of conversation key must be added to this tuple too
# (tests/test_forget.py checks that each `TenantKeys` method of one person's key is covered).
CONVERSATION_KINDS = (PENDING, BATCH, LOCK, LASTIN, MEMORY, CONTEXT, SILENT, HUMAN, SENT, LATE)


def _glob_escape(text: str) -> str:
    """Redis glob patterns treat * ? [ ] \\ specially: match them literally."""
    return "".join(f"\\{ch}" if ch in "*?[]\\" else ch for ch in text)
