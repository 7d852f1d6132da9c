"""A local stand-in for Chatwoot's application API, for tests and local runs.

    chatwoot = ChatwootApiStandIn(access_tokens="cw-token").start()  # or `with` / `async with`
    # point the product at it: CHATWOOT_BASE_URL=chatwoot.url
    chatwoot.fail_next(2, status=429)                                # the next two calls get 429
    ...
    [m.content for m in chatwoot.replies(conversation=42)]

It serves, under `/api/v1/accounts/{account}/conversations/{conversation}/`, what the product
calls: `messages` (outgoing messages and private notes: 200 with the created message and a
fresh `id`), `toggle_status` (`{"status": "open"}`: 200 with Chatwoot's `payload`) and
`toggle_typing_status` (200, empty). The `api_access_token` header is checked (401
`{"error": "Invalid Access Token"}`), malformed bodies get 422, unknown paths 404, and every
request is recorded. Faults (HTTP status with Chatwoot's error body, raw bodies, latency,
hangs, per conversation and per kind of call) are set from Python or over HTTP
(`POST /_control`). With `webhook_url` it posts each created message back as a
`message_created` webhook, as Chatwoot does (signed with `webhook_secret`, or carrying
`?token=` when `webhook_token` is set): the bot's own replies come back that way.
`GET /_requests` lists the calls (`requests`) and those webhook deliveries with the
receiver's answer (`webhooks`).

Run alone: `scripts/chatwoot_standin --port 8082 [--token T] [--webhook-url URL --secret S]`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from scripts.standins._common import (
    CutResponse,
    RecordedRequest,
    StandInBase,
    as_tuple,
    json_response,
    pick_headers,
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

log = logging.getLogger(__name__)

CALL_KINDS = frozenset({"reply", "note", "status", "typing"})
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


def sign_chatwoot(secret: str, body: bytes, timestamp: int | str) -> str:
    """The `X-Chatwoot-Signature` value: `sha256=<hex HMAC-SHA256(secret, "{ts}.{body}")>`."""
    signed = f"{timestamp}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def chatwoot_headers(
    body: bytes,
    secret: str | None = None,
    *,
    timestamp: int | None = None,
    delivery: str | None = None,
) -> dict[str, str]:
    """The headers Chatwoot sends with a webhook: signed when `secret` is given."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "rest-client/2.1.0 (linux x86_64) ruby/3.3.3p89",
        "X-Chatwoot-Delivery": delivery or str(uuid.uuid4()),
    }
    if secret is not None:
        stamp = int(time.time()) if timestamp is None else timestamp
        headers["X-Chatwoot-Timestamp"] = str(stamp)
        headers["X-Chatwoot-Signature"] = sign_chatwoot(secret, body, stamp)
    return headers


def message_created(
    *,
    message_id: int,
    content: str | None,
    conversation: int,
    account: int = 1,
    inbox: int = 3,
    message_type: str = "incoming",
    private: bool = False,
    created_at: float | None = None,
    sender_name: str = "Ana Pérez",
    attachments: list[dict[str, Any]] | None = None,
    status: str = "pending",
) -> dict[str, Any]:
    """A `message_created` webhook body as Chatwoot shapes it (see the fixtures)."""
    when = time.time() if created_at is None else created_at
    incoming = message_type == "incoming"
    body: dict[str, Any] = {
        "event": "message_created",
        "id": message_id,
        "content": content,
        "created_at": datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds"),
        "message_type": message_type,
        "content_type": "text",
        "content_attributes": {},
        "private": private,
        "source_id": f"wamid.CW{message_id}" if incoming else None,
        "sender": {
            "id": 7 if incoming else 1,
            "name": sender_name if incoming else "Bot",
            "type": "contact" if incoming else "agent_bot",
        },
        "inbox": {"id": inbox, "name": "WhatsApp ventas"},
        "account": {"id": account, "name": "Turnos SRL"},
        "conversation": {
            "id": conversation,
            "inbox_id": inbox,
            "channel": "Channel::Whatsapp",
            "status": status,
            "can_reply": True,
        },
    }
    if attachments:
        body["attachments"] = attachments
    return body


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


