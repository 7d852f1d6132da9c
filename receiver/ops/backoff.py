"""Back-off after failed sign-ins to the ops page, per client address and per name.

The counters live in Redis (`Keys.ops_signin_client`, `Keys.ops_signin_name`), so every
receiver process sees the same failures. One script (shared/lua/signin_attempt.lua) checks
both and counts the attempt before the token is compared: a burst of guesses sent at once
meets the back-off after `OPS_SIGNIN_FREE_ATTEMPTS`, not after the burst. A sign-in that
succeeds deletes both counters.

The client is `request.client`, the address uvicorn gives: it takes `X-Forwarded-For` only
from the proxies `FORWARDED_ALLOW_IPS` trusts, so a client cannot name itself another.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from starlette.requests import Request

from shared.keys import Keys
from shared.settings import Settings
from shared.storage.scripts import Scripts


def client_address(request: Request) -> str:
    """The address the back-off counts under (uvicorn's, after its proxy-header rules)."""
    return request.client.host if request.client else "unknown"


class Attempt(NamedTuple):
    wait_s: int  # 0: the attempt may go on; else refused, the seconds until one may
    failures: int  # the most attempts the client or the name has made since its last success


class SigninBackoff:
    """Takes sign-in attempts, refusing them while a client or a name waits out its back-off."""

    def __init__(self, keys: Keys, scripts: Scripts, settings: Settings) -> None:
        self._keys = keys
        self._scripts = scripts
        self._free = settings.ops_signin_free_attempts
        self._backoff_ms = max(1, int(settings.ops_signin_backoff_s * 1000))
        self._max_ms = max(self._backoff_ms, int(settings.ops_signin_backoff_max_s * 1000))

    def counters(self, address: str, name: str | None) -> list[str]:
        """The counters an attempt is counted in: the client's, and the name's when one is
        given (casefolded: "Ana" and "ana" are one account)."""
        found = [self._keys.ops_signin_client(address)]
        if name:
            found.append(self._keys.ops_signin_name(name.casefold()))
        return found

    async def take(self, redis: Any, address: str, name: str | None) -> Attempt:
        """Count an attempt, or refuse it (counting nothing) while a back-off runs."""
        wait_ms, failures = await self._scripts.signin_attempt(
            redis,
            counters=self.counters(address, name),
            free_attempts=self._free,
            backoff_ms=self._backoff_ms,
            backoff_max_ms=self._max_ms,
        )
        return Attempt(max(0, math.ceil(int(wait_ms) / 1000)), int(failures))

    async def reset(self, redis: Any, address: str, name: str | None) -> None:
        """The token was right: forget the failures of this client and this name."""
        await redis.delete(*self.counters(address, name))
