"""A local stand-in for Chatwoot's application API, for tests and local runs.

    chatwoot = ChatwootApiStandIn(access_tokens="cw-token").start()  # or `with` / `async with`
    # point the product at it: CHATWOOT_BASE_URL=chatwoot.url
    chatwoot.fail_next(2, status=429)                                # the next two calls get 429
    ...
    [m.content for m in chatwoot.replies(conversation=42)]

It serves, under `/api/v1/accounts/{account}/conversations/{conversation}/`, what the product
calls: `messages` (outgoing messages and private notes: 200 with the created message and a
fresh `id`), `toggle_status` (`{"status": "open"}`: 200 with Chatwoot's `payload`) and
`toggle_typing_status` (200, empty). The `api_access_token` header is checked (401 `{"error":
"Invalid Access Token"}`), malformed bodies get 422, unknown paths 404, and every request is
recorded. Faults (HTTP status with Chatwoot's error body, raw bodies, latency, hangs, answers
cut after the call was carried out, per conversation and per kind of call) are set from Python
or over HTTP (`POST /_control`). With `webhook_url` it posts each created message back as a
`message_created` webhook, as Chatwoot does (signed with `webhook_secret`, or carrying
`?token=` when `webhook_token` is set): the bot's own replies come back that way. `GET
/_requests` lists the calls (`requests`) and those webhook deliveries with the receiver's
answer (`webhooks`). It keeps every conversation's messages as Chatwoot does and serves them
back (`GET .../conversations`, `GET .../conversations/{c}/messages`:
scripts/standins/_chatwoot_history.py); `customer_writes` adds a customer's message, with its
webhook or without. `POST /_control`: the ops every stand-in takes are in
`StandInBase.control`, this one's own in `ChatwootApiStandIn._control_ops`.

Run alone: `scripts/chatwoot_standin --port 8082 [--token T] [--webhook-url URL --secret S]`.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins._chatwoot_history import (
    INCOMING,
    OUTGOING,
    ChatwootHistory,
    contact,
)
from scripts.standins._common import (
    UNSET,
    ControlOp,
    RecordedRequest,
    accepts,
    as_tuple,
    fault_fields,
    pick_headers,
)
from scripts.standins._script import Credentials, script_parser, serve_forever
from scripts.standins._webhooks import WebhookStandIn
from scripts.webhooks import (
    agent_user,
    chatwoot_headers,
    conversation_webhook,
    message_created,
    sign_chatwoot,
)

__all__ = [
    "CALL_KINDS",
    "ChatwootApiStandIn",
    "ChatwootFault",
    "CreatedMessage",
    "chatwoot_headers",
    "message_created",
    "sign_chatwoot",
]

CALL_KINDS = frozenset({"reply", "note", "status", "typing"})
# The reads of the catch-up: `GET conversations` ("list") and `GET messages` ("history"). Not
# in a fault's default kinds, so the faults the senders' tests set never touch them.
READ_KINDS = frozenset({"list", "history"})
CONVERSATION_EVENT_MODES = frozenset({"", "account", "agent_bot"})
BOT_SENDER = {"id": 1, "name": "Bot", "type": "agent_bot"}
STATUSES = frozenset({"open", "resolved", "pending", "snoozed"})
DEFAULT_ERRORS = {
    401: "Invalid Access Token",
    403: "You are not authorized to do this action",
    404: "Resource could not be found",
    422: "Validation failed",
    429: "Too many requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}
_PREFIX = "/api/v1/accounts/{account}/conversations/{conversation}"


# ---------------------------------------------------------------------- public data types


@dataclass
class ChatwootFault:
    """One fault rule; the first that matches a call decides (each match uses one of `count`,
    None = never used up). Matching: `kinds` (reply, note, status, typing; default every one)
    and `conversation`; the first `after` matching calls are let through (fail the second part
    of a reply, say). After sleeping `delay`: `raw_body` set → `status` (default 502) with
    that body; else `status` set → Chatwoot's error body `{"error": message}`; neither (a
    pure delay, `hang_next`) → the call is then handled normally, so it IS carried out even
    if the client gave up waiting; `drop` (`drop_next`) → carried out too, but the connection
    is closed halfway through the answer."""

    status: int | None = None
    message: str | None = None
    raw_body: str | None = None
    content_type: str = "text/html"
    delay: float = 0.0
    count: int | None = 1
    conversation: int | None = None
    kinds: frozenset[str] = CALL_KINDS
    after: int = 0
    drop: bool = False
    retry_after: float | None = None  # a `Retry-After` header on the error (a 429's)
    hits: int = 0

    def matches(self, kind: str, conversation: int) -> bool:
        if kind not in self.kinds:
            return False
        return self.conversation is None or self.conversation == conversation

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kinds"] = sorted(self.kinds)
        return data


@dataclass(frozen=True)
class CreatedMessage:
    """A message the stand-in created (a reply, or a private note)."""

    id: int
    account: int
    conversation: int
    content: str
    private: bool
    time: float


@dataclass(frozen=True)
class StatusChange:
    account: int
    conversation: int
    status: str
    time: float


@dataclass(frozen=True)
class WebhookDelivery:
    """One POST of a `message_created` webhook back to `webhook_url`."""

    time: float
    message_id: int
    response_status: int | None
    error: str | None
    body: bytes


# ---------------------------------------------------------------------- the stand-in


class ChatwootApiStandIn(WebhookStandIn[ChatwootFault, WebhookDelivery]):
    """Chatwoot's conversation API, in-process or as a script.

    Constructor (keyword-only; `configure` changes them later):
    - `access_tokens`: accepted `api_access_token` values (str, comma-separated, iterable);
      None accepts any non-empty one. Default "cw-token".
    - `webhook_url`: where to post `message_created` for each created message (None: nowhere);
      `webhook_secret` signs them, `webhook_token` goes in the URL's `?token=`.
    - `inbox_id`: the inbox named in those webhooks (the API paths do not carry it).
    - `conversation_events`: "" (none), "account" or "agent_bot": which conversation events
      to post to `webhook_url` (see the module docstring).
    - `bot_sender`: the `sender` of the messages the product creates (default the agent bot).
    """

    name = "chatwoot-standin"

    def __init__(
        self,
        *,
        access_tokens: str | Iterable[str] | None = ("cw-token",),
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        webhook_token: str | None = None,
        inbox_id: int = 3,
        conversation_events: str = "",
        bot_sender: dict[str, Any] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.access_tokens: tuple[str, ...] | None = ()
        self.webhook_url: str | None = None
        self.webhook_secret: str | None = None
        self.webhook_token: str | None = None
        self.inbox_id = inbox_id
        self.conversation_events = ""
        self.bot_sender: dict[str, Any] = dict(BOT_SENDER)
        self._ids = itertools.count(50_001)
        self._statuses: dict[tuple[int, int], str] = {}
        self._assignees: dict[tuple[int, int], dict[str, Any] | None] = {}
        self.agent_messages: list[CreatedMessage] = []
        # Every message of every conversation, as Chatwoot keeps them (GET conversations,
        # GET messages: scripts/standins/_chatwoot_history.py).
        self.history = ChatwootHistory()
        self._initial_config = {
            "access_tokens": access_tokens,
            "webhook_url": webhook_url,
            "webhook_secret": webhook_secret,
            "webhook_token": webhook_token,
            "inbox_id": inbox_id,
            "conversation_events": conversation_events,
            "bot_sender": bot_sender,
        }
        self.configure(**self._initial_config)
        self._app = self._serve(
            [
                Route(
                    "/api/v1/accounts/{account}/conversations",
                    self._conversation_list,
                    methods=["GET"],
                ),
                Route(f"{_PREFIX}/messages", self._message_list, methods=["GET"]),
                Route(f"{_PREFIX}/{{action}}", self._conversation_call, methods=["POST"]),
            ]
        )

    # ------------------------------------------------------------------ configuration

    def configure(
        self,
        *,
        access_tokens: str | Iterable[str] | None = UNSET,
        webhook_url: str | None = UNSET,
        webhook_secret: str | None = UNSET,
        webhook_token: str | None = UNSET,
        inbox_id: int = UNSET,
        conversation_events: str = UNSET,
        bot_sender: dict[str, Any] | None = UNSET,
    ) -> None:
        """Change any constructor setting at runtime (only the ones given)."""
        unset = UNSET
        with self._lock:
            if access_tokens is not unset:
                self.access_tokens = as_tuple(access_tokens)
            if webhook_url is not unset:
                self.webhook_url = webhook_url or None
            if webhook_secret is not unset:
                self.webhook_secret = webhook_secret or None
            if webhook_token is not unset:
                self.webhook_token = webhook_token or None
            if inbox_id is not unset:
                self.inbox_id = int(inbox_id)
            if conversation_events is not unset:
                if conversation_events not in CONVERSATION_EVENT_MODES:
                    raise ValueError(
                        f"conversation_events must be one of {CONVERSATION_EVENT_MODES}"
                    )
                self.conversation_events = conversation_events
            if bot_sender is not unset:
                self.bot_sender = dict(bot_sender or BOT_SENDER)

    # ------------------------------------------------------------------ faults

    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        *,
        message: str | None = None,
        conversation: int | None = None,
        kinds: Iterable[str] = CALL_KINDS,
        delay: float = 0.0,
        after: int = 0,
        retry_after: float | None = None,
    ) -> ChatwootFault:
        """The next `n` matching calls (after `after` that succeed) get HTTP `status` with
        `{"error": message}` (and a `Retry-After` header when `retry_after` is given)."""
        return self.add_fault(
            ChatwootFault(
                status=status,
                message=message,
                conversation=conversation,
                kinds=frozenset(kinds),
                delay=delay,
                count=n,
                after=after,
                retry_after=retry_after,
            )
        )

    def fail_always(
        self,
        status: int,
        *,
        message: str | None = None,
        conversation: int | None = None,
        kinds: Iterable[str] = CALL_KINDS,
    ) -> ChatwootFault:
        """Every matching call fails with `status` until the fault is removed or reset."""
        return self.add_fault(
            ChatwootFault(
                status=status,
                message=message,
                conversation=conversation,
                kinds=frozenset(kinds),
                count=None,
            )
        )

    def fail_raw(
        self,
        n: int = 1,
        status: int = 502,
        body: str = "<html><body><h1>502 Bad Gateway</h1></body></html>",
        *,
        content_type: str = "text/html",
        kinds: Iterable[str] = CALL_KINDS,
    ) -> ChatwootFault:
        """The next `n` calls get HTTP `status` with a non-JSON body (a proxy's error page)."""
        return self.add_fault(
            ChatwootFault(
                status=status,
                raw_body=body,
                content_type=content_type,
                kinds=frozenset(kinds),
                count=n,
            )
        )

    def hang_next(
        self, n: int = 1, seconds: float = 30.0, *, kinds: Iterable[str] = CALL_KINDS
    ) -> ChatwootFault:
        """The next `n` calls wait `seconds`, then are carried out (the client may be gone)."""
        return self.add_fault(ChatwootFault(delay=seconds, kinds=frozenset(kinds), count=n))

    def drop_next(self, n: int = 1, *, kinds: Iterable[str] = CALL_KINDS) -> ChatwootFault:
        """The next `n` calls are carried out (a message IS created), then the connection is
        closed before the answer is complete: the client never learns the message's id."""
        return self.add_fault(ChatwootFault(drop=True, kinds=frozenset(kinds), count=n))

    def clear(self) -> None:
        """Forget records, conversation statuses and webhook deliveries."""
        with self._lock:
            super().clear()
            self._statuses.clear()
            self._assignees.clear()
            self.agent_messages.clear()
            self.history.clear()

    def _admits(self, kind: str, conversation: int) -> ChatwootFault | None:
        def admits(fault: ChatwootFault) -> bool:
            if not fault.matches(kind, conversation):
                return False
            if fault.after > 0:  # let this one through, and count it
                fault.after -= 1
                return False
            return True

        return self._take_fault(admits)

    # ------------------------------------------------------------------ what was done

    def created(self, conversation: int | None = None) -> list[CreatedMessage]:
        """Every message created (replies and notes), oldest first."""
        with self._lock:
            made = [r.extra["created"] for r in self._records if r.ok and "created" in r.extra]
        return [m for m in made if conversation is None or m.conversation == conversation]

    def replies(self, conversation: int | None = None) -> list[CreatedMessage]:
        """Created public outgoing messages: what the customer receives."""
        return [m for m in self.created(conversation) if not m.private]

    def notes(self, conversation: int | None = None) -> list[CreatedMessage]:
        """Created private notes: what only agents see."""
        return [m for m in self.created(conversation) if m.private]

    def status_changes(self, conversation: int | None = None) -> list[StatusChange]:
        with self._lock:
            changes = [
                r.extra["status_change"]
                for r in self._records
                if r.ok and "status_change" in r.extra
            ]
        return [c for c in changes if conversation is None or c.conversation == conversation]

    def status_of(self, conversation: int, account: int = 1) -> str | None:
        """The conversation's status as set through `toggle_status` (None: never set)."""
        with self._lock:
            return self._statuses.get((account, conversation))

    def calls(self, kind: str | None = None, conversation: int | None = None) -> list[Any]:
        """Recorded API calls (any answer) of a kind, for a conversation."""
        return [
            r
            for r in self.requests
            if (kind is None or r.kind == kind)
            and (conversation is None or r.extra.get("conversation") == conversation)
        ]

    # ------------------------------------------------------------------ HTTP control

    def _control_ops(self) -> dict[str, ControlOp]:
        """Besides every stand-in's ops (`StandInBase.control`):

        - `{"op": "fail", "status": 429, "count": 2}`: add a fault; fields of
          `ChatwootFault`: status, message, raw_body, content_type, delay, count (null =
          forever), conversation, kinds, after, drop.
        - `{"op": "hang", "seconds": 30, "count": 1}`
        - people in Chatwoot: `{"op": "agent_writes", "conversation": 42, "content": "..."}`
          (optional `name`, `agent_id`), `{"op": "assign", "conversation": 42, "agent_id": 12,
          "name": "..."}` (`agent_id` null: unassign), `{"op": "set_status", "conversation":
          42, "status": "pending"}`, `{"op": "customer_writes", "conversation": 42,
          "content": "hola", "webhook": true}` (optional `name`, `attachments`), `{"op":
          "add_message", "conversation": 42, "content": "...", "message_type": 2, "private":
          false}` (no webhook; optional `sender`); each takes `account` (default 1).
        - `{"op": "conversation_events", "mode": "account"}`: which conversation events to post.
        - `clear` also forgets the conversation statuses and the webhook deliveries.
        """
        return {
            **super()._control_ops(),
            "fail": self._control_fail,
            "hang": lambda p: self.hang_next(int(p.get("count", 1)), float(p.get("seconds", 30.0))),
            "agent_writes": lambda p: self.agent_writes(
                int(p["conversation"]),
                str(p["content"]),
                agent_id=int(p.get("agent_id", 12)),
                name=str(p.get("name", "Laura Gómez")),
                account=int(p.get("account", 1)),
            ),
            "assign": lambda p: self.assign(
                int(p["conversation"]),
                None if p.get("agent_id", 12) is None else int(p.get("agent_id", 12)),
                str(p.get("name", "Laura Gómez")),
                int(p.get("account", 1)),
            ),
            "set_status": lambda p: self.set_status(
                int(p["conversation"]), str(p["status"]), int(p.get("account", 1))
            ),
            "conversation_events": lambda p: self.configure(conversation_events=str(p["mode"])),
            "customer_writes": lambda p: self.customer_writes(
                int(p["conversation"]),
                p.get("content"),
                account=int(p.get("account", 1)),
                name=str(p.get("name", "Ana Pérez")),
                attachments=p.get("attachments"),
                webhook=bool(p.get("webhook", True)),
            ),
            "add_message": lambda p: self.add_message(
                int(p["conversation"]),
                p.get("content"),
                int(p["message_type"]),
                account=int(p.get("account", 1)),
                private=bool(p.get("private", False)),
                sender=p.get("sender"),
            ),
        }

    def _control_fail(self, payload: Mapping[str, Any]) -> None:
        fault = ChatwootFault(**fault_fields(ChatwootFault, payload))
        if fault.status is None and fault.raw_body is None and not fault.delay and not fault.drop:
            raise ValueError("a fault needs status, raw_body, delay or drop")
        self.add_fault(fault)

    def state(self) -> dict[str, Any]:
        with self._lock:
            tokens = self.access_tokens
            return {
                "access_tokens": list(tokens) if tokens is not None else None,
                "webhook_url": self.webhook_url,
                "inbox_id": self.inbox_id,
                **self._fault_state(),
                "statuses": {f"{a}/{c}": s for (a, c), s in self._statuses.items()},
                "pending_webhooks": self._pending_webhooks,
            }

    # ------------------------------------------------------------------ the API

    async def _unknown_path(self, request: Request) -> Response:
        record = await self._receive(request, kind="invalid")
        return self._answer(record, 404, {"error": DEFAULT_ERRORS[404]})

    def _stale(self, record: RecordedRequest) -> Response:
        return self._answer(record, 503, {"error": "the stand-in was reset meanwhile"})

    def _fault_answer(self, record: RecordedRequest, fault: ChatwootFault) -> Response | None:
        if fault.raw_body is not None:
            return self._raw_answer(record, fault)
        if fault.status is None:
            return None
        error = fault.message or DEFAULT_ERRORS.get(fault.status, "Error")
        headers = None if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
        return self._answer(record, fault.status, {"error": error}, headers=headers)

    async def _read_call(self, request: Request, kind: str) -> tuple[Any, Response | None]:
        """Record a GET, check its token and faults: (the record, an answer or None)."""
        headers = pick_headers(request.headers)
        token = request.headers.get("api_access_token")
        if token is not None:
            headers["api_access_token"] = token
        record = await self._receive(request, kind=kind, headers=headers)
        record.extra["query"] = dict(request.query_params)
        if not await self._delay(record, self.latency):
            return record, self._stale(record)
        if not accepts(self.access_tokens, token):
            return record, self._answer(record, 401, {"error": DEFAULT_ERRORS[401]})
        try:
            account = int(request.path_params["account"])
            conversation = int(request.path_params.get("conversation", 0))
        except ValueError:
            return record, self._answer(record, 404, {"error": DEFAULT_ERRORS[404]})
        record.extra.update(account=account, conversation=conversation)
        return record, await self._injected(record, self._admits(kind, conversation))

    async def _conversation_list(self, request: Request) -> Response:
        record, answered = await self._read_call(request, "list")
        if answered is not None:
            return answered
        params = dict(request.query_params)
        if not (params.get("page") or "1").isdigit():
            return self._answer(record, 422, {"error": "page must be a number"})
        with self._lock:
            listed = self.history.conversation_list(
                record.extra["account"], params, self._state_unlocked
            )
        return self._answer(record, 200, listed)

    async def _message_list(self, request: Request) -> Response:
        record, answered = await self._read_call(request, "history")
        if answered is not None:
            return answered
        params = dict(request.query_params)
        if any(not (params.get(k) or "0").isdigit() for k in ("before", "after")):
            return self._answer(record, 422, {"error": "before and after must be ids"})
        with self._lock:
            listed = self.history.message_list(
                record.extra["account"], record.extra["conversation"], params
            )
        if listed is None:
            return self._answer(record, 404, {"error": DEFAULT_ERRORS[404]})
        return self._answer(record, 200, listed)

    def _state_unlocked(self, account: int, conversation: int) -> dict[str, Any]:
        return {
            "status": self._statuses.get((account, conversation), "pending"),
            "assignee": self._assignees.get((account, conversation)),
        }

    async def _conversation_call(self, request: Request) -> Response:
        params = request.path_params
        headers = pick_headers(request.headers)
        token = request.headers.get("api_access_token")
        if token is not None:
            headers["api_access_token"] = token
        record = await self._receive(request, headers=headers)
        if not await self._delay(record, self.latency):
            return self._stale(record)
        if not accepts(self.access_tokens, token):
            return self._answer(record, 401, {"error": DEFAULT_ERRORS[401]}, "unauthorized")
        try:
            account, conversation = int(params["account"]), int(params["conversation"])
        except ValueError:
            return self._answer(record, 404, {"error": DEFAULT_ERRORS[404]}, "invalid")
        record.extra.update(account=account, conversation=conversation)
        kind, problem = _classify(params["action"], record.body)
        if kind == "unknown":
            return self._answer(record, 404, {"error": DEFAULT_ERRORS[404]}, "invalid")
        record.kind = kind
        if problem is not None:
            return self._answer(record, 422, {"error": problem})
        injected = await self._injected(record, self._admits(kind, conversation))
        if injected is not None:
            return injected

        body: dict[str, Any] = record.body
        if kind == "typing":
            self._finish(record, 200, None)
            return Response(b"", status_code=200)
        if kind == "status":
            result = self._toggle_status(record, account, conversation, body)
            return self._answer(record, 200, result)
        message = self._create_message(record, account, conversation, body)
        response = self._answer(record, 200, self._message_json(message))
        self._schedule_webhook(message)
        return response

    def _toggle_status(
        self, record: RecordedRequest, account: int, conversation: int, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Set the conversation's status; Chatwoot's answer to `toggle_status`."""
        status = str(body["status"])
        record.extra["status_change"] = StatusChange(account, conversation, status, time.time())
        self._change_status(account, conversation, status)
        return {
            "meta": {},
            "payload": {
                "success": True,
                "conversation_id": conversation,
                "current_status": status,
                "snoozed_until": None,
            },
        }

    def _create_message(
        self, record: RecordedRequest, account: int, conversation: int, body: dict[str, Any]
    ) -> CreatedMessage:
        message = CreatedMessage(
            id=next(self._ids),
            account=account,
            conversation=conversation,
            content=str(body["content"]),
            private=bool(body.get("private", False)),
            time=time.time(),
        )
        record.extra["created"] = message
        with self._lock:
            self.history.add(
                account,
                conversation,
                self.inbox_id,
                message_id=message.id,
                content=message.content,
                message_type=OUTGOING,
                sender=dict(self.bot_sender),
                private=message.private,
                created_at=message.time,
            )
        return message

    def _message_json(self, message: CreatedMessage) -> dict[str, Any]:
        """The created message as Chatwoot's `messages` call answers it."""
        return {
            "id": message.id,
            "content": message.content,
            "inbox_id": self.inbox_id,
            "conversation_id": message.conversation,
            "message_type": 1,  # outgoing
            "content_type": "text",
            "status": "sent",
            "content_attributes": {},
            "created_at": int(message.time),
            "private": message.private,
            "source_id": None,
            "sender": {"id": 1, "name": "Bot", "type": "agent_bot"},
        }

    # ------------------------------------------------------------------ webhooks back

    def _schedule_webhook(self, message: CreatedMessage) -> None:
        with self._lock:
            url = self.webhook_url
            if not url:
                return
            if self.webhook_token:
                url += ("&" if "?" in url else "?") + "token=" + quote(self.webhook_token)
            secret, inbox, generation = self.webhook_secret, self.inbox_id, self._generation
            sender = dict(self.bot_sender)
        body = orjson.dumps(
            message_created(
                message_id=message.id,
                content=message.content,
                conversation=message.conversation,
                account=message.account,
                inbox=inbox,
                message_type="outgoing",
                private=message.private,
                created_at=message.time,
                sender=sender,
                **self.conversation_state(message.account, message.conversation),
            )
        )
        self._spawn(
            self._post_webhook(url, secret, body, message.id, generation), f"message {message.id}"
        )

    # ------------------------------------------------------------------ what agents do

    def agent_writes(
        self,
        conversation: int,
        content: str,
        *,
        agent_id: int = 12,
        name: str = "Laura Gómez",
        account: int = 1,
        private: bool = False,
    ) -> CreatedMessage:
        """An agent writes in the conversation (in Chatwoot's dashboard): the message is
        posted back as an outgoing `message_created` from a `user`; kept in `agent_messages`."""
        message = CreatedMessage(
            next(self._ids), account, conversation, content, private, time.time()
        )
        with self._lock:
            self.agent_messages.append(message)
            self.history.add(
                account,
                conversation,
                self.inbox_id,
                message_id=message.id,
                content=content,
                message_type=OUTGOING,
                sender=agent_user(agent_id, name),
                private=private,
                created_at=message.time,
            )
        state = self.conversation_state(account, conversation)
        self._post_event(
            message_created(
                message_id=message.id,
                content=content,
                conversation=conversation,
                account=account,
                inbox=self.inbox_id,
                message_type="outgoing",
                private=private,
                created_at=message.time,
                sender=agent_user(agent_id, name),
                **state,
            ),
            message.id,
        )
        return message

    def customer_writes(
        self,
        conversation: int,
        content: str | None,
        *,
        account: int = 1,
        name: str = "Ana Pérez",
        attachments: list[dict[str, Any]] | None = None,
        created_at: float | None = None,
        webhook: bool = True,
    ) -> int:
        """The customer writes (an incoming message from the contact): kept in the
        conversation and, with `webhook` (and a `webhook_url`), posted as Chatwoot's
        `message_created`, once and never again whatever the answer, as an account webhook
        is. Returns the message's id."""
        when = time.time() if created_at is None else created_at
        sender = contact(name)
        with self._lock:
            message_id = next(self._ids)
            self.history.add(
                account,
                conversation,
                self.inbox_id,
                message_id=message_id,
                content=content,
                message_type=INCOMING,
                sender=sender,
                created_at=when,
                attachments=attachments,
            )
            inbox = self.inbox_id
        if webhook:
            self._post_event(
                message_created(
                    message_id=message_id,
                    content=content,
                    conversation=conversation,
                    account=account,
                    inbox=inbox,
                    created_at=when,
                    sender_name=name,
                    sender=sender,
                    attachments=attachments,
                    **self.conversation_state(account, conversation),
                ),
                message_id,
            )
        return message_id

    def add_message(
        self,
        conversation: int,
        content: str | None,
        message_type: int,
        *,
        account: int = 1,
        private: bool = False,
        sender: dict[str, Any] | None = None,
        created_at: float | None = None,
    ) -> int:
        """Keep any other message in the conversation, with no webhook: an activity message
        (2, no sender), a template (3), a private note. Returns its id."""
        with self._lock:
            message_id = next(self._ids)
            self.history.add(
                account,
                conversation,
                self.inbox_id,
                message_id=message_id,
                content=content,
                message_type=message_type,
                sender=sender,
                private=private,
                created_at=created_at,
            )
        return message_id

    def messages(self, conversation: int, account: int = 1) -> list[dict[str, Any]]:
        """The conversation's messages as `GET messages` shows them, oldest first, all."""
        with self._lock:
            return self.history.messages_of(account, conversation)

    def assign(
        self,
        conversation: int,
        agent_id: int | None = 12,
        name: str = "Laura Gómez",
        account: int = 1,
    ) -> None:
        """Assign the conversation to an agent (None: unassign). An account webhook gets
        `conversation_updated` with `assignee_id` in `changed_attributes`; an agent bot gets
        nothing."""
        key = (account, conversation)
        assignee = agent_user(agent_id, name) if agent_id is not None else None
        with self._lock:
            before = self._assignees.get(key)
            self._assignees[key] = assignee
        if self.conversation_events == "account":
            self._post_event(
                conversation_webhook(
                    "conversation_updated",
                    conversation=conversation,
                    account=account,
                    inbox=self.inbox_id,
                    changed_attributes={
                        "assignee_id": (before["id"] if before else None, agent_id)
                    },
                    **self.conversation_state(account, conversation),
                )
            )

    def set_status(self, conversation: int, status: str, account: int = 1) -> None:
        """Change the conversation's status as an agent (or Chatwoot) does."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {sorted(STATUSES)}")
        self._change_status(account, conversation, status)

    def conversation_state(self, account: int, conversation: int) -> dict[str, Any]:
        """The conversation's `status` and `assignee` as Chatwoot has them now."""
        with self._lock:
            return {
                "status": self._statuses.get((account, conversation), "pending"),
                "assignee": self._assignees.get((account, conversation)),
            }

    def _change_status(self, account: int, conversation: int, status: str) -> None:
        with self._lock:
            before = self._statuses.get((account, conversation), "pending")
            self._statuses[(account, conversation)] = status
        mode = self.conversation_events
        state = self.conversation_state(account, conversation)
        if mode == "account" and before != status:
            self._post_event(
                conversation_webhook(
                    "conversation_status_changed",
                    conversation=conversation,
                    account=account,
                    inbox=self.inbox_id,
                    changed_attributes={"status": (before, status)},
                    **state,
                )
            )
        elif mode == "agent_bot" and before != status and status in ("open", "resolved"):
            event = "conversation_opened" if status == "open" else "conversation_resolved"
            self._post_event(
                conversation_webhook(
                    event, conversation=conversation, account=account, inbox=self.inbox_id, **state
                )
            )

    def _post_event(self, payload: dict[str, Any], message_id: int = 0) -> None:
        """Post a webhook body to `webhook_url` as Chatwoot does (nothing when there is none)."""
        with self._lock:
            url = self.webhook_url
            if not url:
                return
            if self.webhook_token:
                url += ("&" if "?" in url else "?") + "token=" + quote(self.webhook_token)
            secret, generation = self.webhook_secret, self._generation
        body = orjson.dumps(payload)
        self._spawn(
            self._post_webhook(url, secret, body, message_id, generation),
            f"{payload.get('event')} {message_id}",
        )

    async def _post_webhook(
        self, url: str, secret: str | None, body: bytes, message_id: int, generation: int
    ) -> None:
        status: int | None = None
        error: str | None = None
        try:
            response = await self._client().post(
                url, content=body, headers=chatwoot_headers(body, secret)
            )
            status = response.status_code
        except httpx.HTTPError as exc:
            error = repr(exc)
        finally:
            self._deliver(WebhookDelivery(time.time(), message_id, status, error, body), generation)


def _classify(action: str, body: Any) -> tuple[str, str | None]:
    """(kind, problem) of a conversation call; kind "unknown" is an unknown action (404)."""
    if action == "toggle_typing_status":
        if not isinstance(body, dict) or body.get("typing_status") not in ("on", "off"):
            return "typing", "typing_status must be on or off"
        return "typing", None
    if action == "toggle_status":
        if not isinstance(body, dict) or body.get("status") not in STATUSES:
            return "status", f"status must be one of {sorted(STATUSES)}"
        return "status", None
    if action != "messages":
        return "unknown", None
    if not isinstance(body, dict):
        return "reply", "the body must be a JSON object"
    kind = "note" if body.get("private") is True else "reply"
    content = body.get("content")
    if not isinstance(content, str) or not content.strip():
        return kind, "Content can't be blank"
    if body.get("message_type", "outgoing") not in ("outgoing", "incoming"):
        return kind, "message_type must be outgoing or incoming"
    if not isinstance(body.get("private", False), bool):
        return kind, "private must be true or false"
    return kind, None


# ---------------------------------------------------------------------- script


TOKENS = Credentials(
    "--token", "--any-token", "api_access_token", "CHATWOOT_API_ACCESS_TOKEN", "cw-token"
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = script_parser(
        "chatwoot_standin",
        "Local stand-in for Chatwoot's API.",
        "CHATWOOT_STANDIN_PORT",
        8082,
        TOKENS,
    )
    parser.add_argument("--webhook-url", help="post message_created webhooks here (receiver)")
    parser.add_argument("--secret", default=os.environ.get("CHATWOOT_WEBHOOK_SECRET"))
    parser.add_argument("--webhook-token", default=os.environ.get("CHATWOOT_WEBHOOK_TOKEN"))
    parser.add_argument("--inbox-id", type=int, default=3)
    parser.add_argument(
        "--conversation-events",
        choices=["", "account", "agent_bot"],
        default="",
        help="post the conversation events an account webhook or an agent bot gets",
    )
    args = parser.parse_args(argv)
    standin = ChatwootApiStandIn(
        access_tokens=TOKENS.accepted(args),
        webhook_url=args.webhook_url,
        webhook_secret=(args.secret or "").split(",")[0] or None,
        webhook_token=(args.webhook_token or "").split(",")[0] or None,
        inbox_id=args.inbox_id,
        conversation_events=args.conversation_events,
    )
    serve_forever(standin, args, "chatwoot stand-in", "POST /_control for faults")


if __name__ == "__main__":
    main()
