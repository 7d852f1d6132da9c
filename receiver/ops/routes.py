"""The ops page's routes, mounted at `/ops` by the receiver when `OPS_TOKEN` or `OPS_USERS` is
set.

    GET  /ops/                  review items across tenants (filters: reason, tenant, age);
                                its table live (part=live, as the inbox's pages)
    GET  /ops/item              one item (?tenant=&id=)
    GET  /ops/conversation      one person's conversation (?tenant=&person=)
    GET  /ops/audit             who did what, newest first (who=, action=, before= cursor)
    GET  /ops/conversations     the inbox: overview, a tenant's conversations, search
    GET  /ops/thread            one conversation in time order (?tenant=&person=)
    GET  /ops/media             the file of a customer's message (?tenant=&person=&id=&n=)
    GET  /ops/live.js           the script that keeps the inbox's pages live (no session needed)
    POST /ops/item/requeue      requeue an item (form: tenant, id)
    POST /ops/item/drop         drop an item (form: tenant, id)
    POST /ops/bulk              requeue or drop every item of a reason, in the background
                                (form: action, reason, tenant, age; drop: confirm=yes)
    GET  /ops/bulk              a bulk action's progress and what it did (?job=)
    POST /ops/bulk/continue     take up a bulk action that stopped (form: job)
    POST /ops/bulk-requeue      the same as /ops/bulk with action=requeue
    POST /ops/conversation/reply    reply by hand (form: tenant, person, text)
    POST /ops/conversation/pause    pause the bot for the person (form: tenant, person,
                                    seconds, why)
    POST /ops/conversation/resume   the bot answers the person again
    GET  /ops/forget            the confirmation step of forgetting a person
    POST /ops/forget            forget the person (form: tenant, person, confirm=yes)
    GET/POST /ops/signin, POST /ops/signout
    GET  /ops/sessions          the sessions signed in now
    POST /ops/sessions/end      end one (form: sid): one's own, or anyone's for the admin

Ids travel in query strings and form fields, never in the path, so any id a provider
gives (colons, slashes, anything) round-trips. A POST that succeeds answers 303 to a page
(post/redirect/get) with `done=`, one of a fixed set of messages: no text from the query
string is ever shown as a message. Its own sub-app: nothing here wraps the webhook routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from receiver.ops import queries
from receiver.ops.actions import ActionError, Actions
from receiver.ops.auth import Session, Sessions, SessionStore, session_secret
from receiver.ops.backoff import SigninBackoff
from receiver.ops.bulk import BulkJobs, Job
from receiver.ops.inbox import Inbox
from receiver.ops.person_actions import PersonActions
from receiver.ops.signin import SigninPages
from receiver.ops.web import Web, field, link, redirect
from shared.keys import KeyError_, Keys
from shared.ops import audit, live_state
from shared.ops.accounts import parse_accounts
from shared.ops.manual_reply import ManualReplies
from shared.ops.review import ReviewList
from shared.ops.review_index import ReviewIndex
from shared.settings import Settings
from shared.storage.scripts import Scripts

logger = logging.getLogger(__name__)

DONE = {
    "requeued": "Requeued: the messages are a batch again, due now.",
    "dropped": "Dropped: the item is gone from the review list.",
    "replied": "Sent: your reply went out and is in the memory.",
    "template": "The 24-hour window was closed: the tenant's template went out instead.",
    "paused": "Paused: the bot sends this person nothing until the pause ends or you resume.",
    "resumed": "Resumed: the bot answers this person again (waiting messages are due now).",
}


class OpsHost(Protocol):
    """What the ops page uses of the receiver that mounts it (receiver/app.py `Receiver`),
    read at each request: `redis` is None while the receiver starts or stops."""

    @property
    def settings(self) -> Settings: ...
    @property
    def keys(self) -> Keys: ...
    @property
    def scripts(self) -> Scripts: ...
    @property
    def redis(self) -> Any: ...
    @property
    def on_close(self) -> list[Callable[[], Awaitable[None]]]: ...


class OpsPage:
    def __init__(self, receiver: OpsHost) -> None:
        self._receiver = receiver
        settings = receiver.settings
        secret = session_secret(settings.ops_token, settings.ops_users)
        sessions = Sessions(secret, settings.ops_session_s)
        self.web = Web(SessionStore(sessions, receiver.keys, lambda: self._redis))
        self.signin = SigninPages(
            self.web,
            SigninBackoff(receiver.keys, receiver.scripts, settings),
            settings.ops_token,
            parse_accounts(settings.ops_users),
            lambda: self._redis,
            self._audit,
        )
        self._replies: ManualReplies | None = None
        self.inbox = Inbox(lambda: self._redis, receiver.keys, settings, self._render)
        self._bulk_tasks: set[asyncio.Task[None]] = set()
        receiver.on_close.append(self._close)
        receiver.on_close.append(self.inbox.aclose)

    async def _close(self) -> None:
        # A bulk job stopped here keeps its cursor: "Continue" takes it up (receiver/ops/bulk.py).
        for task in list(self._bulk_tasks):
            task.cancel()
        if self._bulk_tasks:
            await asyncio.gather(*self._bulk_tasks, return_exceptions=True)
        if self._replies is not None:
            await self._replies.aclose()
            self._replies = None

    # --- what each request works with --------------------------------------------------------
    @property
    def _redis(self) -> Any:
        if self._receiver.redis is None:
            raise OSError("the receiver is starting or stopping")
        return self._receiver.redis

    def _review(self) -> ReviewList:
        return ReviewList(self._redis, self._receiver.keys, self._receiver.scripts)

    def _index(self) -> ReviewIndex:
        return ReviewIndex(self._redis, self._receiver.keys, self._receiver.scripts)

    def _bulk(self) -> BulkJobs:
        r = self._receiver
        return BulkJobs(
            self._redis, r.keys, self._review(), self._index(), r.settings, self._bulk_tasks
        )

    def _actions(self) -> Actions:
        r = self._receiver
        return Actions(self._redis, r.keys, self._review(), r.settings)

    def _person_actions(self) -> PersonActions:
        r = self._receiver
        if self._replies is None:  # one per process: its senders keep their connections
            self._replies = ManualReplies(self._redis, r.keys, r.scripts, r.settings)
        return PersonActions(self._redis, r.keys, r.scripts, r.settings, self._replies)

    async def _audit(self, who: str, action: str, detail: str) -> None:
        r = self._receiver
        await audit.record(
            self._redis,
            r.keys,
            who=who,
            action=action,
            detail=detail,
            retention_s=r.settings.review_retention_s,
        )

    def _zone_of(self, tenant: str) -> str:
        """The tenant's time zone: the pages show its times as its people read them."""
        return self._receiver.settings.tenant(tenant).timezone

    async def _render(
        self, request: Request, name: str, session: Session, status: int = 200, **context: Any
    ) -> Response:
        done = DONE.get(request.query_params.get("done", ""), "")
        return await self.web.render_sliced(request, name, session, status, done=done, **context)

    # --- pages -----------------------------------------------------------------------------------
    async def overview(self, request: Request, session: Session) -> Response:
        params = request.query_params
        view = await queries.overview(
            self._redis,
            self._receiver.keys,
            self._index(),
            reason=params.get("reason", ""),
            tenant=params.get("tenant", ""),
            age=params.get("age", ""),
            after=params.get("after", ""),
            before=params.get("before", ""),
        )
        entries = await queries.audit_entries(self._redis, self._receiver.keys, limit=10)
        return await self.inbox.live_page(
            request,
            session,
            "review",
            view=view,
            ages=queries.AGES,
            audit=entries,
            zone_of=self._zone_of,
        )

    async def item(self, request: Request, session: Session) -> Response:
        tenant, item_id = request.query_params.get("tenant", ""), request.query_params.get("id", "")
        found = await queries.item(
            self._redis, self._receiver.keys, self._review(), tenant, item_id
        )
        return await self._render(
            request, "item.html", session, item=found, zone=self._zone_of(tenant)
        )

    async def conversation(self, request: Request, session: Session) -> Response:
        params = request.query_params
        tenant, person = params.get("tenant", ""), params.get("person", "")
        state = await queries.conversation(self._redis, self._receiver.keys, tenant, person)
        entries = await queries.audit_entries(self._redis, self._receiver.keys, tenant, person)
        return await self._render(
            request,
            "conversation.html",
            session,
            c=state,
            zone=self._zone_of(tenant),
            audit=entries,
            audit_scanned=f"{queries.AUDIT_SCANNED:,}".replace(",", " "),
            pause_choices=self._person_actions().pause_choices(),
        )

    async def forget_form(self, request: Request, session: Session) -> Response:
        params = request.query_params
        tenant, person = params.get("tenant", ""), params.get("person", "")
        await queries.check_person(self._redis, self._receiver.keys, tenant, person)
        return await self._render(request, "forget.html", session, tenant=tenant, person=person)

    async def audit(self, request: Request, session: Session) -> Response:
        params = request.query_params
        who, action = params.get("who", "").strip()[:200], params.get("action", "").strip()[:200]
        before = params.get("before", "")
        try:
            found = await audit.page(
                self._redis,
                self._receiver.keys,
                before=before,
                who=who,
                action=action,
                limit=queries.AUDIT_SHOWN,
                scan=queries.AUDIT_SCANNED,
            )
        except ValueError as exc:
            raise queries.BadFilter(f"{exc}: follow the page's own links") from None
        return await self._render(
            request,
            "audit.html",
            session,
            audit=found.entries,
            page=found,
            filters={"who": who, "action": action},
            first_page=not before,
            scanned=queries.AUDIT_SCANNED,
        )

    # --- actions ---------------------------------------------------------------------------------
    async def requeue(self, request: Request, session: Session, form: FormData) -> Response:
        item = await self._actions().requeue(session.who, field(form, "tenant"), field(form, "id"))
        return redirect(_conversation(item, "requeued"))

    async def drop(self, request: Request, session: Session, form: FormData) -> Response:
        item = await self._actions().drop(session.who, field(form, "tenant"), field(form, "id"))
        return redirect(_conversation(item, "dropped"))

    async def bulk(self, request: Request, session: Session, form: FormData) -> Response:
        return await self._start_bulk(session, form, field(form, "action"))

    async def bulk_requeue(self, request: Request, session: Session, form: FormData) -> Response:
        return await self._start_bulk(session, form, "requeue")

    async def _start_bulk(self, session: Session, form: FormData, action: str) -> Response:
        reason, tenant, age = field(form, "reason"), field(form, "tenant"), field(form, "age")
        if action == "drop" and field(form, "confirm") != "yes":
            raise ActionError("tick the box to confirm that every matching item is to be dropped")
        if age not in queries.AGES:
            raise queries.BadFilter(f"unknown age filter {age!r}")
        if tenant:
            await queries.check_tenant(self._redis, self._receiver.keys, tenant)
        every = await queries.tenants(self._redis, self._receiver.keys)
        if filling := await self._index().fill(every):
            # The job reads the index: items not in it yet would be left out, unsaid.
            raise ActionError(
                f"the items an earlier release parked for {', '.join(filling)} are still being "
                "indexed; try again in a moment"
            )
        now = await live_state.redis_now_ms(self._redis)
        max_ms = now - queries.AGES[age] * 1000
        job = await self._bulk().start(session.who, action, reason, tenant, every, max_ms, age)
        return redirect(link("/bulk", job=job))

    async def bulk_progress(self, request: Request, session: Session) -> Response:
        job = await self._bulk_job(request.query_params.get("job", ""))
        return await self._render(request, "bulk.html", session, job=job)

    async def bulk_continue(self, request: Request, session: Session, form: FormData) -> Response:
        job = await self._bulk_job(field(form, "job"))
        if job.state == "finished":
            raise ActionError(f"bulk job {job.id} has finished")
        if job.running:
            raise ActionError(f"bulk job {job.id} is running")
        self._bulk().run_in_background(job.id)
        return redirect(link("/bulk", job=job.id))

    async def _bulk_job(self, job_id: str) -> Job:
        try:
            job = await self._bulk().get(job_id) if job_id else None
        except KeyError_:
            job = None
        if job is None:
            raise queries.NotFound(f"no bulk job {job_id!r} (a job is kept a day)")
        return job

    async def reply(self, request: Request, session: Session, form: FormData) -> Response:
        tenant, person = field(form, "tenant"), field(form, "person")
        result = await self._person_actions().reply(
            session.who, tenant, person, field(form, "text")
        )
        done = "template" if result.template else "replied"
        back = "/thread" if field(form, "then") == "thread" else "/conversation"
        return redirect(link(back, tenant=tenant, person=person, done=done))

    async def pause(self, request: Request, session: Session, form: FormData) -> Response:
        tenant, person = field(form, "tenant"), field(form, "person")
        await self._person_actions().pause(
            session.who, tenant, person, field(form, "seconds"), field(form, "why")
        )
        return redirect(link("/conversation", tenant=tenant, person=person, done="paused"))

    async def resume(self, request: Request, session: Session, form: FormData) -> Response:
        tenant, person = field(form, "tenant"), field(form, "person")
        await self._person_actions().resume(session.who, tenant, person)
        return redirect(link("/conversation", tenant=tenant, person=person, done="resumed"))

    async def forget(self, request: Request, session: Session, form: FormData) -> Response:
        tenant, person = field(form, "tenant"), field(form, "person")
        if field(form, "confirm") != "yes":
            raise ActionError("tick the box to confirm that this person is to be forgotten")
        report = await self._person_actions().forget(session.who, tenant, person)
        return await self._render(request, "forgotten.html", session, report=report)

    def app(self) -> Starlette:
        page, action = self.web.page, self.web.action
        return Starlette(
            routes=[
                Route("/", page(self.overview), methods=["GET"]),
                Route("/signin", self.signin.form, methods=["GET"]),
                Route("/signin", self.signin.signin, methods=["POST"]),
                Route("/signout", action(self.signin.signout), methods=["POST"]),
                Route("/sessions", page(self.signin.sessions), methods=["GET"]),
                Route("/sessions/end", action(self.signin.end), methods=["POST"]),
                Route("/item", page(self.item), methods=["GET"]),
                Route("/conversation", page(self.conversation), methods=["GET"]),
                Route("/audit", page(self.audit), methods=["GET"]),
                Route("/conversations", page(self.inbox.conversations), methods=["GET"]),
                Route("/thread", page(self.inbox.thread), methods=["GET"]),
                Route("/media", page(self.inbox.media), methods=["GET"]),
                Route("/live.js", self.inbox.live_js, methods=["GET"]),
                Route("/item/requeue", action(self.requeue), methods=["POST"]),
                Route("/item/drop", action(self.drop), methods=["POST"]),
                Route("/bulk", action(self.bulk), methods=["POST"]),
                Route("/bulk", page(self.bulk_progress), methods=["GET"]),
                Route("/bulk/continue", action(self.bulk_continue), methods=["POST"]),
                Route("/bulk-requeue", action(self.bulk_requeue), methods=["POST"]),
                Route("/conversation/reply", action(self.reply, None), methods=["POST"]),
                Route("/conversation/pause", action(self.pause), methods=["POST"]),
                Route("/conversation/resume", action(self.resume), methods=["POST"]),
                Route("/forget", page(self.forget_form), methods=["GET"]),
                Route("/forget", action(self.forget), methods=["POST"]),
            ]
        )


def _conversation(item: dict[str, Any], done: str) -> str:
    return link("/conversation", tenant=item["tenant"], person=item.get("person"), done=done)
