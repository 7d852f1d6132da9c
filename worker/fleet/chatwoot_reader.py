"""The catch-up's reads of Chatwoot's API, with the token the sender uses for the inbox.

- `conversations(tenant, page)`: `GET /api/v1/accounts/{account}/conversations?inbox_id=
  <inbox>&status=all&sort_by=last_activity_at_desc&page=<n>`, 25 a page, newest activity first
  (Chatwoot's ConversationFinder; `status=all`, or it lists only `open` ones).
- `messages(tenant, conversation, before)`: `GET .../conversations/{c}/messages`, the newest 20
  (`before=<id>`: the 20 before that id), oldest first (Chatwoot's MessageFinder).

A 429 raises `RateLimited` with the `Retry-After` seconds (when given); any other failure (5xx,
4xx, a timeout, a refused connection, a body that is not what Chatwoot answers) raises
`ReadFailed`. Nothing here retries: the catch-up decides (worker/fleet/chatwoot_catchup.py).
"""

from __future__ import annotations

from typing import Any

import httpx

from shared.chatwoot import account_of
from shared.settings import Settings

CONVERSATIONS_PER_PAGE = 25
MESSAGES_PER_CALL = 20


class ReadFailed(Exception):
    """A read Chatwoot did not answer usefully."""


class RateLimited(ReadFailed):
    def __init__(self, retry_after_s: float | None) -> None:
        super().__init__(f"HTTP 429 (Retry-After {retry_after_s})")
        self.retry_after_s = retry_after_s


def inbox_of(tenant: str) -> str:
    """The inbox id of a Chatwoot tenant id (`cw-<account>-<inbox>`)."""
    account = account_of(tenant)
    return tenant[len("cw-") + len(account) + 1 :]


class ChatwootReader:
    def __init__(self, settings: Settings, client: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        self._client = client or httpx.AsyncClient(
            base_url=settings.chatwoot_base_url,
            timeout=httpx.Timeout(
                settings.chatwoot_timeout_s, connect=min(5.0, settings.chatwoot_timeout_s)
            ),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def token(self, tenant: str) -> str:
        return self._settings.tenant(tenant).chatwoot_api_access_token

    async def conversations(self, tenant: str, page: int) -> list[dict[str, Any]]:
        params = {
            "inbox_id": inbox_of(tenant),
            "status": "all",
            "sort_by": "last_activity_at_desc",
            "page": str(page),
        }
        data = await self._get(tenant, "", params)
        payload = data.get("data", {}).get("payload") if isinstance(data, dict) else None
        if not isinstance(payload, list):
            raise ReadFailed("conversation list without data.payload")
        return [c for c in payload if isinstance(c, dict)]

    async def messages(
        self, tenant: str, conversation: int, before: int | None = None
    ) -> list[dict[str, Any]]:
        params = {} if before is None else {"before": str(before)}
        data = await self._get(tenant, f"/{conversation}/messages", params)
        payload = data.get("payload") if isinstance(data, dict) else None
        if not isinstance(payload, list):
            raise ReadFailed("message list without payload")
        return [m for m in payload if isinstance(m, dict)]

    async def _get(self, tenant: str, path: str, params: dict[str, str]) -> Any:
        url = f"/api/v1/accounts/{account_of(tenant)}/conversations{path}"
        headers = {"api_access_token": self.token(tenant)}
        try:
            response = await self._client.get(url, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise ReadFailed(f"Chatwoot unreachable: {exc!r}") from exc
        if response.status_code == 429:
            raise RateLimited(_seconds(response.headers.get("retry-after")))
        if response.status_code != 200:
            raise ReadFailed(f"HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()
        except ValueError:
            raise ReadFailed("answer is not JSON") from None


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: rare, and waiting the default is as good
        return None
