"""The KEYS and ARGV of every Lua script in shared/lua, built in one place.

One function per script returns `(keys, args)` for `Script.__call__`, `queue` or `command`:

    scripts.claim.queue(pipe, *script_calls.claim(tenant_keys, max_claim=8, ...))

Each list is in the order of the script's header, and its names are the header's: a KEYS entry
is the `TenantKeys` property of that name, an ARGV entry the parameter (or `TenantKeys`
property) of that name. tests/test_lua_headers.py holds each function against its header.
Callers convert units and encode values; these functions only place them.

Every script that can create a review item takes the tenant's review notification queue as
its last ARGV (shared/lua/lib/review.lua), or "" when no review webhook is configured (`notify`
False): then nothing is queued, at no cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.keys import TenantKeys
from shared.storage.scripts import ScriptArg

Call = tuple[list[str], list[ScriptArg]]


def ingest(
    k: TenantKeys, *, seen: Sequence[str], dedupe_ttl_s: int, events: Sequence[bytes]
) -> Call:
    """`seen[i]` is the dedupe marker key of the item encoded as `events[i]`."""
    return [k.inbox, *seen], [dedupe_ttl_s, *events]


def claim(
    k: TenantKeys,
    *,
    max_claim: int,
    lease_ms: int,
    token_prefix: str,
    window_ms: int,
    max_wait_ms: int,
    max_intake: int,
    service_window_s: int,
    early_status_ttl_s: int,
    welcome: int,
    context_ttl_s: int,
    context_max: int,
    silence_ttl_s: int,
    human_pause_ms: int,
    memory_turns: int,
) -> Call:
    """`welcome`: 1 when the tenant has a welcome text (`request_welcome` starts a turn)."""
    return (
        [k.inbox, k.due, k.running, k.burst, k.stats, k.unroutable, k.users],
        [
            k.conversation_prefix,
            max_claim,
            lease_ms,
            token_prefix,
            window_ms,
            max_wait_ms,
            max_intake,
            k.outbound_prefix,
            service_window_s,
            early_status_ttl_s,
            welcome,
            context_ttl_s,
            context_max,
            silence_ttl_s,
            human_pause_ms,
            memory_turns,
        ],
    )


def renew(k: TenantKeys, *, lease_ms: int, turns: Iterable[tuple[str, str]]) -> Call:
    """`turns`: (person, lock token) of each turn whose lease to extend."""
    args: list[ScriptArg] = [k.conversation_prefix, lease_ms]
    for person, token in turns:
        args += [person, token]
    return [k.running], args


def save_reply(k: TenantKeys, *, person: str, token: str, reply: str) -> Call:
    return [k.stats], [k.conversation_prefix, person, token, reply]


def record_part(
    k: TenantKeys,
    *,
    person: str,
    token: str,
    part: int,
    provider_id: str,
    outbound_ttl_s: int,
) -> Call:
    return (
        [k.stats],
        [
            k.conversation_prefix,
            k.outbound_prefix,
            person,
            token,
            part,
            provider_id,
            outbound_ttl_s,
        ],
    )


def mark_template(k: TenantKeys, *, person: str, token: str, mark: str, part: int) -> Call:
    """`mark`: "1" notes the template as going out, "0" clears the note."""
    return [k.stats], [k.conversation_prefix, person, token, mark, part]


def mark_memory(
    k: TenantKeys, *, person: str, token: str, entries: Iterable[tuple[str, bytes]]
) -> Call:
    """`entries`: (provider id of a reply part, the exchange that replaces the one holding it)."""
    args: list[ScriptArg] = [k.conversation_prefix, person, token]
    for provider_id, entry in entries:
        args += [provider_id, entry]
    return [k.stats], args


def journal_review(k: TenantKeys, *, person: str, token: str, journal: str | bytes) -> Call:
    return [k.stats], [k.conversation_prefix, person, token, journal]


def finish(
    k: TenantKeys,
    *,
    person: str,
    token: str,
    outcome: str,
    delay_ms_or_reason: str | int,
    error_or_item: str | bytes,
    window_ms: int,
    max_wait_ms: int,
    remember: bytes,
    memory_turns: int,
    memory_ttl_ms: int,
    last_part: int | str,
    last_part_id: str,
    outbound_ttl_s: int,
    unknown: str,
    count_attempt: int,
    notify: bool,
) -> Call:
    """`outcome` "done", "retry" or "review"; see shared/lua/finish.lua for what each uses
    (`count_attempt`: 1 or 0; `notify`: a review webhook is configured)."""
    return (
        [k.due, k.running, k.burst, k.review, k.stats],
        [
            k.conversation_prefix,
            person,
            token,
            outcome,
            delay_ms_or_reason,
            error_or_item,
            window_ms,
            max_wait_ms,
            remember,
            memory_turns,
            memory_ttl_ms,
            last_part,
            last_part_id,
            k.outbound_prefix,
            outbound_ttl_s,
            unknown,
            count_attempt,
            k.review_notify if notify else "",
        ],
    )


def silence(k: TenantKeys, *, person: str, why: str, memory_ttl_s: int, silence_ttl_s: int) -> Call:
    return [k.due, k.burst, k.stats], [
        k.conversation_prefix,
        person,
        why,
        memory_ttl_s,
        silence_ttl_s,
    ]


def requeue(
    k: TenantKeys, *, item_id: str, person: str, messages: bytes, context: bytes = b""
) -> Call:
    """`context`: the item's context items (JSON array), b"" for none."""
    return [k.due, k.review], [k.conversation_prefix, item_id, person, messages, context]


