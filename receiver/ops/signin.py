"""Signing in and out of the ops page, and the sessions signed in now.

Two ways in. An account of `OPS_USERS` (shared/ops/accounts.py): the operator gives the
account's name and its password or token, and the audit records that name, which nobody else
can give. The admin's `OPS_TOKEN`, as before accounts existed: the name is whatever the
holder types, except an account's name, so the token cannot be used to act under a colleague's
name. Either way a sign-in first passes the back-off (receiver/ops/backoff.py), counted per
client address and per name before any secret is compared.

A password is checked with scrypt (~50 ms of CPU) in a thread, so the event loop that answers
webhooks in the same process never waits for it.

`/ops/sessions` lists the sessions signed in now: everyone sees them (who is in, from where);
an account may end its own, the admin any. Ending one deletes its key in Redis: its cookie
and CSRF token stop working at once in every receiver process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from receiver.ops.actions import ActionError
from receiver.ops.auth import Session, SessionStore, clear_cookie, token_matches
from receiver.ops.backoff import SigninBackoff, client_address
from receiver.ops.queries import NotFound
from receiver.ops.web import ROOT, Web, field, read_form, redirect
from shared.ops.accounts import Account, clean_name

logger = logging.getLogger(__name__)

WRONG = "Wrong name or password."
ENDED = "Ended: that session's cookie works nowhere any more."


class SigninPages:
    def __init__(
        self,
        web: Web,
        backoff: SigninBackoff,
        ops_token: str,
        accounts: Mapping[str, Account],
        redis: Callable[[], Any],
        audit: Callable[[str, str, str], Awaitable[object]],
    ) -> None:
        """`redis` gives the client at each call (see OpsPage._redis); `audit(who, action,
        detail)` records an entry of the audit log."""
        self._web = web
        self._backoff = backoff
        self._ops_token = ops_token
        self._accounts = accounts
        self._redis_of = redis
        self._audit = audit

    @property
    def _store(self) -> SessionStore:
        return self._web.store

    @property
    def _redis(self) -> Any:
        return self._redis_of()

    async def form(self, request: Request) -> Response:
        return self._render_form(request, _safe_next(request))

    async def signin(self, request: Request) -> Response:
        form = await read_form(request)
        if isinstance(form, Response):
            return form
        return await self._web.guarded(request, None, lambda: self._sign_in(request, form))

    async def _sign_in(self, request: Request, form: FormData) -> Response:
        target = _safe_next(request, field(form, "next"))
        name = clean_name(field(form, "name"))
        address = client_address(request)
        attempt = await self._backoff.take(self._redis, address, name)
        if attempt.wait_s:
            logger.debug("ops page: sign-in from %s refused for %d s", address, attempt.wait_s)
            return self._backing_off(request, target, attempt.wait_s)
        secret = field(form, "token")
        account = self._accounts.get(name.casefold()) if name else None
        if account is not None:
            # scrypt releases the GIL: the loop goes on answering webhooks meanwhile.
            right = await asyncio.to_thread(account.verify, secret)
            who, admin = account.name, False
        else:
            right = token_matches(secret, self._ops_token)
            who, admin = name or "", True
        if not right:
            logger.warning(
                "ops page: sign-in refused (wrong %s; %d attempts from %s or for the name)",
                "password or token" if account else "token",
                attempt.failures,
                address,
            )
            wrong = WRONG if self._accounts else "Wrong token."
            return self._render_form(request, target, 401, wrong)
        await self._backoff.reset(self._redis, address, name)
        if not who:
            message = "Give your name (at most 64 characters): the audit log records it."
            return self._render_form(request, target, 400, message)
        session = await self._store.start(who, admin, address)
        response = redirect(target)
        self._store.sessions.set_cookie(response, request, session)
        logger.info("ops page: %s signed in%s", who, " with the ops token" if admin else "")
        return response

    def _render_form(
        self, request: Request, target: str, status: int = 200, message: str = ""
    ) -> Response:
        context: dict[str, object] = {"next": target, "accounts": bool(self._accounts)}
        if message:
            context["message"] = message
        return self._web.render(request, "signin.html", None, status, **context)

    def _backing_off(self, request: Request, target: str, wait_s: int) -> Response:
        """429: too many failed sign-ins from this address or for this name; the secret is
        not even compared, so guessing on gains nothing until the wait is over."""
        message = f"Too many failed sign-ins from here or for this name: try again in {wait_s} s."
        response = self._render_form(request, target, 429, message)
        response.headers["retry-after"] = str(wait_s)
        return response

    async def signout(self, request: Request, session: Session, form: FormData) -> Response:
        await self._store.end(session.sid)  # the cookie and its CSRF token die here, everywhere
        response = redirect(f"{ROOT}/signin")
        clear_cookie(response, request)
        logger.info("ops page: %s signed out", session.who)
        return response

    async def sessions(self, request: Request, session: Session) -> Response:
        live = await self._store.live()
        ended = request.query_params.get("done") == "ended"
        done = ENDED if ended else ""  # base.html shows it; never text from the query string
        return self._web.render(
            request, "sessions.html", session, sessions=live, mine=session.sid, done=done
        )

    async def end(self, request: Request, session: Session, form: FormData) -> Response:
        sid = field(form, "sid")
        target = next((s for s in await self._store.live() if s.sid == sid), None)
        if target is None:
            raise NotFound("no such session: it has ended or expired")
        if not session.admin and target.who.casefold() != session.who.casefold():
            raise ActionError("an account may end only its own sessions; the admin ends others'")
        await self._store.end(sid)
        detail = f"{target.who}'s session from {target.address or 'an unknown address'}"
        await self._audit(session.who, "end_session", detail)
        logger.info("ops page: %s ended a session of %s", session.who, target.who)
        if sid == session.sid:
            response = redirect(f"{ROOT}/signin")
            clear_cookie(response, request)
            return response
        return redirect(f"{ROOT}/sessions?done=ended")


def _safe_next(request: Request, given: str | None = None) -> str:
    """Where to go after signing in: a page of ours, never another site (`//evil`)."""
    target = request.query_params.get("next", "") if given is None else given
    if target.startswith(f"{ROOT}/") and not target.startswith("//") and "\\" not in target:
        return target
    return f"{ROOT}/"
