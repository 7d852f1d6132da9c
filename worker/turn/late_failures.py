"""Late delivery failures: a `failed` status for a part Meta had accepted, handled as a batch.

The intake queues each such status and makes a batch of those of one answered batch when the
person has none (shared/lua/lib/outbound.lua): fields `late_of` (the batch answered),
`late_jobs` (each failed part: wamid, part, Meta's code, title, message, details, when it was
sent), `late_reply` (the reply, when still kept), `late_template` ("1": 131047 and that batch's
template has not gone out), and the answered batch's messages. The worker runs it under the
person's lock, like any turn (invariant 3), and without the AI:

1. The person's memory marks each undelivered reply ("[not delivered: 131026] ..."), so the next
   turn's AI knows the customer never saw it (shared/conversation/late_failure_codes.py
   `memory_mark`).
2. For 131047, the tenant's template, once per batch: the intake noted the batch's template as
   decided before making this batch, and the send is noted on this batch before its request
   (`mark_template`), so neither a duplicate status nor a crash sends a second one. Not sent
   when the tenant has none, or when the person wrote after the failed send (the window is open
   again: the next turn answers them).
3. A review item with the answered batch's messages (`requeue` works, a person can answer by
   hand), the text and error of each failed part and what came of the template (`late_failure`),
   reason named after Meta's code (shared/conversation/late_failure_codes.py `REASONS`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from shared.conversation.errors import DeliveryUnknown, LeaseLost, RetryLater
from shared.conversation.late_failure_codes import WINDOW_CLOSED, memory_mark, reason_for
from shared.conversation.unknowns import UnknownDelivery, utc
from shared.settings import Settings
from worker.turn.endings import TurnEndings
from worker.turn.sending import Sending
from worker.turn.under_lease import UnderLease

log = logging.getLogger("worker.turn.turn")


def jobs_of(fields: dict[str, str]) -> list[dict[str, Any]]:
    """The failed parts a late-failure batch carries, in part order."""
    try:
        jobs = orjson.loads(fields.get("late_jobs") or "[]")
    except orjson.JSONDecodeError:
        return []
    jobs = [j for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []
    return sorted(jobs, key=lambda j: (_int(j.get("part")), str(j.get("id", ""))))


class LateFailure:
    """The turn of a late-failure batch (`Turn.run` hands it over when `late_jobs` is set):
    it writes under the turn's lease, sends through its sender and, when it fails, ends as the
    turn's `endings` end a failed turn."""

    def __init__(
        self, settings: Settings, lease: UnderLease, sending: Sending, endings: TurnEndings
    ) -> None:
        self._settings = settings
        self._lease = lease
        self._sending = sending
        self._endings = endings
        self.batch = lease.batch
        self.state = lease.state
        self.jobs = jobs_of(self.batch.fields)

    async def run(self) -> None:
        batch = self.batch
        try:
            await self._mark_memory()
            template = ""
            if batch.fields.get("late_template") == "1":
                template = await self._template()
        except LeaseLost:
            log.warning("lease lost in a late failure tenant=%s batch=%s", batch.tenant, batch.id)
            return
        except RetryLater as exc:
            if batch.attempt + 1 < self._settings.max_attempts:
                await self._endings.failed(exc)  # a retry with backoff, the note cleared
                return
            template = f"failed: {exc}"[:500]
        except Exception as exc:
            # Not expected (a Redis error answer, a bug): retried, then parked as max_attempts,
            # still with the batch's messages.
            await self._endings.failed(exc)
            return
        reason, error, late = self._describe(template)
        log.info(
            "late delivery failure to review tenant=%s batch=%s reason=%s",
            *(batch.tenant, batch.id, reason),
        )
        await self._lease.finish_review(reason, error, int(time.time() * 1000), extra=late)

    def _parts(self) -> list[str]:
        """The reply's parts as they were sent (empty when the reply is no longer kept)."""
        reply, sender = self.batch.fields.get("late_reply") or "", self._sending.sender
        if not reply or sender is None:  # (a WhatsApp batch's: its channel always has one)
            return []
        return sender.reply_parts(reply, formatted_for=self.batch.channel)

    def _describe(self, template: str) -> tuple[str, str, dict[str, Any]]:
        """The review reason, error and `late_failure` of the item."""
        parts = self._parts()
        failed: list[dict[str, Any]] = []
        sentences: list[str] = []
        of = f" of {len(parts)}" if parts else ""
        for job in self.jobs:
            part, code = _int(job.get("part")), _code(job.get("code"))
            title = str(job.get("title") or "")
            details = str(job.get("details") or job.get("message") or "")
            failed.append(
                {
                    "part": part,
                    "id": job.get("id"),
                    "code": code,
                    "title": title,
                    "details": details,
                    "sent_ms": _int(job.get("sent_ms")),
                    "text": parts[part] if 0 <= part < len(parts) else "",
                }
            )
            sentences.append(
                f"status failed {code} ({title or 'no title'}{': ' + details if details else ''})"
                f" for part {part + 1}{of} {job.get('id')}"
            )
        codes = [_code(j.get("code")) for j in self.jobs]
        first = WINDOW_CLOSED if WINDOW_CLOSED in codes else (codes[0] if codes else None)
        late: dict[str, Any] = {"batch": self.batch.fields.get("late_of", ""), "parts": failed}
        if template:
            late["template"] = template
            sentences.append(f"template {template}")
        return reason_for(first), "; ".join(sentences), {"late_failure": late}

    async def _mark_memory(self) -> None:
        """Mark each exchange of the memory whose reply parts failed; an exchange marked by an
        earlier attempt (its `undelivered`) is not marked twice."""
        failed = {str(j.get("id")): _code(j.get("code")) for j in self.jobs}
        updates: list[tuple[str, bytes]] = []
        for entry in self.batch.history:
            out = [o for o in entry.get("out") or [] if isinstance(o, str)]
            undelivered = entry.get("undelivered")
            known: dict[str, Any] = undelivered if isinstance(undelivered, dict) else {}
            new = [o for o in out if o in failed and o not in known]
            if not new:
                continue
            marks = "".join(memory_mark(failed[o], out.index(o), len(out)) for o in new)
            if len(new) == len(out) and len(set(failed[o] for o in new)) == 1:
                marks = memory_mark(failed[new[0]], 0, 1)
            marked = {
                **entry,
                "assistant": marks + str(entry.get("assistant") or ""),
                "undelivered": {**known, **{o: failed[o] for o in new}},
            }
            updates.append((new[0], orjson.dumps(marked)))
        if not updates:
            return
        await self._lease.mark_memory(updates)

    async def _template(self) -> str:
        """Send the tenant's template once; what came of it, for the item."""
        batch, state = self.batch, self.state
        name = self._settings.tenant(batch.tenant).template
        if state.template_sent:  # an earlier attempt of this batch noted it
            if 0 in state.sent_parts:
                return f"sent {state.sent_parts[0]}"
            state.delivery_unknown = UnknownDelivery(
                "template", 0, 1, state.template_ms, "the worker that sent it stopped", name or ""
            )
            return "unknown: the worker that sent it stopped before Meta answered; not sent again"
        if not name:
            return "not sent: the tenant has no template"
        sent_ms = min(
            (_int(j.get("sent_ms")) for j in self.jobs if j.get("code") == WINDOW_CLOSED),
            default=0,
        )
        if batch.last_inbound_ts * 1000 > sent_ms:
            return (
                "not sent: the person wrote since, at "
                f"{utc(batch.last_inbound_ts * 1000)} (the window is open again)"
            )
        sender = self._sending.sender
        if sender is None or not sender.sends_templates:
            return f"not sent: the {batch.channel} sender has no template"
        asked_ms = int(time.time() * 1000)
        try:
            wamid = await sender.send_template(batch, 0, delivery=self._sending.delivery)
        except DeliveryUnknown as exc:
            state.delivery_unknown = UnknownDelivery(
                "template", 0, 1, exc.at_ms or asked_ms, exc.detail, name
            )
            return f"unknown: {exc.detail}"[:500]
        except (LeaseLost, RetryLater):
            raise
        except Exception as exc:
            return f"failed: {exc}"[:500]
        await self._lease.record_part(0, wamid, "the template")
        return f"sent {wamid}"


def _code(value: Any) -> int | None:
    """Meta's error code as an int; None when there is none."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
