"""The ops page's plumbing: templates, the guards every endpoint passes, error pages.

`page` guards a GET: no valid session -> 303 to the sign-in page. `action` guards a POST: no
valid session -> 403 (a session is valid while its key is in Redis: once signed out, never
again), a body that is not a small form -> 413/400, a missing or wrong CSRF token -> 403, all
before the handler runs, so nothing is changed. Both turn what can go wrong inside into a
clear page: an unknown tenant, item or person 404, an action that cannot be done 409, Redis
not answering 503. Every answer carries headers that keep it out of caches and frames and
forbid scripts and foreign form targets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from redis.exceptions import RedisClusterException, RedisError
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from receiver.ops import explain as explaining
from receiver.ops import present
from receiver.ops.actions import ActionError
from receiver.ops.auth import Session, SessionStore, csrf_ok
from receiver.ops.queries import BadFilter, NotFound
from shared.ops.live_state import duration
from shared.storage.redis_client import explain

logger = logging.getLogger(__name__)

ROOT = "/ops"
# A reply by hand is at most 16384 characters (worker/manual_reply.py), up to 4 bytes each in
# UTF-8 and 3 characters per byte once percent-encoded.
FORM_MAX_BYTES = 256 * 1024
REDIS_WAIT_S = 10.0  # one page's reads or one action, in all
RENDER_SLICE = 100  # template pieces rendered between two turns of the event loop (~0.2 ms)
REDIS_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError)
HEADERS = {
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    # No script at all; styles are inline; forms post only to us.
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
}

STALE_FORM = (
    "This form is stale or forged (its CSRF token does not match your sign-in); nothing was "
    "changed. Reload the page and try again."
)

Page = Callable[[Request, Session], Awaitable[Response]]
Action = Callable[[Request, Session, FormData], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def _when(ms: Any) -> str:
    if not ms:
        return "?"
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def link(path: str, **params: Any) -> str:
    """A link under /ops with its query string (every value percent-encoded)."""
    shown = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{ROOT}{path}" + (f"?{urlencode(shown, quote_via=quote)}" if shown else "")


def templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,  # customer text is hostile: everything is escaped unless marked
    )
    env.filters["when"] = _when
    env.filters["duration"] = duration
    env.filters["sentence"] = explaining.sentence
    env.filters["raw_differs"] = explaining.raw_differs
    env.filters["deliveries"] = explaining.deliveries
    env.filters["tenant_label"] = present.tenant_label
    env.filters["contact_name"] = present.contact_name
    env.filters["first_message_ms"] = present.first_message_ms
    env.filters["local_time"] = present.local_time
    env.tests["chatwoot"] = present.is_chatwoot
    env.globals["link"] = link
    return Jinja2Templates(env=env)


class Web:
    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.templates = templates()
        # The page runs in the receiver's process: the webhooks must not wait behind it. Views
        # are built one at a time (operators reloading nonstop queue here, not in the event
        # loop), and each renders in slices, so a webhook waits at most a slice.
        self.gate = asyncio.Semaphore(1)

    async def render_sliced(
        self,
        request: Request,
        name: str,
        session: Session | None,
        status: int = 200,
        **context: Any,
    ) -> Response:
        """`render`, giving the event loop back every `RENDER_SLICE` pieces of the page."""
        template = self.templates.get_template(name)
        pieces: list[str] = []
        values = {"request": request, "session": session, **context}
        for n, piece in enumerate(template.generate(values), 1):
            pieces.append(piece)
            if n % RENDER_SLICE == 0:
                await asyncio.sleep(0)
        response = HTMLResponse("".join(pieces), status_code=status)
        response.headers.update(HEADERS)
        return response

    def render(
        self,
        request: Request,
        name: str,
        session: Session | None,
        status: int = 200,
        **context: Any,
    ) -> Response:
        response = self.templates.TemplateResponse(
            request, name, {"session": session, **context}, status_code=status
        )
        response.headers.update(HEADERS)
        return response

    def error(
        self, request: Request, session: Session | None, status: int, message: str
    ) -> Response:
        return self.render(request, "error.html", session, status, message=message)

    def page(self, handler: Page) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            session = await self._session(request)
            if isinstance(session, Response):
                return session
            if session is None:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return redirect(link("/signin", next=target))
            async with self.gate:
                return await self.guarded(request, session, lambda: handler(request, session))

        return endpoint

    def action(self, handler: Action, wait_s: float | None = REDIS_WAIT_S) -> Endpoint:
        """`wait_s`: the bound of the whole action; None for one that bounds itself (a reply
        by hand: cancelling it between parts would leave a reply half sent)."""

        async def endpoint(request: Request) -> Response:
            session = await self._session(request)
            if isinstance(session, Response):
                return session
            if session is None:
                return plain(403, "forbidden: sign in first (nothing was changed)")
            form = await read_form(request)
            if isinstance(form, Response):
                return form
            if not csrf_ok(session, form.get("csrf")):
                logger.warning("ops: POST %s without a valid CSRF token", request.url.path)
                return self.error(request, session, 403, STALE_FORM)
            call = lambda: handler(request, session, form)  # noqa: E731
            return await self.guarded(request, session, call, wait_s)

        return endpoint

    async def _session(self, request: Request) -> Session | Response | None:
        """The request's live session, None, or the 503 page when Redis cannot say."""
        try:
            async with asyncio.timeout(REDIS_WAIT_S):
                return await self.store.read(request)
        except REDIS_ERRORS as exc:
            return self.unavailable(request, None, exc)

    async def guarded(
        self,
        request: Request,
        session: Session | None,
        call: Callable[[], Awaitable[Response]],
        wait_s: float | None = REDIS_WAIT_S,
    ) -> Response:
        try:
            async with asyncio.timeout(wait_s):
                return await call()
        except NotFound as exc:
            return self.error(request, session, 404, str(exc))
        except BadFilter as exc:
            return self.error(request, session, 400, str(exc))
        except ActionError as exc:
            return self.error(request, session, 409, f"{exc} (nothing was changed)")
        except REDIS_ERRORS as exc:
            return self.unavailable(request, session, exc)

    def unavailable(self, request: Request, session: Session | None, exc: Exception) -> Response:
        logger.warning("ops page: Redis did not answer: %s", explain(exc))
        return self.error(
            request, session, 503, f"Redis did not answer ({explain(exc)}); try again."
        )


async def read_form(request: Request) -> FormData | Response:
    """The POSTed form, or the answer refusing it: only small urlencoded forms are taken."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return plain(400, "bad request: expected a form (nothing was changed)")
    length = request.headers.get("content-length")
    if length is None or not length.isdigit():
        return plain(411, "length required (nothing was changed)")
    if int(length) > FORM_MAX_BYTES:
        return plain(413, "form too large (nothing was changed)")
    return await request.form(max_files=0, max_fields=50, max_part_size=FORM_MAX_BYTES)


def redirect(url: str) -> Response:
    response = RedirectResponse(url, status_code=303)
    response.headers.update(HEADERS)
    return response


def plain(status: int, text: str) -> Response:
    return PlainTextResponse(text, status_code=status, headers=HEADERS)


def field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""
