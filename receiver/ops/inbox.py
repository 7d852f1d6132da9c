"""The ops page's inbox: a tenant's conversations, search, one conversation as a thread, the
overview, and the files of customers' messages.

    GET /ops/conversations          the overview (every tenant's counts, workers, the AI's pause)
    GET /ops/conversations?tenant=  the tenant's conversations, newest activity first (offset=),
                                    or those matching q= (number, contact name, a word)
    GET /ops/thread?tenant=&person= one conversation in time order, with the reply form
    GET /ops/media?tenant=&person=&id=&n=   the n-th file of one of the person's messages
    GET /ops/live.js                the script that keeps these pages live

Read-only (the thread's reply form posts to /ops/conversation/reply). What it reads and how it
stays bounded: shared/ops/conversations.py and thread.py; the file fetch: shared/ops/media.py.

Live: each page's changing part is a template of its own (`_*_live.html`), answered alone for
`part=live`; static/live.js fetches that every 3 s while the tab is shown and puts it in place.
These pages' CSP allows that one script from the page's own origin (`script-src 'self'`, and
`connect-src 'self'` for its fetch); no inline script, nothing from elsewhere. Without scripts
the pages are the same, as of their load.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from receiver.ops import queries
from receiver.ops.auth import Session
from receiver.ops.queries import NotFound
from receiver.ops.web import HEADERS
from shared.chatwoot import TENANT_PREFIX as CHATWOOT_TENANT
from shared.conversation.kept_files import File, files_of_event
from shared.keys import Keys
from shared.ops import conversations, thread
from shared.ops.media import INLINE_TYPES, MediaError, OpsMedia
from shared.ops.thread import int_of
from shared.settings import Settings

QUERY_MAX = 100
# A file is the provider's, not the page's: no script, no frame, nothing it may load.
MEDIA_HEADERS = {
    **HEADERS,
    "content-security-policy": "default-src 'none'; sandbox",
    "cache-control": "private, max-age=300",
}

# The pages with live.js: the page's own CSP, plus that one script and its fetch.
# A voice note plays in the page from /ops/media: media-src 'self' too.
LIVE_CSP = (
    HEADERS["content-security-policy"] + "; script-src 'self'; connect-src 'self'; media-src 'self'"
)
LIVE_JS = (Path(__file__).parent / "static" / "live.js").read_bytes()
LIVE_JS_HEADERS = {**HEADERS, "cache-control": "no-cache"}

Render = Callable[..., Awaitable[Response]]  # OpsPage._render: rendered in slices


class Inbox:
    def __init__(
        self, redis: Callable[[], Any], keys: Keys, settings: Settings, render: Render
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._settings = settings
        self._render = render
        self._media: OpsMedia | None = None

    async def aclose(self) -> None:
        if self._media is not None:
            await self._media.aclose()
            self._media = None

    async def conversations(self, request: Request, session: Session) -> Response:
        params = request.query_params
        tenant = params.get("tenant", "")
        redis = self._redis()
        overview = await conversations.overview(redis, self._keys)
        if not tenant:
            return await self.live_page(request, session, "inbox", overview=overview)
        await queries.check_tenant(redis, self._keys, tenant)
        query = " ".join(params.get("q", "").split())[:QUERY_MAX]
        offset = params.get("offset", "0")
        zone = self._settings.tenant(tenant).timezone
        if query:
            listing = await conversations.search(redis, self._keys, tenant, query, zone)
        else:
            start = int(offset) if offset.isdigit() else 0
            listing = await conversations.listing(redis, self._keys, tenant, start, zone)
        counts = next((t for t in overview.tenants if t.tenant == tenant), None)
        return await self.live_page(
            request,
            session,
            "conversations",
            overview=overview,
            counts=counts,
            listing=listing,
            zone=zone,
            look=conversations.SEARCH_LOOK,
            review_look=thread.REVIEW_LOOK,
        )

    async def thread(self, request: Request, session: Session) -> Response:
        params = request.query_params
        tenant, person = params.get("tenant", ""), params.get("person", "")
        redis = self._redis()
        await queries.check_person(redis, self._keys, tenant, person)
        zone = self._settings.tenant(tenant).timezone
        shown = await thread.thread(redis, self._keys, tenant, person, zone)
        pause = shown.paused
        return await self.live_page(
            request,
            session,
            "thread",
            t=shown,
            tenant=tenant,
            person=person,
            paused_until=thread.local(int_of(pause.get("until_ms")), zone) if pause else "",
            # Chatwoot has no 24-hour window of its own to show (its channels differ).
            chatwoot=tenant.startswith(CHATWOOT_TENANT),
        )

    async def live_page(
        self, request: Request, session: Session, name: str, **context: Any
    ) -> Response:
        """The page `name`, or only its live part (`part=live`, what live.js asks for). The
        review list (receiver/ops/routes.py) is served through here too."""
        params = dict(request.query_params)
        if params.pop("part", "") == "live":
            return await self._render(request, f"_{name}_live.html", session, **context)
        live_url = f"{request.url.path}?{urlencode({**params, 'part': 'live'})}"
        response = await self._render(
            request, f"{name}.html", session, live_url=live_url, **context
        )
        response.headers["content-security-policy"] = LIVE_CSP
        return response

    async def live_js(self, request: Request) -> Response:
        return Response(LIVE_JS, media_type="text/javascript", headers=LIVE_JS_HEADERS)

    async def media(self, request: Request, session: Session) -> Response:
        params = request.query_params
        tenant, person = params.get("tenant", ""), params.get("person", "")
        message_id, n = params.get("id", ""), params.get("n", "0")
        redis = self._redis()
        await queries.check_person(redis, self._keys, tenant, person)
        found = await thread.message_event(redis, self._keys, tenant, person, message_id)
        files: list[File] = []
        if isinstance(found, list):
            files = found
        elif found is not None:
            files = files_of_event(found)
        chosen = [f for f in files if n.isdigit() and f.n == int(n)]
        if not chosen:
            raise NotFound(f"no file {n!r} of message {message_id!r} of person {person!r}")
        if self._media is None:  # one per process: its client keeps its connections
            self._media = OpsMedia(self._settings)
        try:
            got = await self._media.get(tenant, chosen[0])
        except MediaError as exc:
            raise NotFound(f"the file could not be had: {exc}") from None
        headers = dict(MEDIA_HEADERS)
        kind = got.content_type
        if kind not in INLINE_TYPES:
            kind = "application/octet-stream"
            headers["content-disposition"] = "attachment"
        return Response(got.body, media_type=kind, headers=headers)
