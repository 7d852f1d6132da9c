"""The worker's Redis operations on conversations: claim, renew, finish, review.

Thin wrappers over the Lua scripts in shared/lua (claim, renew, finish, ...); every call
goes through the group committer, so the concurrent turns of one process share round trips.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from shared.conversation.batch import SERVICE_WINDOW_S, Batch
from shared.conversation.review_journal import ReviewJournal
from shared.conversation.turn_state import TurnState
from shared.keys import OUTBOUND_TTL_S, Keys
from shared.ops.takeover import pauses_for_review
from shared.settings import Settings
from shared.storage import script_calls
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts

MAX_INTAKE_PER_CALL = 1000
# How long a status that overtook its send's answer waits for record_part (which normally
# follows within milliseconds); statuses of messages sent by others expire with it.
EARLY_STATUS_TTL_S = 3600
# How many events that are not messages (reactions, edits, deletions, ...) a conversation keeps
# for its next turn; they live as long as memory does (`MEMORY_TTL_S`).
CONTEXT_MAX = 20
# How long the bot stays silent in a Chatwoot conversation a person handles after its last event
# (shared/lua/lib/silence.lua): long enough for any human follow-up, not forever.
SILENCE_TTL_S = 30 * 24 * 3600


@dataclass(frozen=True)
class Claim:
    now_ms: int  # Redis clock when the claim ran
    next_ms: int  # earliest due time or lease end still ahead, -1 if none
    more: bool  # inbox not drained: call again before trusting `batches` to be complete
    batches: list[Batch]


class ConversationStore:
    def __init__(self, settings: Settings, scripts: Scripts, committer: GroupCommitter) -> None:
        self._settings = settings
        self._scripts = scripts
        self._committer = committer
        self.keys = Keys(settings.key_prefix)
        # Review items queue their webhook's notification only when one is configured.
        self._notify = bool(settings.review_webhook_url)
        # Called with the tenant after a finish stored a review item (the review notifier
        # looks at once instead of at the next sweep).
        self.reviewed: Callable[[str], None] | None = None

    def _timing(self, tenant: str) -> tuple[int, int]:
        own = self._settings.tenant(tenant)
        return int(own.debounce_window_s * 1000), int(own.max_wait_s * 1000)

    async def claim(self, tenant: str, max_batches: int, token_prefix: str) -> Claim:
        k, own = self.keys.tenant(tenant), self._settings.tenant(tenant)
        window_ms, max_wait_ms = self._timing(tenant)
        keys, args = script_calls.claim(
            k,
            max_claim=max_batches,
            lease_ms=int(self._settings.lease_s * 1000),
            token_prefix=token_prefix,
            window_ms=window_ms,
            max_wait_ms=max_wait_ms,
            max_intake=MAX_INTAKE_PER_CALL,
            service_window_s=SERVICE_WINDOW_S,
            early_status_ttl_s=EARLY_STATUS_TTL_S,
            welcome=1 if own.welcome_text else 0,
            context_ttl_s=max(1, int(self._settings.memory_ttl_s)),
            context_max=CONTEXT_MAX,
            silence_ttl_s=SILENCE_TTL_S,
            human_pause_ms=int(own.human_pause_s * 1000),
            memory_turns=own.memory_turns,
        )
        row = await self._committer.submit(lambda p: self._scripts.claim.queue(p, keys, args))
        return Claim(
            now_ms=int(row[0]),
            next_ms=int(row[1]),
            more=bool(int(row[2])),
            batches=[Batch.from_claim(tenant, b) for b in row[3:]],
        )

    async def renew(self, tenant: str, turns: list[tuple[str, str]]) -> list[bool]:
        """Extend the leases of (person, token) pairs; False where the lease was lost."""
        k = self.keys.tenant(tenant)
        keys, args = script_calls.renew(k, lease_ms=int(self._settings.lease_s * 1000), turns=turns)
        result = await self._committer.submit(lambda p: self._scripts.renew.queue(p, keys, args))
        return [bool(int(x)) for x in result]

    async def finish_done(
        self, batch: Batch, remember: bytes = b"", last_part: tuple[int, str] | None = None
    ) -> bool:
        """End the turn; `remember` is the exchange to add to the person's memory (JSON).

        Also records `last_part`, the reply's last part (index, provider id), as record_part
        would.
        """
        return await self._finish(batch, "done", "", "", remember, last_part)

    async def save_reply(self, batch: Batch, reply: str) -> str | None:
        """Store the reply before sending; returns the one the batch holds (an earlier
        attempt's wins), or None if this worker no longer holds the lock."""
        k = self.keys.tenant(batch.tenant)
        keys, args = script_calls.save_reply(k, person=batch.person, token=batch.token, reply=reply)
        result = await self._committer.submit(
            lambda p: self._scripts.save_reply.queue(p, keys, args)
        )
        if result is None:
            return None
        return result.decode() if isinstance(result, bytes) else str(result)

    async def record_part(self, batch: Batch, part: int, provider_id: str) -> bool:
        """Remember that part `part` was accepted as `provider_id`; False if the lock is lost."""
        k = self.keys.tenant(batch.tenant)
        keys, args = script_calls.record_part(
            k,
            person=batch.person,
            token=batch.token,
            part=part,
            provider_id=provider_id,
            outbound_ttl_s=OUTBOUND_TTL_S,
        )
        result = await self._committer.submit(
            lambda p: self._scripts.record_part.queue(p, keys, args)
        )
        return bool(int(result))

    async def mark_template(self, batch: Batch, sending: bool, part: int) -> bool:
        """Note that the template is about to go out for this batch in place of `part`
        (before the request, so no retry sends it twice), or clear the note (`sending=False`:
        Meta refused it); False if the lock is lost."""
        k = self.keys.tenant(batch.tenant)
        keys, args = script_calls.mark_template(
            k, person=batch.person, token=batch.token, mark="1" if sending else "0", part=part
        )
        result = await self._committer.submit(
            lambda p: self._scripts.mark_template.queue(p, keys, args)
        )
        return bool(int(result))

    async def mark_memory(self, batch: Batch, entries: list[tuple[str, bytes]]) -> int:
        """Replace each exchange of the person's memory holding the reply part (provider id)
        with the given one (worker/turn/late_failures.py); how many were, or -1 if the lock is
        lost."""
        k = self.keys.tenant(batch.tenant)
        keys, args = script_calls.mark_memory(
            k, person=batch.person, token=batch.token, entries=entries
        )
        result = await self._committer.submit(
            lambda p: self._scripts.mark_memory.queue(p, keys, args)
        )
        return int(result)

    async def save_journal(self, batch: Batch, journal: ReviewJournal) -> bool:
        """Write the review journal on the batch; False if the lock is lost."""
        k = self.keys.tenant(batch.tenant)
        keys, args = script_calls.journal_review(
            k, person=batch.person, token=batch.token, journal=journal.to_json()
        )
        result = await self._committer.submit(
            lambda p: self._scripts.journal_review.queue(p, keys, args)
        )
        return bool(int(result))

    async def silence(self, batch: Batch, why: str) -> None:
        """The bot is silent in the batch's conversation from now on (a Chatwoot hand-over):
        its waiting messages join the memory (shared/lua/silence.lua)."""
        k = self.keys.tenant(batch.tenant)
        keys, args = script_calls.silence(
            k,
            person=batch.person,
            why=why,
            memory_ttl_s=max(1, int(self._settings.memory_ttl_s)),
            silence_ttl_s=SILENCE_TTL_S,
        )
        await self._committer.submit(lambda p: self._scripts.silence.queue(p, keys, args))

    async def add_figures(self, tenant: str, increments: dict[str, int]) -> None:
        """Add a turn's figures to the tenant's stats (shared/fleet/turn_figures.py): one HINCRBY
        per field, all in one round of the committer."""
        stats = self.keys.tenant(tenant).stats
        await self._committer.run(
            [functools.partial(_hincrby, stats, f, n) for f, n in increments.items()]
        )

    async def finish_retry(
        self, batch: Batch, delay_s: float, error: str, count_attempt: bool = True
    ) -> bool:
        """Due again after `delay_s`; `count_attempt=False`: the batch waits for the AI, which
        failed as a whole, and this attempt is not counted against `MAX_ATTEMPTS`."""
        return await self._finish(
            batch, "retry", int(delay_s * 1000), error[:2000], count_attempt=count_attempt
        )

    async def finish_review(
        self,
        batch: Batch,
        reason: str,
        error: str,
        now_ms: int,
        hand_over: str = "",
        state: TurnState | None = None,
        extra: dict[str, Any] | None = None,
    ) -> bool:
        """Park the batch on the review list; `hand_over` says whether the provider was told
        ("done", "failed: ...", "unknown: ..."; "" where it has no hand-over, and then the
        item has no field). From the turn's `state` the item also carries the send whose
        outcome is unknown (`delivery_unknown`) and the hand-over's steps, each of those
        counted in stats as unknown:<what>, and the parts already sent; `extra`: more fields
        of the item (a late delivery failure's `late_failure`). A WhatsApp batch parked for a
        reason that needs a person (shared/ops/takeover.py `pauses_for_review`) carries
        `human_pause_ms`: finish.lua pauses the bot for the person with the item."""
        state = state or TurnState()
        extra = {**(extra or {}), **({"hand_over": hand_over} if hand_over else {})}
        if pauses_for_review(batch.channel, reason):
            extra["human_pause_ms"] = int(self._settings.tenant(batch.tenant).human_pause_s * 1000)
        unknown: list[str] = []
        if state.delivery_unknown is not None:
            extra["delivery_unknown"] = state.delivery_unknown.to_json()
            unknown.append(state.delivery_unknown.what)
        if state.journal is not None and state.journal.steps:
            extra["hand_over_steps"] = state.journal.steps
            unknown += state.journal.unknown_steps
        if state.sent_parts:
            # What the person already has of the reply (part index -> provider id; "" =
            # not sent on purpose), so whoever takes the batch over continues from there.
            extra["parts_sent"] = {str(i): state.sent_parts[i] for i in sorted(state.sent_parts)}
            extra["parts_total"] = state.parts_total
        item = orjson.dumps(
            {
                **extra,
                "id": batch.id,
                "tenant": batch.tenant,
                "person": batch.person,
                "reason": reason,
                "error": error[:2000],
                "attempts": batch.attempt + (1 if reason == "max_attempts" else 0),
                "reviewed_ms": now_ms,
                "messages": orjson.Fragment(batch.messages_json),
                # Events that were not messages, taken by this batch: a requeue gives them back.
                **({"context": batch.context} if batch.context else {}),
            }
        )
        stored = await self._finish(batch, "review", reason, item, unknown=",".join(unknown))
        if stored and self.reviewed is not None:
            self.reviewed(batch.tenant)
        return stored

    async def _finish(
        self,
        batch: Batch,
        outcome: str,
        arg5: str | int,
        arg6: str | bytes,
        remember: bytes = b"",
        last_part: tuple[int, str] | None = None,
        unknown: str = "",
        count_attempt: bool = True,
    ) -> bool:
        k = self.keys.tenant(batch.tenant)
        window_ms, max_wait_ms = self._timing(batch.tenant)
        last_part_index, last_part_id = last_part or ("", "")
        keys, args = script_calls.finish(
            k,
            person=batch.person,
            token=batch.token,
            outcome=outcome,
            delay_ms_or_reason=arg5,
            error_or_item=arg6,
            window_ms=window_ms,
            max_wait_ms=max_wait_ms,
            remember=remember,
            memory_turns=self._settings.tenant(batch.tenant).memory_turns,
            memory_ttl_ms=int(self._settings.memory_ttl_s * 1000),
            last_part=last_part_index,
            last_part_id=last_part_id,
            outbound_ttl_s=OUTBOUND_TTL_S,
            unknown=unknown,
            count_attempt=1 if count_attempt else 0,
            notify=self._notify,
        )
        result = await self._committer.submit(lambda p: self._scripts.finish.queue(p, keys, args))
        return bool(int(result))


def _hincrby(key: str, field: str, n: int, pipe: Any) -> None:
    pipe.hincrby(key, field, n)
