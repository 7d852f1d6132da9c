"""Who may use the ops page: the sign-in check, the session cookie and the CSRF token.

A small HMAC-signed cookie of our own rather than Starlette's SessionMiddleware: the cookie
must be `Secure` exactly when the request came over https (Heroku's router says so with
`X-Forwarded-Proto`), which the middleware only knows as a fixed flag; a middleware would
also wrap every route of the app, and the webhook path must not pay for the ops page. The
cookie holds `who`, the expiry, the session's CSRF token and its id, signed with a key derived
from `OPS_TOKEN`: changing the token invalidates every cookie, which is how one signs everyone
out. It is HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it) and
scoped to `/ops`.

A signature alone cannot be taken back, so each session also exists in Redis
(`Keys.ops_session`, PX its lifetime): signing out deletes it, and from then on its cookie
and CSRF token are worth nothing, in every receiver process. A cookie that is not ASCII, not
base64, not signed by us or not in Redis is "signed out", never an error.

The CSRF token is random per sign-in, rendered into every form and compared in constant time
on every POST; a page of another site cannot read it, so it cannot forge a form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from shared.keys import Keys

COOKIE = "wa_ops"
PATH = "/ops"
NAME_MAX = 64  # the audit log's "who": a name, not an essay
_KEY_LABEL = b"wa-inbox ops session v1"


@dataclass(frozen=True)
class Session:
    who: str
    expires_s: int
    csrf: str
    sid: str  # the session's id: its key in Redis


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

    @property
    def lifetime_s(self) -> float:
        return self._lifetime_s

    def new(self, who: str, now_s: float | None = None) -> Session:
        now = time.time() if now_s is None else now_s
        return Session(
            who, int(now + self._lifetime_s), secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        )

    def encode(self, session: Session) -> str:
        fields = [session.who, session.expires_s, session.csrf, session.sid]
        payload = _b64(orjson.dumps(fields))
        return f"{payload}.{self._sign(payload)}"

    def decode(self, cookie: str | None, now_s: float | None = None) -> Session | None:
        """The session a cookie claims, or None: missing, not ASCII, forged, signed with another
        token, unreadable or expired all mean "not signed in". Whether the session still exists
        is `SessionStore.read`'s question."""
        if not cookie or not cookie.isascii() or cookie.count(".") != 1:
            return None  # compare_digest refuses non-ASCII text: it would raise, not answer
        payload, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        try:
            who, expires_s, csrf, sid = orjson.loads(base64.urlsafe_b64decode(payload + "=="))
            session = Session(str(who), int(expires_s), str(csrf), str(sid))
        except (ValueError, TypeError, orjson.JSONDecodeError):
            return None
        now = time.time() if now_s is None else now_s
        return session if session.expires_s > now else None

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


class SessionStore:
    """The sessions signed in now: a cookie is a session only while its key is in Redis."""

    def __init__(self, sessions: Sessions, keys: Keys, redis: Callable[[], Any]) -> None:
        """`redis` gives the client at each call (the receiver's, None while it starts)."""
        self.sessions = sessions
        self._keys = keys
        self._redis = redis

    async def start(self, who: str) -> Session:
        """A new session for `who`, stored for its lifetime."""
        session = self.sessions.new(who)
        lifetime_ms = max(1, int(self.sessions.lifetime_s * 1000))
        await self._redis().set(self._keys.ops_session(session.sid), who, px=lifetime_ms)
        return session

    async def read(self, request: Request) -> Session | None:
        """The request's session, or None when its cookie is no valid, live session."""
        session = self.sessions.decode(request.cookies.get(COOKIE))
        if session is None or not session.sid:
            return None
        exists = await self._redis().exists(self._keys.ops_session(session.sid))
        return session if exists else None

    async def end(self, session: Session) -> None:
        """Revoke a session: its cookie and CSRF token stop working everywhere at once."""
        await self._redis().delete(self._keys.ops_session(session.sid))


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
