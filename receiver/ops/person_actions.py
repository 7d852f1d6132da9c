"""What a person can do to one conversation from the ops page: reply by hand
(worker/manual_reply.py), pause and resume the bot for the person (shared/ops/takeover.py),
forget the person (shared/ops/forget.py).

Each goes through the module the CLIs use, whose Lua scripts keep the invariants; each done
is one audit entry (the forget writes its own, keeping nothing about the person). An action
that cannot be done raises `ActionError` (409 on the page) and changes nothing.
"""

from __future__ import annotations

from typing import Any

from receiver.ops import queries
from receiver.ops.actions import ActionError
from shared.keys import Keys
from shared.ops import audit, takeover
from shared.ops.forget import ForgetError, ForgetReport, forget_person
from shared.ops.manual_reply import ManualReplies, ManualReplyError, ManualReplyResult
from shared.settings import Settings
from shared.storage.scripts import Scripts

# The pause lengths the page offers (seconds); HUMAN_PAUSE_S is offered first.
PAUSE_CHOICES_S = (3600.0, 4 * 3600.0, 24 * 3600.0)
WHY_MAX = 200


class PersonActions:
    def __init__(
        self,
        redis: Any,
        keys: Keys,
        scripts: Scripts,
        settings: Settings,
        replies: ManualReplies | None = None,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._scripts = scripts
        self._settings = settings
        self._replies = replies

    async def reply(self, who: str, tenant: str, person: str, text: str) -> ManualReplyResult:
        """Send `text` to the person through the tenant's provider (the template when the
        24-hour window is closed); audited with the text's start. A reply of several parts
        whose later part failed is audited too: what went out is on the record."""
        await self._check(tenant, person)
        assert self._replies is not None, "replies by hand need a ManualReplies"
        try:
            result = await self._replies.reply(tenant, person, text, by=who)
        except ManualReplyError as exc:
            if exc.provider_ids:
                await self._record(who, "reply", tenant, person, f"(partly) {_start(text)}")
            raise ActionError(str(exc)) from None
        what = "the template (window closed)" if result.template else _start(text)
        await self._record(who, "reply", tenant, person, what)
        return result

    def pause_choices(self) -> list[float]:
        return list(dict.fromkeys((self._settings.human_pause_s, *PAUSE_CHOICES_S)))

    async def pause(
        self, who: str, tenant: str, person: str, seconds: str, why: str
    ) -> dict[str, Any]:
        await self._check(tenant, person)
        try:
            length = float(seconds)
        except ValueError:
            raise ActionError(f"a pause lasts a number of seconds, not {seconds!r}") from None
        reason = " ".join(why.split())[:WHY_MAX] or "a person took over on the ops page"
        try:
            pause = await takeover.pause(
                self._redis, self._keys, tenant, person, by=who, why=reason, seconds=length
            )
        except takeover.TakeoverError as exc:
            raise ActionError(str(exc)) from None
        await self._record(who, "pause", tenant, person, f"for {length:g} s: {reason}")
        return pause

    async def resume(self, who: str, tenant: str, person: str) -> None:
        await self._check(tenant, person)
        if not await takeover.resume(self._redis, self._keys, tenant, person, by=who):
            raise ActionError(f"the bot was not paused for person {person!r}")
        await self._record(who, "resume", tenant, person, "the bot answers again")

    async def forget(self, who: str, tenant: str, person: str) -> ForgetReport:
        await self._check(tenant, person)
        try:
            return await forget_person(
                self._redis,
                self._keys,
                tenant,
                person,
                by=who,
                retention_s=self._settings.review_retention_s,
                scripts=self._scripts,
            )
        except ForgetError as exc:
            raise ActionError(str(exc)) from None

    async def _check(self, tenant: str, person: str) -> None:
        await queries.check_person(self._redis, self._keys, tenant, person)

    async def _record(self, who: str, action: str, tenant: str, person: str, detail: str) -> None:
        await audit.record(
            self._redis,
            self._keys,
            who=who,
            action=action,
            tenant=tenant,
            person=person,
            detail=detail,
            retention_s=self._settings.review_retention_s,
        )


def _start(text: str) -> str:
    return " ".join(text.split())[:200]
