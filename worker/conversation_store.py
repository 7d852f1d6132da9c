"""The worker's Redis operations on conversations: claim, renew, finish, review.

Thin wrappers over the Lua scripts in shared/lua (claim, renew, finish, ...): each passes the
values its script's header names (shared/storage/scripts.py), settings already in the units
the scripts read (shared/storage/script_settings.py). Every call goes through the group
committer, so the concurrent turns of one process share round trips.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from shared.conversation.batch import SERVICE_WINDOW_S, Batch
from shared.conversation.review_journal import ReviewJournal
from shared.conversation.turn_state import TurnState
from shared.keys import OUTBOUND_TTL_S, Keys, TenantKeys
from shared.ops.takeover import pauses_for_review
from shared.settings import Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.script_settings import ScriptSettings
from shared.storage.scripts import BoundCall, Script, Scripts

# A turn's figures: (stats field, increment) pairs (shared/fleet/turn_figures.py).
Figures = tuple[tuple[str, int], ...]
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
# What finish.lua gets for the values an outcome does not use (shared/lua/finish.lua).
_FINISH_UNUSED: dict[str, Any] = {
    "delay_ms_or_reason": "",
    "error_or_item": "",
    "remember": b"",
    "last_part": "",
    "last_part_id": "",
    "unknown": "",
    "count_attempt": 1,
    "figures": (),
}


def _figures_text(figures: Figures) -> str:
    """A turn's figures as finish.lua reads them: "<field> <increment> ..."."""
    return " ".join(f"{field} {n}" for field, n in figures)


@dataclass(frozen=True)
class Claim:
    now_ms: int  # Redis clock when the claim ran
    next_ms: int  # earliest due time or lease end still ahead, -1 if none
    more: bool  # inbox not drained: call again before trusting `batches` to be complete
    batches: list[Batch]


class ConversationStore:
    def __init__(self, settings: Settings, scripts: Scripts, committer: GroupCommitter) -> None:
        self._scripts = scripts
        self._committer = committer
        self._units = ScriptSettings.of(settings)
        self.keys = Keys(settings.key_prefix)
        # Review items queue their webhook's notification only when one is configured.
        self._notify = bool(settings.review_webhook_url)
        # Called with the tenant after a finish stored a review item (the review notifier
        # looks at once instead of at the next sweep).
        self.reviewed: Callable[[str], None] | None = None
        # Per tenant, the finish and save_reply calls with the tenant's values fixed: the two
        # calls of every turn (claim's cost is shared by a whole round of batches).
        self._finishes: dict[str, BoundCall] = {}
        self._saves: dict[str, BoundCall] = {}

    async def _call(self, script: Script, k: TenantKeys, **values: Any) -> Any:
        """Run `script` with these values in the committer's next round; its reply."""
        # Built now, so a wrong name raises here, in the caller, not in the committer's round.
        command = script.command(k, **values)
        return await self._committer.submit(command)

    async def _as_holder(self, script: Script, batch: Batch, **values: Any) -> Any:
        """Run a script that acts only while the batch's turn holds the person's lock."""
        k = self.keys.tenant(batch.tenant)
        return await self._call(script, k, person=batch.person, token=batch.token, **values)

    async def claim(
        self, tenant: str, max_batches: int, token_prefix: str, answer_by_ms: int = 0
    ) -> Claim:
        """Take the tenant's events in and claim up to `max_batches` due batches, their lock
        tokens `token_prefix:n`. `answer_by_ms` (Redis's clock; 0: none): when Redis runs the
        call only after it, it claims nothing (see `unclaim`)."""
        t = self._units.tenant(tenant)
        row = await self._call(
            self._scripts.claim,
            self.keys.tenant(tenant),
            max_claim=max_batches,
            lease_ms=self._units.lease_ms,
            token_prefix=token_prefix,
            window_ms=t.window_ms,
            max_wait_ms=t.max_wait_ms,
            max_intake=MAX_INTAKE_PER_CALL,
            service_window_s=SERVICE_WINDOW_S,
            early_status_ttl_s=EARLY_STATUS_TTL_S,
            welcome=t.welcome,
            context_ttl_s=self._units.memory_ttl_s,
            context_max=CONTEXT_MAX,
            silence_ttl_s=SILENCE_TTL_S,
            human_pause_ms=t.human_pause_ms,
            memory_turns=t.memory_turns,
            answer_by_ms=answer_by_ms,
        )
        return Claim(
            now_ms=int(row[0]),
            next_ms=int(row[1]),
            more=bool(int(row[2])),
            batches=[Batch.from_claim(tenant, b) for b in row[3:]],
        )

    async def unclaim(self, tenant: str, token_prefixes: list[str], answer_by_ms: int) -> int:
        """Hand back the batches that the claims with these token prefixes locked, calls whose
        answer never reached this worker: due again at once, not after their lease. -1 while
        Redis's clock has not passed `answer_by_ms` (one of them may still run)."""
        handed = await self._call(
            self._scripts.unclaim,
            self.keys.tenant(tenant),
            answer_by_ms=answer_by_ms,
            token_prefixes=token_prefixes,
        )
        return int(handed)

    async def renew(self, tenant: str, turns: list[tuple[str, str]]) -> list[bool]:
        """Extend the leases of (person, token) pairs; False where the lease was lost."""
        result = await self._call(
            self._scripts.renew,
            self.keys.tenant(tenant),
            lease_ms=self._units.lease_ms,
            turns=turns,
        )
        return [bool(int(x)) for x in result]

    async def finish_done(
        self,
        batch: Batch,
        remember: bytes = b"",
        last_part: tuple[int, str] | None = None,
        figures: Figures = (),
    ) -> bool:
        """End the turn; `remember` is the exchange to add to the person's memory (JSON).

        Also records `last_part`, the reply's last part (index, provider id), as record_part
        would, and adds the turn's `figures` to the tenant's stats.
        """
        index, provider_id = last_part or ("", "")
        return await self._finish(
            batch,
            "done",
            remember=remember,
            last_part=index,
            last_part_id=provider_id,
            figures=figures,
        )

    async def save_reply(self, batch: Batch, reply: str) -> str | None:
        """Store the reply before sending; returns the one the batch holds (an earlier
        attempt's wins), or None if this worker no longer holds the lock. The replies of one
        tenant that meet in a round of the committer are saved with one call."""
        bound = self._saves.get(batch.tenant)
        if bound is None:
            k = self.keys.tenant(batch.tenant)
            bound = self._saves[batch.tenant] = self._scripts.save_reply.bind(k)
        result = await self._committer.submit_grouped(bound, (batch.person, batch.token, reply))
        if result is None:
            return None
        if isinstance(result, int):  # this reply it is
            return reply
        return result.decode() if isinstance(result, bytes) else str(result)

    async def record_part(self, batch: Batch, part: int, provider_id: str) -> bool:
        """Remember that part `part` was accepted as `provider_id`; False if the lock is lost."""
        result = await self._as_holder(
            self._scripts.record_part,
            batch,
            part=part,
            provider_id=provider_id,
            outbound_ttl_s=OUTBOUND_TTL_S,
        )
        return bool(int(result))

    async def mark_template(self, batch: Batch, sending: bool, part: int) -> bool:
        """Note that the template is about to go out for this batch in place of `part`
        (before the request, so no retry sends it twice), or clear the note (`sending=False`:
        Meta refused it); False if the lock is lost."""
        mark = "1" if sending else "0"
        result = await self._as_holder(self._scripts.mark_template, batch, mark=mark, part=part)
        return bool(int(result))

    async def mark_memory(self, batch: Batch, entries: list[tuple[str, bytes]]) -> int:
        """Replace each exchange of the person's memory holding the reply part (provider id)
        with the given one (worker/turn/late_failures.py); how many were, or -1 if the lock is
        lost."""
        return int(await self._as_holder(self._scripts.mark_memory, batch, entries=entries))

    async def save_journal(self, batch: Batch, journal: ReviewJournal) -> bool:
        """Write the review journal on the batch; False if the lock is lost."""
        result = await self._as_holder(
            self._scripts.journal_review, batch, journal=journal.to_json()
        )
        return bool(int(result))

    async def silence(self, batch: Batch, why: str) -> None:
        """The bot is silent in the batch's conversation from now on (a Chatwoot hand-over):
        its waiting messages join the memory (shared/lua/silence.lua)."""
        await self._call(
            self._scripts.silence,
            self.keys.tenant(batch.tenant),
            person=batch.person,
            why=why,
            memory_ttl_s=self._units.memory_ttl_s,
            silence_ttl_s=SILENCE_TTL_S,
        )

    async def add_figures(self, tenant: str, increments: Figures) -> None:
        """Add a turn's figures to the tenant's stats (shared/fleet/turn_figures.py), for a
        turn that ended without a finish (its lease was lost): a finish carries its own."""
        stats = self.keys.tenant(tenant).stats
        await self._committer.run([("HINCRBY", stats, f, n) for f, n in increments])

    async def finish_retry(
        self,
        batch: Batch,
        delay_s: float,
        error: str,
        count_attempt: bool = True,
        figures: Figures = (),
    ) -> bool:
        """Due again after `delay_s`; `count_attempt=False`: the batch waits for the AI, which
        failed as a whole, and this attempt is not counted against `MAX_ATTEMPTS`."""
        return await self._finish(
            batch,
            "retry",
            delay_ms_or_reason=int(delay_s * 1000),
            error_or_item=error[:2000],
            count_attempt=1 if count_attempt else 0,
            figures=figures,
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
        figures: Figures = (),
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
            extra["human_pause_ms"] = self._units.tenant(batch.tenant).human_pause_ms
        unknown: list[str] = []
        if state.delivery_unknown is not None:
            extra["delivery_unknown"] = state.delivery_unknown.to_json()
            unknown.append(state.delivery_unknown.what)
        if state.journal is not None and state.journal.steps:
            extra["hand_over_steps"] = state.journal.steps
            unknown += state.journal.unknown_steps
        if state.reply:
            # The reply the AI wrote (as stored before sending): what did not go out of it is
            # what the person reviewing needs to see (a closed window, a failed send).
            extra["reply"] = state.reply
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
        stored = await self._finish(
            batch,
            "review",
            delay_ms_or_reason=reason,
            error_or_item=item,
            unknown=",".join(unknown),
            figures=figures,
        )
        if stored and self.reviewed is not None:
            self.reviewed(batch.tenant)
        return stored

    async def _finish(self, batch: Batch, outcome: str, **used: Any) -> bool:
        """finish.lua for `outcome` with the values it uses (`used`); the others blank. The
        turns of one tenant that meet in a round of the committer end in one call."""
        bound = self._finishes.get(batch.tenant)
        if bound is None:
            bound = self._finishes[batch.tenant] = self._bind_finish(batch.tenant)
        values = {
            **_FINISH_UNUSED,
            **used,
            "person": batch.person,
            "token": batch.token,
            "outcome": outcome,
        }
        values["figures"] = _figures_text(values["figures"])
        turn = tuple(values[name] for name in bound.fields)  # in finish.lua's header order
        return bool(int(await self._committer.submit_grouped(bound, turn)))

    def _bind_finish(self, tenant: str) -> BoundCall:
        t = self._units.tenant(tenant)
        k = self.keys.tenant(tenant)
        return self._scripts.finish.bind(
            k,
            window_ms=t.window_ms,
            max_wait_ms=t.max_wait_ms,
            memory_turns=t.memory_turns,
            memory_ttl_ms=self._units.memory_ttl_ms,
            outbound_ttl_s=OUTBOUND_TTL_S,
            review_notify=k.review_notify if self._notify else "",
        )