def forget(k: TenantKeys, *, person: str, kinds: str, user_ids: Sequence[str]) -> Call:
    """`kinds`: shared.keys.CONVERSATION_KINDS joined by commas; `user_ids`: users fields
    seen pointing at `person`."""
    return [k.due, k.running, k.burst, k.users], [k.conversation_prefix, person, kinds, *user_ids]


def manual_begin(k: TenantKeys, *, person: str, token: str, lease_ms: int) -> Call:
    return [k.running], [k.conversation_prefix, person, token, lease_ms]


def manual_end(
    k: TenantKeys,
    *,
    person: str,
    token: str,
    outcome: str,
    reply_id: str,
    remember: bytes,
    memory_turns: int,
    memory_ttl_ms: int,
    outbound_ttl_s: int,
    window_ms: int,
    max_wait_ms: int,
    since_ms: int,
    answered: bytes,
    provider_ids: Sequence[str],
    pause_ms: int = 0,
    by: str = "",
) -> Call:
    """`outcome` "sent" or "release"; `answered`: the answered message ids (JSON array);
    `pause_ms`: how long a reply that went out pauses the bot for the person, `by` who wrote."""
    return (
        [k.due, k.burst, k.stats],
        [
            k.conversation_prefix,
            k.outbound_prefix,
            person,
            token,
            outcome,
            reply_id,
            remember,
            memory_turns,
            memory_ttl_ms,
            outbound_ttl_s,
            window_ms,
            max_wait_ms,
            since_ms,
            answered,
            pause_ms,
            by,
            *provider_ids,
        ],
    )


def review_notify_take(k: TenantKeys, *, most: int, lease_ms: int, token: str) -> Call:
    return [k.review_notify, k.review_notify_events], [most, lease_ms, token]


def review_notify_settle(
    k: TenantKeys, *, item_id: str, token: str, outcome: str, delay_ms: int, error: str
) -> Call:
    """`outcome` "sent", "retry" or "gave_up"; `delay_ms` only for a retry."""
    return (
        [k.review_notify, k.review_notify_events, k.stats],
        [item_id, token, outcome, delay_ms, error],
    )


def pause_human(k: TenantKeys, *, person: str, by: str, why: str, pause_ms: int) -> Call:
    return [k.stats], [k.conversation_prefix, person, by, why, pause_ms]


def resume_human(k: TenantKeys, *, person: str) -> Call:
    return [k.due, k.running, k.stats], [k.conversation_prefix, person]
