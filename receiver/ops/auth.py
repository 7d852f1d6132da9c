"""Who may use the ops page: the sign-in check, the session cookie and the CSRF token.

A small HMAC-signed cookie of our own rather than Starlette's SessionMiddleware: the cookie
must be `Secure` exactly when the request came over https (Heroku's router says so with
`X-Forwarded-Proto`), which the middleware only knows as a fixed flag; a middleware would
also wrap every route of the app, and the webhook path must not pay for the ops page. The
cookie holds `who`, the expiry and the session's CSRF token, signed with a key derived from
`OPS_TOKEN`: changing the token invalidates every cookie, which is how one signs everyone
out. It is HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it) and
scoped to `/ops`.

The CSRF token is random per sign-in, rendered into every form and compared in constant time
on every POST; a page of another site cannot read it, so it cannot forge a form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

import orjson
from starlette.requests import Request
from starlette.responses import Response

COOKIE = "wa_ops"
PATH = "/ops"
NAME_MAX = 64  # the audit log's "who": a name, not an essay
_KEY_LABEL = b"wa-inbox ops session v1"


@dataclass(frozen=True)
class Session:
    who: str
    expires_s: int
    csrf: str


def token_matches(given: str, token: str) -> bool:
    """Constant-time: the comparison takes as long whatever prefix of the token is right."""
    return bool(token) and hmac.compare_digest(given.encode(), token.encode())


def clean_name(raw: str) -> str | None:
    """The name as the audit log keeps it (spaces collapsed), or None when it is unusable."""
    name = " ".join(raw.split())
    if not name or len(name) > NAME_MAX or not name.isprintable():
        return None
    return name


class Sessions:
    """Signs and reads session cookies for one `OPS_TOKEN`."""

    def __init__(self, ops_token: str, lifetime_s: float) -> None:
        self._key = hmac.new(ops_token.encode(), _KEY_LABEL, hashlib.sha256).digest()
        self._lifetime_s = lifetime_s

    def new(self, who: str, now_s: float | None = None) -> Session:
        now = time.time() if now_s is None else now_s
        return Session(who, int(now + self._lifetime_s), secrets.token_urlsafe(24))

    def encode(self, session: Session) -> str:
        payload = _b64(orjson.dumps([session.who, session.expires_s, session.csrf]))
        return f"{payload}.{self._sign(payload)}"

    def decode(self, cookie: str | None, now_s: float | None = None) -> Session | None:
        """The session of a cookie, or None: missing, forged, signed with another token,
        unreadable or expired all mean "not signed in"."""
        if not cookie or cookie.count(".") != 1:
            return None
        payload, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        try:
            who, expires_s, csrf = orjson.loads(base64.urlsafe_b64decode(payload + "=="))
            session = Session(str(who), int(expires_s), str(csrf))
        except (ValueError, TypeError, orjson.JSONDecodeError):
            return None
        now = time.time() if now_s is None else now_s
        return session if session.expires_s > now else None

    def read(self, request: Request) -> Session | None:
        return self.decode(request.cookies.get(COOKIE))

    def set_cookie(self, response: Response, request: Request, session: Session) -> None:
        response.set_cookie(
            COOKIE,
            self.encode(session),
            max_age=max(1, int(session.expires_s - time.time())),
            path=PATH,
            secure=came_over_https(request),
            httponly=True,
            samesite="strict",
        )

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())


def clear_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(
        COOKIE, path=PATH, secure=came_over_https(request), httponly=True, samesite="strict"
    )


def csrf_ok(session: Session, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), session.csrf.encode())


def came_over_https(request: Request) -> bool:
    """https to us, or to the proxy in front of us (Heroku's router terminates TLS and says
    so in `X-Forwarded-Proto`): then the cookie must never travel over plain http."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
