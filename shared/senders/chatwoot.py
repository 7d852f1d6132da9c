"""Replies through Chatwoot's API: the worker's half of the Chatwoot provider.

- `send` posts one reply part as an outgoing message
  (`POST {CHATWOOT_BASE_URL}/api/v1/accounts/{account}/conversations/{conversation}/messages`,
  header `api_access_token`) and returns the id Chatwoot gave the message, which the worker
  records, so a retried turn never re-sends a part Chatwoot accepted.
- `begin_turn` shows the typing indicator (`toggle_typing_status`), best effort.
- `hand_over` gives the conversation to a human when its batch is parked for review: a private
  note saying why, then status `open` (`toggle_status`). Each call is retried a few times on
  transient errors; a hand-over that still fails raises, and the worker records that on the
  review item (the review item itself is never at risk). At most one note per batch, even
  across a worker's death: the note's step is journaled on the batch before its request and
  after its answer (shared/conversation/review_journal.py); a note whose request got no answer is
  never posted again (recorded as unknown). Setting `open` is idempotent, so it is always (re)done.
- Errors: 429, 5xx and failures to connect are retried with backoff (`RetryLater`); 401,
  403, 404 and 422 go to review with the status and Chatwoot's message (`NeedsReview`);
  anything else is retried, then reviewed after MAX_ATTEMPTS. A reply part Chatwoot may have
  created without our hearing of it (a read timeout, a connection dropped after the request
  was written) is never posted again: `DeliveryUnknown`, review as "delivery_unknown", and
  the hand-over note asks the agent to check whether it is in the conversation.

Tenant `cw-<account>-<inbox>` gives the account, the person is the conversation id. The token is
the tenant's `access_token` from TENANTS_FILE, else `CHATWOOT_API_ACCESS_TOKEN`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from shared.chatwoot import account_of
from shared.conversation.batch import Batch
from shared.conversation.errors import DeliveryUnknown, NeedsReview, RetryLater
from shared.conversation.review_journal import SENDING
from shared.conversation.turn_state import Delivery
from shared.conversation.unknowns import describe, may_have_arrived
from shared.ids import is_chatwoot_id
from shared.senders.base import Sender
from shared.senders.split import WHATSAPP_MAX_CHARS
from shared.settings import Settings

log = logging.getLogger(__name__)

REVIEW_REASONS = {
    401: "token_invalid",
    403: "forbidden",
    404: "not_found",
    422: "invalid_request",
}
HAND_OVER_ATTEMPTS = 3
HAND_OVER_BACKOFF_S = 0.5  # then 1 s: a hand-over is worth a few seconds, not a retry schedule
NOTE_DETAIL_CHARS = 500
EXCERPT_CHARS = 80  # of a part whose delivery is unknown, for the agent to look for it


class ChatwootError(Exception):
    """An answer Chatwoot gave that is neither success nor a known error class."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class ChatwootSender(Sender):
    # Chatwoot relays to the channel behind the inbox; WhatsApp's limit is the tightest.
    max_part_chars = WHATSAPP_MAX_CHARS
    hands_over = True  # a private note, then status `open`
    # A resumed hand-over reads the journal and repeats no step that was begun (see hand_over).
    resumes_hand_over = True

    def __init__(
        self,
        settings: Settings,
        client: httpx.AsyncClient | None = None,
        hand_over_backoff_s: float = HAND_OVER_BACKOFF_S,
    ) -> None:
        self._settings = settings
        self._hand_over_backoff_s = hand_over_backoff_s
        self._client = client or httpx.AsyncClient(
            base_url=settings.chatwoot_base_url,
            # Connecting never takes longer than 5 s, however long a call may.
            timeout=httpx.Timeout(
                settings.chatwoot_timeout_s, connect=min(5.0, settings.chatwoot_timeout_s)
            ),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def begin_turn(self, batch: Batch) -> None:
        """Typing indicator before the AI is asked; a failure never fails the turn."""
        try:
            await self._post(batch, "/toggle_typing_status", {"typing_status": "on"})
        except Exception as exc:
            log.info("typing indicator failed tenant=%s batch=%s: %r", batch.tenant, batch.id, exc)

    async def send(
        self, batch: Batch, text: str, part: int, *, delivery: Delivery | None = None
    ) -> str:
        body = {"content": text, "message_type": "outgoing", "private": False}
        data = await self._post(batch, "/messages", body)
        message_id = data.get("id") if isinstance(data, dict) else None
        if message_id is None:
            # A 2xx means Chatwoot created the message: sending again would duplicate it.
            log.warning(
                "Chatwoot accepted a part without an id tenant=%s batch=%s", batch.tenant, batch.id
            )
            return ""
        return str(message_id)

    async def hand_over(
        self, batch: Batch, reason: str, detail: str, *, delivery: Delivery | None = None
    ) -> bool | str:
        """A private note saying why, then status `open`: a human's conversation now.

        True when both were done; "unknown: ..." when the note's request got no answer (it
        may or may not be in the conversation; never posted twice). With the worker's journal
        (`delivery.state.journal`, `delivery.save_journal`) a resumed hand-over skips a note
        that was begun: the note is marked before its request and after its answer.
        """
        delivery = delivery or Delivery()
        journal = delivery.state.journal
        steps = journal.steps if journal is not None else {}
        note = steps.get("note")
        if note is None:
            steps["note"] = SENDING
            await delivery.save_journal()
            try:
                note_body = self._note(delivery, reason, detail)
                await self._with_retries(batch, "/messages", note_body)
                steps["note"] = "done"
            except DeliveryUnknown as exc:
                steps["note"] = f"unknown: {exc.detail}"
            except Exception:
                # Refused or never reached Chatwoot: no note exists, a resumed hand-over may
                # post it. (If this write fails, the failure is what the item says.)
                del steps["note"]
                await delivery.save_journal()
                raise
            await delivery.save_journal()
        elif note == SENDING:
            steps["note"] = "unknown: the worker posting it stopped before Chatwoot answered"
            await delivery.save_journal()
        # Setting `open` twice changes nothing: timeouts are retried too, and a resumed
        # hand-over sets it again rather than guess whether the first request arrived.
        await self._with_retries(batch, "/toggle_status", {"status": "open"}, idempotent=True)
        steps["status"] = "open"
        note = steps["note"]
        return True if note == "done" else f"{note}; status set to open"

    @staticmethod
    def _note(delivery: Delivery, reason: str, detail: str) -> dict[str, Any]:
        why = f"{reason}: {detail[:NOTE_DETAIL_CHARS]}" if detail else reason
        content = f"The bot handed this conversation over to a person ({why})."
        unknown = delivery.state.delivery_unknown
        if unknown is not None and unknown.what == "part":
            # What the agent needs: whether that message is in the conversation above.
            excerpt = unknown.text[:EXCERPT_CHARS]
            content += (
                f" Check whether the bot's {describe(unknown.to_json())}, starting"
                f' "{excerpt}", appears above: Chatwoot did not answer its request, and it is'
                " not sent again."
            )
        return {"content": content, "message_type": "outgoing", "private": True}

    async def _with_retries(
        self, batch: Batch, path: str, body: dict[str, Any], *, idempotent: bool = False
    ) -> Any:
        """A hand-over call, tried up to HAND_OVER_ATTEMPTS times while it failed in a way that
        created nothing; `idempotent` calls also when the outcome is unknown."""
        retry: tuple[type[Exception], ...] = (
            (RetryLater, DeliveryUnknown) if idempotent else (RetryLater,)
        )
        for attempt in range(1, HAND_OVER_ATTEMPTS + 1):
            try:
                return await self._post(batch, path, body)
            except retry:
                if attempt == HAND_OVER_ATTEMPTS:
                    raise
            await asyncio.sleep(self._hand_over_backoff_s * 2 ** (attempt - 1))

    async def _post(self, batch: Batch, path: str, body: dict[str, Any]) -> Any:
        try:
            account = account_of(batch.tenant)
        except ValueError as exc:
            raise NeedsReview("invalid_request", str(exc)) from None
        if not is_chatwoot_id(batch.person):  # the receiver takes only integers; older data
            raise NeedsReview("invalid_request", "conversation id is not an integer")
        url = f"/api/v1/accounts/{account}/conversations/{batch.person}{path}"
        token = self._settings.tenant(batch.tenant).chatwoot_api_access_token
        try:
            response = await self._client.post(url, json=body, headers={"api_access_token": token})
        except httpx.TransportError as exc:
            if may_have_arrived(exc):
                raise DeliveryUnknown(f"Chatwoot did not answer: {exc!r}") from exc
            raise RetryLater(f"Chatwoot unreachable: {exc!r}") from exc
        status = response.status_code
        if 200 <= status < 300:
            try:
                return response.json()
            except ValueError:
                return None
        message = _error_message(response)
        if status in REVIEW_REASONS:
            raise NeedsReview(REVIEW_REASONS[status], f"HTTP {status}: {message}")
        if status == 429 or status >= 500:
            raise RetryLater(f"Chatwoot HTTP {status}: {message}")
        raise ChatwootError(status, message)


def _error_message(response: httpx.Response) -> str:
    """Chatwoot's error text: `{"error": ...}`, `{"message": ...}` or `{"errors": [...]}`."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(data, dict):
        for key in ("error", "message", "errors"):
            value = data.get(key)
            if isinstance(value, list):
                value = "; ".join(str(v) for v in value)
            if value:
                return str(value)[:300]
    return response.text[:300]
