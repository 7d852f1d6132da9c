"""Request authentication: Meta's `X-Hub-Signature-256` and the verification token.

Both compare in constant time. The signature is computed over the raw body bytes exactly as
received (never re-serialized JSON), with every configured app secret so a secret can be
rotated without downtime: `WHATSAPP_APP_SECRET=new,old`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

PREFIX = "sha256="


class SignatureError(Exception):
    """The request is not signed by us; `status_code` is what to answer."""

    status_code = 403


class MissingSignature(SignatureError):
    status_code = 401


class BadSignature(SignatureError):
    status_code = 403


class SignatureChecker:
    """Checks `X-Hub-Signature-256` against any of the app secrets."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # One keyed HMAC per secret, copied per request: copying skips the key set-up that
        # `hmac.new` repeats each time (docs/benchmarks/receiver.md has the cost).
        self._macs = tuple(hmac.new(s.encode(), digestmod=hashlib.sha256) for s in secrets if s)

    @property
    def configured(self) -> bool:
        return bool(self._macs)

    def check(self, body: bytes, header: str | None) -> None:
        """Return when `header` is a valid signature of `body`, else raise a `SignatureError`.

        Without any secret configured every request is refused: unsigned traffic is never
        accepted.
        """
        if not self._macs:
            raise BadSignature("no app secret configured")
        if header is None:
            raise MissingSignature("no X-Hub-Signature-256 header")
        if not header.startswith(PREFIX):
            raise BadSignature("malformed X-Hub-Signature-256 header")
        given = header[len(PREFIX) :].strip().lower().encode("utf-8", "surrogatepass")
        matched = False
        for keyed in self._macs:  # no early exit: the time spent does not tell which one matched
            mac = keyed.copy()
            mac.update(body)
            matched |= hmac.compare_digest(mac.hexdigest().encode(), given)
        if not matched:
            raise BadSignature("signature does not match")


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a verification token; an empty expected token never matches."""
    if not expected or given is None:
        return False
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )
