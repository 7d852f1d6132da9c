"""Who may use the ops page: the sign-in check, the session cookie and the CSRF token.

A small HMAC-signed cookie of our own rather than Starlette's SessionMiddleware: the cookie
must be `Secure` exactly when the request came over https (Heroku's router says so with
`X-Forwarded-Proto`), which the middleware only knows as a fixed flag; a middleware would
also wrap every route of the app, and the webhook path must not pay for the ops page. The
cookie holds `who`, the expiry, the session's CSRF token, its id and whether it was opened with
the admin's `OPS_TOKEN` or an account of `OPS_USERS`, signed with a key derived from both:
changing either invalidates every cookie, which is how one signs everyone out (and how an
account taken out of `OPS_USERS`, or given a new password, loses its sessions). It is
HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it) and scoped to
`/ops`.

A signature alone cannot be taken back, so each session also exists in Redis
(`Keys.ops_session`, PX its lifetime, listed in `Keys.ops_sessions`): signing out, or ending
it from the sessions page, deletes it, and from then on its cookie and CSRF token are worth
nothing, in every receiver process. A cookie that is not ASCII, not
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
_KEY_LABEL = b"wa-inbox ops session v1"


@dataclass(frozen=True)
class Session:
    who: str
    expires_s: int
    csrf: str
    sid: str  # the session's id: its key in Redis
    admin: bool = True  # opened with OPS_TOKEN (may end anyone's session), not an account


@dataclass(frozen=True)
class LiveSession:
    """A session as the sessions page lists it."""

    sid: str
    who: str
    admin: bool
    since_ms: int
    expires_ms: int
    address: str


def token_matches(given: str, token: str) -> bool:
    """Constant-time: the comparison takes as long whatever prefix of the token is right."""
    return bool(token) and hmac.compare_digest(given.encode(), token.encode())


def session_secret(ops_token: str, ops_users: str) -> str:
    """What the cookies' key is derived from: both ways in, so changing either signs everyone
    out (an `OPS_USERS` without `OPS_TOKEN` is secret too: it holds the credentials)."""
    # Without accounts the key is the token's alone, as before they existed: an upgrade
    # signs nobody out.
    return f"{ops_token}\n{ops_users}" if ops_users else ops_token


class Sessions:
    """Signs and reads session cookies for one secret (`session_secret`)."""

    def __init__(self, secret: str, lifetime_s: float) -> None:
        self._key = hmac.new(secret.encode(), _KEY_LABEL, hashlib.sha256).digest()
        self._lifetime_s = lifetime_s

    @property
    def lifetime_s(self) -> float:
        return self._lifetime_s

    def new(self, who: str, admin: bool = True, now_s: float | None = None) -> Session:
        now = time.time() if now_s is None else now_s
        expires_s = int(now + self._lifetime_s)
        return Session(who, expires_s, secrets.token_urlsafe(24), secrets.token_urlsafe(24), admin)

    def encode(self, session: Session) -> str:
        fields = [session.who, session.expires_s, session.csrf, session.sid, int(session.admin)]
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
            who, expires_s, csrf, sid, *admin = orjson.loads(
                base64.urlsafe_b64decode(payload + "==")
            )
            # A cookie of the release before has no fifth field: it was the token's.
            session = Session(str(who), int(expires_s), str(csrf), str(sid), admin != [0])
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

    async def start(self, who: str, admin: bool = True, address: str = "") -> Session:
        """A new session for `who`, stored for its lifetime and listed for the sessions page."""
        session = self.sessions.new(who, admin)
        lifetime_ms = max(1, int(self.sessions.lifetime_s * 1000))
        now_ms = int(time.time() * 1000)
        listed = orjson.dumps(
            {
                "who": who,
                "admin": admin,
                "since_ms": now_ms,
                "address": address,
                "expires_ms": now_ms + lifetime_ms,
            }
        )
        redis = self._redis()
        # Two keys, two slots: the session key alone decides; the list only shows.
        await redis.set(self._keys.ops_session(session.sid), who, px=lifetime_ms)
        await redis.hset(self._keys.ops_sessions, session.sid, listed)
        return session

    async def live(self) -> list[LiveSession]:
        """The sessions signed in now, newest first; entries of ended or expired sessions are
        dropped from the list as they are found."""
        redis = self._redis()
        listed = await redis.hgetall(self._keys.ops_sessions)
        now_ms = int(time.time() * 1000)
        found, gone = [], []
        for raw_sid, raw in listed.items():
            sid = raw_sid.decode() if isinstance(raw_sid, bytes) else str(raw_sid)
            try:
                entry = orjson.loads(raw)
                session = LiveSession(
                    sid,
                    str(entry["who"]),
                    bool(entry["admin"]),
                    int(entry["since_ms"]),
                    int(entry["expires_ms"]),
                    str(entry.get("address", "")),
                )
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                gone.append(sid)
                continue
            if session.expires_ms <= now_ms:
                gone.append(sid)
            else:
                found.append(session)
        alive = [await redis.exists(self._keys.ops_session(s.sid)) for s in found]
        gone += [s.sid for s, up in zip(found, alive, strict=True) if not up]
        if gone:
            await redis.hdel(self._keys.ops_sessions, *gone)
        live = [s for s, up in zip(found, alive, strict=True) if up]
        return sorted(live, key=lambda s: s.since_ms, reverse=True)

    async def read(self, request: Request) -> Session | None:
        """The request's session, or None when its cookie is no valid, live session."""
        session = self.sessions.decode(request.cookies.get(COOKIE))
        if session is None or not session.sid:
            return None
        exists = await self._redis().exists(self._keys.ops_session(session.sid))
        return session if exists else None

    async def end(self, sid: str) -> None:
        """Revoke a session: its cookie and CSRF token stop working everywhere at once."""
        redis = self._redis()
        await redis.delete(self._keys.ops_session(sid))
        await redis.hdel(self._keys.ops_sessions, sid)


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