class ChatwootApiStandIn(StandInBase):
    """Chatwoot's conversation API, in-process or as a script.

    Constructor (keyword-only; `configure` changes them later):
    - `access_tokens`: accepted `api_access_token` values (str, comma-separated, iterable);
      None accepts any non-empty one. Default "cw-token".
    - `webhook_url`: where to post `message_created` for each created message (None: nowhere);
      `webhook_secret` signs them, `webhook_token` goes in the URL's `?token=`.
    - `inbox_id`: the inbox named in those webhooks (the API paths do not carry it).
    """

    name = "chatwoot-standin"
    _UNSET: Any = object()

    def __init__(
        self,
        *,
        access_tokens: str | Iterable[str] | None = ("cw-token",),
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        webhook_token: str | None = None,
        inbox_id: int = 3,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.access_tokens: tuple[str, ...] | None = ()
        self.webhook_url: str | None = None
        self.webhook_secret: str | None = None
        self.webhook_token: str | None = None
        self.inbox_id = inbox_id
        self.latency = 0.0
        self._faults: list[ChatwootFault] = []
        self._ids = itertools.count(50_001)
        self._statuses: dict[tuple[int, int], str] = {}
        self._deliveries: list[WebhookDelivery] = []
        self._pending_webhooks = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None
        self._initial_config: dict[str, Any] = {
            "access_tokens": access_tokens,
            "webhook_url": webhook_url,
            "webhook_secret": webhook_secret,
            "webhook_token": webhook_token,
            "inbox_id": inbox_id,
        }
        self.configure(**self._initial_config)
        self._app = Starlette(
            routes=[
                Route("/_control", self._control_endpoint, methods=["GET", "POST"]),
                Route("/_requests", self._requests_endpoint, methods=["GET"]),
                Route("/_health", self._health, methods=["GET"]),
                Route(f"{_PREFIX}/{{action}}", self._conversation_call, methods=["POST"]),
                Route("/{path:path}", self._unknown, methods=["GET", "POST", "PUT", "DELETE"]),
            ],
            lifespan=self._lifespan,
        )

    @property
    def app(self) -> Starlette:
        return self._app

    # ------------------------------------------------------------------ configuration

    def configure(
        self,
        *,
        access_tokens: str | Iterable[str] | None = _UNSET,
        webhook_url: str | None = _UNSET,
        webhook_secret: str | None = _UNSET,
        webhook_token: str | None = _UNSET,
        inbox_id: int = _UNSET,
    ) -> None:
        """Change any constructor setting at runtime (only the ones given)."""
        unset = self._UNSET
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

    # ------------------------------------------------------------------ faults

    def add_fault(self, fault: ChatwootFault) -> ChatwootFault:
        with self._lock:
            self._faults.append(fault)
        return fault

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
    ) -> ChatwootFault:
        """The next `n` matching calls (after `after` that succeed) get HTTP `status` with
        `{"error": message}`."""
        return self.add_fault(
            ChatwootFault(
                status=status,
                message=message,
                conversation=conversation,
                kinds=frozenset(kinds),
                delay=delay,
                count=n,
                after=after,
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

    def set_latency(self, seconds: float) -> None:
        with self._lock:
            self.latency = float(seconds)

    @property
    def faults(self) -> list[ChatwootFault]:
        with self._lock:
            return list(self._faults)

    def reset_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self.latency = 0.0

    def clear(self) -> None:
        """Forget records, conversation statuses and webhook deliveries."""
        with self._lock:
            super().clear()
            self._statuses.clear()
            self._deliveries.clear()

    def reset(self) -> None:
        """Back to the state right after the constructor."""
        self.reset_faults()
        self.clear()
        self.configure(**self._initial_config)

    def _take_fault(self, kind: str, conversation: int) -> ChatwootFault | None:
        with self._lock:
            for fault in self._faults:
                if not fault.matches(kind, conversation):
                    continue
                if fault.after > 0:
                    fault.after -= 1
                    continue
                fault.hits += 1
                if fault.count is not None:
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                return fault
        return None

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

    @property
    def webhook_deliveries(self) -> list[WebhookDelivery]:
        with self._lock:
            return list(self._deliveries)

    @property
    def pending_webhooks(self) -> int:
        with self._lock:
            return self._pending_webhooks

    # ------------------------------------------------------------------ HTTP control

    def control(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """What `POST /_control` does; returns the new state. `op` is one of:

        - `{"op": "fail", "status": 429, "count": 2}`: add a fault; fields of
          `ChatwootFault`: status, message, raw_body, content_type, delay, count (null =
          forever), conversation, kinds, after, drop.
        - `{"op": "hang", "seconds": 30, "count": 1}`, `{"op": "latency", "seconds": 0.5}`
        - `{"op": "config", ...}`: any `configure` keyword.
        - `{"op": "reset"}` (faults, latency), `{"op": "clear"}` (records), `{"op": "reset_all"}`.
        """
        op = payload.get("op")
        if op == "fail":
            names = ("status", "message", "raw_body", "content_type", "delay", "count", "after")
            fields = {k: payload[k] for k in (*names, "conversation", "drop") if k in payload}
            if "kinds" in payload:
                fields["kinds"] = frozenset(payload["kinds"])
            fault = ChatwootFault(**fields)
            if fault.status is None and fault.raw_body is None and not fault.delay:
                if not fault.drop:
                    raise ValueError("a fault needs status, raw_body, delay or drop")
            self.add_fault(fault)
        elif op == "hang":
            self.hang_next(int(payload.get("count", 1)), float(payload.get("seconds", 30.0)))
        elif op == "latency":
            self.set_latency(float(payload.get("seconds", 0.0)))
        elif op == "config":
            self.configure(**{k: v for k, v in payload.items() if k != "op"})
        elif op == "reset":
            self.reset_faults()
        elif op == "clear":
            self.clear()
        elif op == "reset_all":
            self.reset()
        else:
            raise ValueError(f"unknown op {op!r}")
        return self.state()

    def state(self) -> dict[str, Any]:
        with self._lock:
            tokens = self.access_tokens
            return {
                "access_tokens": list(tokens) if tokens is not None else None,
                "webhook_url": self.webhook_url,
                "inbox_id": self.inbox_id,
                "latency": self.latency,
                "faults": [f.to_json() for f in self._faults],
                "requests": len(self._records),
                "statuses": {f"{a}/{c}": s for (a, c), s in self._statuses.items()},
                "pending_webhooks": self._pending_webhooks,
            }

    async def _control_endpoint(self, request: Request) -> Response:
        if request.method == "GET":
            return json_response(self.state())
        try:
            payload = orjson.loads(await request.body())
            if not isinstance(payload, dict):
                raise ValueError("expected a JSON object")
            return json_response({"ok": True, "state": self.control(payload)})
        except (ValueError, TypeError, KeyError) as exc:
            return json_response({"ok": False, "error": str(exc)}, 400)

    async def _requests_endpoint(self, request: Request) -> Response:
        with self._lock:
            records = [r.to_json() for r in self._records]
            deliveries = [{**asdict(d), "body": orjson.loads(d.body)} for d in self._deliveries]
        for record in records:
            for key in ("created", "status_change"):
                if key in record:
                    record[key] = asdict(record[key])
        return json_response({"requests": records, "webhooks": deliveries})

    async def _health(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    # ------------------------------------------------------------------ the API

    def _authorized(self, token: str | None) -> bool:
        if not token:
            return False
        tokens = self.access_tokens
        if tokens is None:
            return True
        return any(hmac.compare_digest(token.encode(), t.encode()) for t in tokens)

    async def _unknown(self, request: Request) -> Response:
        record = self._record(
            RecordedRequest(
                time=time.time(),
                method=request.method,
                path=request.url.path,
                headers=pick_headers(request.headers),
                raw=await request.body(),
                kind="invalid",
            )
        )
        body = {"error": DEFAULT_ERRORS[404]}
        self._finish(record, 404, body)
        return json_response(body, 404)

    async def _conversation_call(self, request: Request) -> Response:
        raw = await request.body()
        params = request.path_params
        headers = pick_headers(request.headers)
        token = request.headers.get("api_access_token")
        if token is not None:
            headers["api_access_token"] = token
        record = self._record(
            RecordedRequest(
                time=time.time(), method="POST", path=request.url.path, headers=headers, raw=raw
            )
        )
        generation = record.generation
        fault: ChatwootFault | None = None

        def answer(status: int, body: Any, kind: str | None = None) -> Response:
            self._finish(record, status, body, kind)
            if status == 200 and fault is not None and fault.drop:
                return CutResponse(orjson.dumps(body), media_type="application/json")
            return json_response(body, status)

        try:
            record.body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            record.body = None
        if self.latency > 0 and not await self._sleep(self.latency, generation):
            return answer(503, {"error": "the stand-in was reset meanwhile"})
        if not self._authorized(token):
            return answer(401, {"error": DEFAULT_ERRORS[401]}, "unauthorized")
        try:
            account, conversation = int(params["account"]), int(params["conversation"])
        except ValueError:
            return answer(404, {"error": DEFAULT_ERRORS[404]}, "invalid")
        record.extra.update(account=account, conversation=conversation)
        kind, problem = _classify(params["action"], record.body)
        if kind == "unknown":
            return answer(404, {"error": DEFAULT_ERRORS[404]}, "invalid")
        record.kind = kind
        if problem is not None:
            return answer(422, {"error": problem})

        fault = self._take_fault(kind, conversation)
        if fault is not None:
            record.fault = fault
            if fault.delay > 0 and not await self._sleep(fault.delay, generation):
                return answer(503, {"error": "the stand-in was reset meanwhile"})
            if fault.raw_body is not None:
                status = fault.status or 502
                self._finish(record, status, fault.raw_body)
                return Response(fault.raw_body, status_code=status, media_type=fault.content_type)
            if fault.status is not None:
                message = fault.message or DEFAULT_ERRORS.get(fault.status, "Error")
                return answer(fault.status, {"error": message})

        now = time.time()
        body: dict[str, Any] = record.body
        if kind == "typing":
            self._finish(record, 200, None)
            return Response(b"", status_code=200)
        if kind == "status":
            status = str(body["status"])
            record.extra["status_change"] = StatusChange(account, conversation, status, now)
            with self._lock:
                self._statuses[(account, conversation)] = status
            result = {
                "meta": {},
                "payload": {
                    "success": True,
                    "conversation_id": conversation,
                    "current_status": status,
                    "snoozed_until": None,
                },
            }
            return answer(200, result)
        message = CreatedMessage(
            id=next(self._ids),
            account=account,
            conversation=conversation,
            content=str(body["content"]),
            private=bool(body.get("private", False)),
            time=now,
        )
        record.extra["created"] = message
        result = {
            "id": message.id,
            "content": message.content,
            "inbox_id": self.inbox_id,
            "conversation_id": conversation,
            "message_type": 1,  # outgoing
            "content_type": "text",
            "status": "sent",
            "content_attributes": {},
            "created_at": int(now),
            "private": message.private,
            "source_id": None,
            "sender": {"id": 1, "name": "Bot", "type": "agent_bot"},
        }
        response = answer(200, result)
        self._schedule_webhook(message)
        return response

    # ------------------------------------------------------------------ webhooks back

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._http = httpx.AsyncClient(timeout=5.0)
        try:
            yield
        finally:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._http.aclose()
            self._http = None

    def _schedule_webhook(self, message: CreatedMessage) -> None:
        with self._lock:
            url = self.webhook_url
            if not url:
                return
            if self.webhook_token:
                url += ("&" if "?" in url else "?") + "token=" + quote(self.webhook_token)
            secret, inbox, generation = self.webhook_secret, self.inbox_id, self._generation
            self._pending_webhooks += 1
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
            )
        )
        task = asyncio.get_running_loop().create_task(
            self._post_webhook(url, secret, body, message.id, generation)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post_webhook(
        self, url: str, secret: str | None, body: bytes, message_id: int, generation: int
    ) -> None:
        client = self._http
        if client is None:  # app served without lifespan
            client = self._http = httpx.AsyncClient(timeout=5.0)
        status: int | None = None
        error: str | None = None
        try:
            response = await client.post(url, content=body, headers=chatwoot_headers(body, secret))
            status = response.status_code
        except httpx.HTTPError as exc:
            error = repr(exc)
        finally:
            with self._lock:
                self._pending_webhooks -= 1
                if generation == self._generation:
                    self._deliveries.append(
                        WebhookDelivery(time.time(), message_id, status, error, body)
                    )


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


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="chatwoot_standin", description="Local stand-in for Chatwoot's API."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("CHATWOOT_STANDIN_PORT", 8082))
    )
    parser.add_argument(
        "--token",
        action="append",
        help="accepted api_access_token (repeatable; default $CHATWOOT_API_ACCESS_TOKEN or "
        "cw-token)",
    )
    parser.add_argument("--any-token", action="store_true", help="accept any non-empty token")
    parser.add_argument("--webhook-url", help="post message_created webhooks here (receiver)")
    parser.add_argument("--secret", default=os.environ.get("CHATWOOT_WEBHOOK_SECRET"))
    parser.add_argument("--webhook-token", default=os.environ.get("CHATWOOT_WEBHOOK_TOKEN"))
    parser.add_argument("--inbox-id", type=int, default=3)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)

    tokens: str | list[str] | None
    if args.any_token:
        tokens = None
    else:
        tokens = args.token or os.environ.get("CHATWOOT_API_ACCESS_TOKEN") or "cw-token"
    standin = ChatwootApiStandIn(
        access_tokens=tokens,
        webhook_url=args.webhook_url,
        webhook_secret=(args.secret or "").split(",")[0] or None,
        webhook_token=(args.webhook_token or "").split(",")[0] or None,
        inbox_id=args.inbox_id,
    )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(message)s")
    print(f"chatwoot stand-in on http://{args.host}:{args.port}  (POST /_control for faults)")
    uvicorn.run(standin.app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
