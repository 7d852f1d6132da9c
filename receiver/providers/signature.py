"""Request authentication: Meta's `X-Hub-Signature-256` and the verification token.

Both compare in constant time. The signature is computed over the raw body bytes exactly as
received (never re-serialized JSON), with every configured app secret so a secret can be
rotated without downtime: `WHATSAPP_APP_SECRET=new,old`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

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
        # Per secret, HMAC's two keyed SHA-256 states (RFC 2104), copied per request: copying
        # skips the key set-up `hmac.new` repeats each time, and two plain hash objects cost
        # less than `hmac.HMAC.copy()`'s Python wrapper (docs/benchmarks/receiver.md).
        self._macs = tuple(_keyed_pads(s.encode()) for s in secrets if s)

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
        for inner, outer in self._macs:  # no early exit: the time does not tell which matched
            mac = inner.copy()
            mac.update(body)
            digest = outer.copy()
            digest.update(mac.digest())
            matched |= hmac.compare_digest(digest.hexdigest().encode(), given)
        if not matched:
            raise BadSignature("signature does not match")


def _keyed_pads(key: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256's inner and outer hash states after the padded key (RFC 2104): the MAC of
    a body is outer.copy() fed inner.copy()-fed-the-body's digest, what `hmac.new` computes."""
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner = hashlib.sha256(key.translate(_IPAD))
    outer = hashlib.sha256(key.translate(_OPAD))
    return inner, outer


_BLOCK = 64  # SHA-256's block size
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a verification token; an empty expected token never matches."""
    if not expected or given is None:
        return False
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )
