"""Replies through the WhatsApp Cloud API (Graph API `/{version}/{phone_number_id}/messages`).

- `begin_turn` marks the last message read and shows the typing indicator (one call), and
  `keep_typing` repeats it while a long turn runs; best effort: a failure there never fails
  the turn. `can_send_text` says whether the window is known to be closed: the turn then sends
  the template (or parks the batch) without asking the AI.
- `send` sends one text part and returns the wamid Meta gave it. Outside the 24-hour window
  (known from the person's last inbound message, or Meta's error 131047, on any part) it sends
  the tenant's template instead of the rest of the reply, once per batch (noted on the batch
  before the request, so a retry never sends it again), or parks the batch for review
  ("window_closed", the parts already sent listed on the item). `send_template` sends it alone,
  for a 131047 Meta reported after accepting a part (worker/turn/late_failures.py).
- A person known only by a business-scoped user id (a username, no phone number) is written to
  in `recipient` instead of `to` (`addressed_to`).
- Meta's error codes decide: throughput and transient errors are retried with backoff
  (`RetryLater`); window, undeliverable, bad request and expired token go to review with the
  code and message (`NeedsReview`).
- A send Meta may have taken without our hearing of it (a read timeout, a connection dropped
  after the request was written, a 200 without a wamid) is never repeated: `DeliveryUnknown`,
  the batch goes to review as "delivery_unknown" (shared/conversation/unknowns.py). So is a
  template that a resumed turn finds noted but not recorded: the worker sending it died waiting for
  Meta. Failures before the request was complete (no connection) are retried.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from shared.conversation.batch import Batch
from shared.conversation.errors import DeliveryUnknown, NeedsReview, RetryLater
from shared.conversation.turn_state import Delivery
from shared.conversation.unknowns import may_have_arrived
from shared.ids import is_phone_number_id
from shared.ops.takeover import pauses_for_review
from shared.senders.base import Sender
from shared.senders.split import WHATSAPP_MAX_CHARS
from shared.settings import Settings

log = logging.getLogger(__name__)

RETRYABLE_CODES = frozenset({130429, 131056, 131000, 131016, 1, 2})
WINDOW_CLOSED = 131047
REVIEW_REASONS = {
    WINDOW_CLOSED: "window_closed",
    131026: "undeliverable",
    131051: "unsupported_message",
    100: "invalid_request",
    131008: "invalid_request",
    131009: "invalid_request",
    190: "token_expired",
}


class GraphError(Exception):
    def __init__(self, status: int, code: int | None, message: str) -> None:
        super().__init__(f"HTTP {status}, code {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class WhatsAppSender(Sender):
    max_part_chars = WHATSAPP_MAX_CHARS
    keeps_typing = True  # Meta drops the typing indicator after 25 s
    hands_over = True  # the review item says the bot is paused for the person
    resumes_hand_over = True  # its hand-over tells nobody: calling it again repeats nothing
    sends_templates = True

    def __init__(self, settings: Settings, client: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        self._client = client or httpx.AsyncClient(
            base_url=f"{settings.whatsapp_api_base_url}/{settings.whatsapp_api_version}",
            # A send slower than this is retried (RetryLater); connecting never takes longer
            # than 5 s, however long a send may.
            timeout=httpx.Timeout(
                settings.whatsapp_timeout_s, connect=min(5.0, settings.whatsapp_timeout_s)
            ),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _token(self, tenant: str) -> str:
        return self._settings.tenant(tenant).whatsapp_access_token

    def can_send_text(self, batch: Batch) -> bool:
        """Whether a reply may go out as text: False once the 24-hour window is known to be
        closed (the person's last inbound message). The turn then asks no AI and shows no
        typing: it calls `send(batch, "", 0)`, which sends the tenant's template or parks the
        batch for review when there is none."""
        return not batch.window_closed(time.time())

    async def begin_turn(self, batch: Batch) -> None:
        """Read receipt + typing indicator before the AI is asked (best effort); nothing
        outside the window, where the typing indicator would promise a reply that cannot
        come."""
        if self.can_send_text(batch):
            await self.keep_typing(batch)

    async def keep_typing(self, batch: Batch) -> None:
        """The same read + typing call again: Meta drops the indicator after 25 s, so the turn
        repeats it while the reply is not out yet (worker/turn/turn.py). Best effort."""
        if not batch.messages:
            return
        body = {
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": batch.messages[-1].id,
            "typing_indicator": {"type": "text"},
        }
        try:
            await self._post(batch.tenant, body)
        except Exception as exc:  # a timeout or garbage answer too (RetryLater, DeliveryUnknown)
            log.info("read/typing failed tenant=%s batch=%s: %r", batch.tenant, batch.id, exc)

    async def hand_over(
        self, batch: Batch, reason: str, detail: str, *, delivery: Delivery | None = None
    ) -> bool | str:
        """Nothing to tell Meta: WhatsApp's human queue is the review list (and the ops page).
        For a reason that needs a person the bot is paused for this person (the review item's
        `human_pause_ms`, set with it by finish.lua: shared/ops/takeover.py); what the item's
        `hand_over` says of it."""
        if not pauses_for_review(batch.channel, reason):
            return False
        seconds = self._settings.tenant(batch.tenant).human_pause_s
        return f"bot paused for this person for {seconds:g} s (HUMAN_PAUSE_S) or until resumed"

    async def send(
        self, batch: Batch, text: str, part: int, *, delivery: Delivery | None = None
    ) -> str:
        """`delivery`: the turn's template note (see `_outside_window`); without it, as for
        a batch that has none."""
        delivery = delivery or Delivery()
        state = delivery.state
        if state.template_sent:
            if state.template_part == part:
                # Noted before its request, never recorded: the worker sending it stopped (a
                # crash, a lost lease) before Meta's answer was recorded.
                raise DeliveryUnknown(
                    "the worker that sent it stopped before Meta's answer was recorded",
                    what="template",
                    label=self._settings.tenant(batch.tenant).template,
                    at_ms=state.template_ms or None,
                )
            # The window closed and the template went out (this attempt or an earlier one):
            # no text can follow it, and a second template would only repeat it.
            return ""
        if batch.window_closed(time.time()):
            return await self._outside_window(batch, part, "last message over 24 h ago", delivery)
        body = {
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            **addressed_to(batch.person),
            "type": "text",
            "text": {"body": text, "preview_url": False},
        }
        try:
            return await self._send(batch.tenant, body)
        except GraphError as exc:
            if exc.code == WINDOW_CLOSED:
                # On a later part too: the earlier parts reached the person, who is outside
                # the window now. The template tells them; without one a person takes over
                # (the review item lists the parts already sent).
                why = f"{exc.code}: {exc.message}"
                return await self._outside_window(batch, part, why, delivery)
            raise _classify(exc) from exc

    async def send_template(
        self, batch: Batch, part: int, *, delivery: Delivery | None = None
    ) -> str:
        """The tenant's template alone, for a late 131047 (Meta accepted a part, then reported
        the window closed: worker/turn/late_failures.py); noted on the batch before its request,
        as `send`'s. The caller checks that the tenant has one."""
        return await self._outside_window(
            batch, part, "131047 reported late", delivery or Delivery()
        )

    async def _outside_window(self, batch: Batch, part: int, why: str, delivery: Delivery) -> str:
        """Send the tenant's template in place of what is left of the reply (once per batch:
        noted on the batch before the request, so no retry sends it again, even one whose
        answer was lost), or park the batch for review when the tenant has none."""
        tenant = self._settings.tenant(batch.tenant)
        if not tenant.template:
            raise NeedsReview("window_closed", why)
        await delivery.note_template(True, part)
        body = {
            "messaging_product": "whatsapp",
            **addressed_to(batch.person),
            "type": "template",
            "template": {"name": tenant.template, "language": {"code": tenant.template_language}},
        }
        try:
            return await self._send(batch.tenant, body)
        except GraphError as exc:
            # Meta answered with an error: the template did not go out, a retry may send it.
            await delivery.note_template(False, part)
            raise _classify(exc) from exc
        except DeliveryUnknown as exc:
            # The note stays: it may have gone out, so no attempt sends it again.
            raise DeliveryUnknown(exc.detail, what="template", label=tenant.template) from exc

    async def _send(self, tenant: str, body: dict[str, Any]) -> str:
        data = await self._post(tenant, body)
        try:
            return str(data["messages"][0]["id"])
        except (KeyError, IndexError, TypeError):
            # A 200 that names no message: Meta (or whatever answered) may have sent it.
            raise DeliveryUnknown(f"HTTP 200 without a wamid: {str(data)[:200]}") from None

    async def _post(self, tenant: str, body: dict[str, Any]) -> Any:
        if not is_phone_number_id(tenant):
            # The receiver takes only digits (shared/ids.py); this guards older data: a tenant
            # like `../../me` would take the path, and the token, elsewhere on the Graph API.
            raise NeedsReview("invalid_request", "tenant id is not a phone_number_id (digits)")
        try:
            response = await self._client.post(
                f"/{tenant}/messages",
                json=body,
                headers={"Authorization": f"Bearer {self._token(tenant)}"},
            )
        except httpx.TransportError as exc:
            if may_have_arrived(exc):
                raise DeliveryUnknown(f"Graph API did not answer: {exc!r}") from exc
            raise RetryLater(f"Graph API unreachable: {exc!r}") from exc
        if response.status_code == 200:
            try:
                return response.json()
            except ValueError:
                raise DeliveryUnknown(f"HTTP 200 that is not JSON: {response.text[:200]}") from None
        code, message = None, response.text[:300]
        try:
            error = response.json()["error"]
            code, message = int(error.get("code")), str(error.get("message", ""))
        except (ValueError, KeyError, TypeError):
            pass
        raise GraphError(response.status_code, code, message)


def addressed_to(person: str) -> dict[str, str]:
    """Who a message goes to: `to` for a phone number (digits), `recipient` for a
    business-scoped user id (`AR.4410...`: a person known by a username, no number shown),
    as Meta documents for usernames. The receiver keys a person by the number when the webhook
    has one, else by the user id (receiver/providers/whatsapp.py `_sender`)."""
    return {"to": person} if person.isdigit() else {"recipient": person}


def _classify(exc: GraphError) -> Exception:
    if exc.code in REVIEW_REASONS:
        return NeedsReview(REVIEW_REASONS[exc.code], f"{exc.code}: {exc.message}")
    if exc.code in RETRYABLE_CODES or exc.status >= 500 or exc.status == 429:
        return RetryLater(str(exc))
    return exc  # unknown: retried with backoff, then review after MAX_ATTEMPTS
