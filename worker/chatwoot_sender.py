"""Replies through Chatwoot's API: the worker's half of the Chatwoot provider.

- `send` posts one reply part as an outgoing message
  (`POST {CHATWOOT_BASE_URL}/api/v1/accounts/{account}/conversations/{conversation}/messages`,
  header `api_access_token`) and returns the id Chatwoot gave the message, which the worker
  records, so a retried turn never re-sends a part Chatwoot accepted.
- `begin_turn` shows the typing indicator (`toggle_typing_status`), best effort.
- `hand_over` gives the conversation to a human when its batch is parked for review: a private
  note saying why, then status `open` (`toggle_status`). Each call is retried a few times on
  transient errors; a hand-off that still fails raises, and the worker records that on the
  review item (the review item itself is never at risk).
- Errors: 429, 5xx, timeouts and connection errors are retried with backoff (`RetryLater`);
  401, 403, 404 and 422 go to review with the status and Chatwoot's message (`NeedsReview`);
  anything else is retried, then reviewed after MAX_ATTEMPTS.

Tenant `cw-<account>-<inbox>` gives the account, the person is the conversation id. The token is
the tenant's `access_token` from TENANTS_FILE, else `CHATWOOT_API_ACCESS_TOKEN`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from shared.chatwoot import account_of
from shared.settings import Settings
from worker.batch import Batch
from worker.errors import NeedsReview, RetryLater
from worker.split import WHATSAPP_MAX_CHARS

log = logging.getLogger(__name__)

REVIEW_REASONS = {
    401: "token_invalid",
    403: "forbidden",
    404: "not_found",
    422: "invalid_request",
}
HANDOFF_ATTEMPTS = 3
HANDOFF_BACKOFF_S = 0.5  # then 1 s: a hand-off is worth a few seconds, not a retry schedule
NOTE_DETAIL_CHARS = 500


class ChatwootError(Exception):
    """An answer Chatwoot gave that is neither success nor a known error class."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class ChatwootSender:
    # Chatwoot relays to the channel behind the inbox; WhatsApp's limit is the tightest.
    max_part_chars = WHATSAPP_MAX_CHARS

    def __init__(
        self,
        settings: Settings,
        client: httpx.AsyncClient | None = None,
        handoff_backoff_s: float = HANDOFF_BACKOFF_S,
    ) -> None:
        self._settings = settings
        self._handoff_backoff_s = handoff_backoff_s
        self._client = client or httpx.AsyncClient(
            base_url=settings.chatwoot_base_url,
            timeout=httpx.Timeout(15.0, connect=5.0),
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

    async def send(self, batch: Batch, text: str, part: int) -> str:
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

    async def hand_over(self, batch: Batch, reason: str, detail: str) -> bool:
        """A private note saying why, then status `open`: a human's conversation now."""
        why = f"{reason}: {detail[:NOTE_DETAIL_CHARS]}" if detail else reason
        note = {
            "content": f"The bot handed this conversation over to a person ({why}).",
            "message_type": "outgoing",
            "private": True,
        }
        await self._with_retries(batch, "/messages", note)
        await self._with_retries(batch, "/toggle_status", {"status": "open"})
        return True

    async def _with_retries(self, batch: Batch, path: str, body: dict[str, Any]) -> Any:
        for attempt in range(1, HANDOFF_ATTEMPTS + 1):
            try:
                return await self._post(batch, path, body)
            except RetryLater:
                if attempt == HANDOFF_ATTEMPTS:
                    raise
            await asyncio.sleep(self._handoff_backoff_s * 2 ** (attempt - 1))

    async def _post(self, batch: Batch, path: str, body: dict[str, Any]) -> Any:
        try:
            account = account_of(batch.tenant)
        except ValueError as exc:
            raise NeedsReview("invalid_request", str(exc)) from None
        url = f"/api/v1/accounts/{account}/conversations/{batch.person}{path}"
        token = self._settings.tenant(batch.tenant).access_token or (
            self._settings.chatwoot_api_access_token
        )
        try:
            response = await self._client.post(url, json=body, headers={"api_access_token": token})
        except httpx.TimeoutException as exc:
            raise RetryLater(f"Chatwoot timeout: {exc!r}") from exc
        except httpx.TransportError as exc:
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
