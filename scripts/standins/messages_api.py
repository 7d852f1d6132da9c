"""A local stand-in for Anthropic's Messages API, for tests and the dev stack.

    ai = MessagesApiStandIn(api_keys="test").start()              # or `with` / `async with`
    client = anthropic.AsyncAnthropic(base_url=ai.url, api_key="test", max_retries=0)
    ai.queue_reply("¡Hola! Sí, tenemos turno el sábado.")
    ai.fail_next(1, "overloaded")                                  # next call: 529
    ai.fail_for(5.0, "overloaded", retry_after=1)                  # an outage: 529 for 5 s

`POST /v1/messages` behaves like the real endpoint for non-streaming calls: `x-api-key` (or
`Authorization: Bearer`) and `anthropic-version` are checked, the body is validated (model,
max_tokens, messages, at most 4 cache marks), and the answer is a Message the SDK parses
(`content[0].text`, `usage`, `stop_reason`). Prompt caching follows the documented rules, with a
deterministic tokenizer of 4 characters a token (scripts/standins/_prompt_cache.py): `usage`
says what was read from the cache, what was written and what came after. Replies come from a
queue (strings, content-block lists, partial Message dicts, callables taking the request JSON,
or a `MessagesFault`), else from the default reply "stand-in reply to: <last user block>" (the
last text block of the last user message: a batch's messages, without the header).
`stop_reason` is `tool_use` when the content has a `tool_use` block, else `end_turn`, unless
the reply says otherwise (a partial Message dict: `{"content": [], "stop_reason": "refusal"}`,
`"pause_turn"`, `"max_tokens"`); with `cut_at_max_tokens` a text longer than the request's
`max_tokens` (four bytes a token) is cut there and answered as `max_tokens`, as the API does.
Tool use is checked as the API checks it: every `tool_use` of an assistant message needs its
`tool_result` in the next user message, every `tool_result` its `tool_use` in the previous one,
and a final assistant message may not end with whitespace. Errors use Anthropic's body
`{"type": "error", "error": {"type", "message"}, "request_id"}` and a `request-id` header.

NOTE: the SDK retries 408/409/429/5xx/529 and timeouts by itself (`max_retries`, default 2,
with backoff honouring `retry-after`). A test that asserts on ONE injected failure must build
its client with `max_retries=0`, or inject `max_retries + 1` failures.

Control endpoint (`POST /_control`, JSON; `GET /_control` shows the state, `GET /_requests`
lists the records): the ops every stand-in takes are in `StandInBase.control`, this one's own
in `MessagesApiStandIn._control_ops`.

Run alone: `scripts/anthropic_standin --port 8082 [--api-key K] [--reply TEXT ...]`.
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
import string
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins._common import (
    UNSET,
    ControlOp,
    RecordedRequest,
    StandInBase,
    accepts,
    as_tuple,
    fault_fields,
    json_response,
)
from scripts.standins._prompt_cache import (
    PromptCache,
    breakpoint_problem,
    content_tokens,
    count_tokens,
)
from scripts.standins._script import Credentials, script_parser, serve_forever

__all__ = [
    "ERROR_TYPES",
    "MessagesApiStandIn",
    "MessagesFault",
    "Reply",
    "anthropic_error_body",
    "last_user_block",
    "last_user_text",
    "system_text",
]

log = logging.getLogger(__name__)

# error.type -> (HTTP status, default message)
ERROR_TYPES: dict[str, tuple[int, str]] = {
    "invalid_request_error": (400, "Invalid request."),
    "authentication_error": (401, "invalid x-api-key"),
    "billing_error": (402, "Your credit balance is too low to access the Anthropic API."),
    "permission_error": (
        403,
        "Your API key does not have permission to use the specified resource.",
    ),
    "not_found_error": (404, "The requested resource could not be found."),
    "request_too_large": (413, "Request exceeds the maximum allowed number of bytes."),
    "rate_limit_error": (
        429,
        "This request would exceed the rate limit for your organization. Please try again later.",
    ),
    "api_error": (500, "Internal server error"),
    "timeout_error": (504, "Request timed out"),
    "overloaded_error": (529, "Overloaded"),
}
ALIASES = {
    "overloaded": "overloaded_error",
    "rate_limit": "rate_limit_error",
    "api": "api_error",
    "internal": "api_error",
    "server": "api_error",
    "invalid_request": "invalid_request_error",
    "bad_request": "invalid_request_error",
    "authentication": "authentication_error",
    "auth": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "timeout": "timeout_error",
    "billing": "billing_error",
}
STATUS_TO_TYPE = {status: name for name, (status, _) in ERROR_TYPES.items()}
BASE62 = string.digits + string.ascii_letters


def error_type_of(name: str | None, status: int | None = None) -> str:
    if name is None:
        if status is None:
            raise ValueError("give an error type or a status")
        return STATUS_TO_TYPE.get(status, "api_error" if status >= 500 else "invalid_request_error")
    name = ALIASES.get(name, name)
    if name not in ERROR_TYPES:
        raise ValueError(f"unknown error type {name!r}; one of {sorted(ERROR_TYPES)}")
    return name


def anthropic_error_body(
    error_type: str, message: str | None = None, request_id: str | None = None
) -> dict[str, Any]:
    """Anthropic's error body: `{"type":"error","error":{"type","message"},"request_id"}`."""
    error_type = error_type_of(error_type)
    return {
        "type": "error",
        "error": {
            "type": error_type,
            "message": message if message is not None else ERROR_TYPES[error_type][1],
        },
        "request_id": request_id or _new_id("req_"),
    }


def _new_id(prefix: str) -> str:
    return prefix + "01" + "".join(secrets.choice(BASE62) for _ in range(22))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def last_user_text(body: Mapping[str, Any]) -> str:
    """The text of the last `user` message of a Messages request ("" if none)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def last_user_block(body: Mapping[str, Any]) -> str:
    """The last text block of the last `user` message ("" if none): the messages of a batch,
    after the presentation's header block (shared/conversation/presentation.py)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            texts = [
                str(b.get("text", ""))
                for b in (content if isinstance(content, list) else [])
                if isinstance(b, dict) and b.get("type") == "text"
            ]
            return texts[-1] if texts else ""
    return ""


def system_text(body: Mapping[str, Any]) -> str:
    """The system prompt of a Messages request as one string (blocks joined)."""
    return _text_of(body.get("system"))


# ---------------------------------------------------------------------- public data types


@dataclass
class MessagesFault:
    """One fault. In the fault list (see `fail_next`) it applies to requests as they arrive,
    after the key check; queued as a reply (`queue_reply`) it is the answer to that turn.

    After `delay` seconds: `raw_body` set → HTTP `status` (default 502) with that non-JSON body;
    `error_type` or `status` set → Anthropic's error body (429 also gets `retry-after`);
    neither (a pure delay, `hang_next`) → the request is then answered normally; `drop`
    (`drop_next`) → answered normally too, but the connection is closed halfway through the
    answer (the reply was generated, the client never got it). `until` (a `time.time()`): the
    fault applies to requests arriving before then, and is gone after (`fail_for`).
    """

    error_type: str | None = None
    status: int | None = None
    message: str | None = None
    retry_after: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: str | None = None
    content_type: str = "text/html"
    delay: float = 0.0
    count: int | None = 1
    probability: float = 1.0
    drop: bool = False
    until: float | None = None
    hits: int = 0

    def __post_init__(self) -> None:
        if self.error_type is not None or (self.status is not None and self.raw_body is None):
            self.error_type = error_type_of(self.error_type, self.status)
            if self.status is None:
                self.status = ERROR_TYPES[self.error_type][0]
        if self.raw_body is not None and self.status is None:
            self.status = 502

    @property
    def is_error(self) -> bool:
        return self.error_type is not None or self.raw_body is not None

    def response(self) -> tuple[Response, Any]:
        assert self.status is not None
        request_id = _new_id("req_")
        headers = {"request-id": request_id, **self.headers}
        if self.raw_body is not None:
            return (
                Response(
                    self.raw_body,
                    status_code=self.status,
                    headers=headers,
                    media_type=self.content_type,
                ),
                self.raw_body,
            )
        assert self.error_type is not None
        if self.error_type == "rate_limit_error" or self.retry_after is not None:
            headers.setdefault("retry-after", _fmt_seconds(self.retry_after or 1))
        body = anthropic_error_body(self.error_type, self.message, request_id)
        return json_response(body, self.status, headers), body

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _fmt_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


ReplyValue = str | list[dict[str, Any]] | dict[str, Any] | MessagesFault
Reply = ReplyValue | Callable[[dict[str, Any]], ReplyValue]
"""A reply: a text; a list of content blocks; a partial Message dict merged over the default
(e.g. `{"content": [...], "stop_reason": "max_tokens"}`); a `MessagesFault` (this turn fails);
or a callable taking the request JSON and returning one of those."""


def default_reply(body: dict[str, Any]) -> str:
    return f"stand-in reply to: {last_user_block(body)}"


# ---------------------------------------------------------------------- the stand-in


class MessagesApiStandIn(StandInBase[MessagesFault]):
    """Anthropic's `POST /v1/messages` (and `/v1/messages/count_tokens`), non-streaming.

    Constructor (keyword-only):
    - `api_keys`: accepted keys (str, comma-separated str, or iterable), checked against
      `x-api-key` or `Authorization: Bearer`; None accepts any non-empty key. Default "test".
    - `replies`: initial reply queue (see `Reply`); `default_reply`: used when the queue is
      empty (a text, or a callable taking the request JSON).
    - `models`: if given, other model names get 404 not_found_error (as retired models do).
    - `require_version`: demand the `anthropic-version` header (the SDK always sends it).
    - `cut_at_max_tokens`: cut a reply's text at the request's `max_tokens` (four bytes a
      token) and answer `stop_reason: max_tokens`, as the API does (off: replies are whole).
    - `seed`: seeds the RNG used by `fail_fraction`.
    - `host`, `port`: where `start()` listens (port 0: a free one).
    """

    name = "messages-standin"

    def __init__(
        self,
        *,
        api_keys: str | Iterable[str] | None = ("test",),
        replies: Iterable[Reply] = (),
        default_reply: Reply = default_reply,
        models: Iterable[str] | None = None,
        require_version: bool = True,
        cut_at_max_tokens: bool = False,
        seed: int | None = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port, seed=seed)
        self.api_keys = as_tuple(api_keys)
        self.models = frozenset(models) if models is not None else None
        self.require_version = require_version
        self.cut_at_max_tokens = cut_at_max_tokens
        self._initial_config = {
            "api_keys": self.api_keys,
            "models": self.models,
            "require_version": require_version,
            "cut_at_max_tokens": cut_at_max_tokens,
        }
        self.default_reply: Reply = default_reply
        self._initial_default_reply: Reply = default_reply
        self._initial_replies: tuple[Reply, ...] = tuple(replies)
        self._replies: deque[Reply] = deque(self._initial_replies)
        self.prompt_cache = PromptCache()  # `advance(seconds)` ages its entries
        self._app = self._serve(
            [
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            ]
        )

    # ------------------------------------------------------------------ configuration

    def configure(
        self,
        *,
        api_keys: str | Iterable[str] | None = UNSET,
        models: Iterable[str] | None = UNSET,
        require_version: bool = UNSET,
        cut_at_max_tokens: bool = UNSET,
    ) -> None:
        """Change settings at runtime (only the ones given; None for keys/models = any)."""
        with self._lock:
            if cut_at_max_tokens is not UNSET:
                self.cut_at_max_tokens = bool(cut_at_max_tokens)
            if api_keys is not UNSET:
                self.api_keys = as_tuple(api_keys)
            if models is not UNSET:
                self.models = frozenset(models) if models is not None else None
            if require_version is not UNSET:
                self.require_version = bool(require_version)

    # ------------------------------------------------------------------ replies

    def queue_reply(self, *replies: Reply) -> None:
        """Answer the next calls with these, in order (then the default reply again)."""
        with self._lock:
            self._replies.extend(replies)

    def set_default_reply(self, reply: Reply) -> None:
        with self._lock:
            self.default_reply = reply

    def clear_replies(self) -> None:
        with self._lock:
            self._replies.clear()

    @property
    def pending_replies(self) -> int:
        with self._lock:
            return len(self._replies)

    # ------------------------------------------------------------------ faults

    def fail_next(
        self,
        n: int = 1,
        error: str = "overloaded_error",
        *,
        status: int | None = None,
        message: str | None = None,
        retry_after: float | None = None,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> MessagesFault:
        """The next `n` calls fail with `error` (an error type, or its short alias: overloaded
        529, rate_limit 429 + retry-after, api_error 500, invalid_request 400, authentication
        401, permission 403, not_found 404, timeout 504, billing 402)."""
        return self.add_fault(
            MessagesFault(
                error_type=error,
                status=status,
                message=message,
                retry_after=retry_after,
                headers=dict(headers or {}),
                delay=delay,
                count=n,
            )
        )

    def fail_fraction(
        self,
        p: float,
        error: str = "overloaded_error",
        *,
        seed: int | None = None,
        n: int | None = None,
        status: int | None = None,
        message: str | None = None,
    ) -> MessagesFault:
        """Each call fails with probability `p` (at most `n` times; None: no limit)."""
        if seed is not None:
            self._reseed(seed)
        return self.add_fault(
            MessagesFault(error_type=error, status=status, message=message, probability=p, count=n)
        )

    def fail_for(
        self,
        seconds: float,
        error: str = "overloaded_error",
        *,
        retry_after: float | None = None,
        status: int | None = None,
        message: str | None = None,
    ) -> MessagesFault:
        """An outage: every call arriving in the next `seconds` fails with `error` (with a
        `retry-after` header when given; 429 always has one), then the API answers again."""
        return self.add_fault(
            MessagesFault(
                error_type=error,
                status=status,
                message=message,
                retry_after=retry_after,
                count=None,
                until=time.time() + seconds,
            )
        )

    def fail_raw(
        self,
        n: int = 1,
        status: int = 502,
        body: str = "<html><body><h1>502 Bad Gateway</h1></body></html>",
        *,
        content_type: str = "text/html",
    ) -> MessagesFault:
        """The next `n` calls get HTTP `status` with a non-JSON body (a proxy's error page)."""
        return self.add_fault(
            MessagesFault(status=status, raw_body=body, content_type=content_type, count=n)
        )

    def hang_next(self, n: int = 1, seconds: float = 30.0) -> MessagesFault:
        """The next `n` calls wait `seconds` before answering normally (client timeouts)."""
        return self.add_fault(MessagesFault(delay=seconds, count=n))

    def drop_next(self, n: int = 1) -> MessagesFault:
        """The next `n` calls are answered, then the connection is closed before the answer is
        complete (the SDK retries that as a connection error, unless `max_retries=0`)."""
        return self.add_fault(MessagesFault(drop=True, count=n))

    def reset(self) -> None:
        """Back to the state right after the constructor: `reset_faults()`, `clear()`, the
        constructor's replies / default reply / keys / models / RNG seed, an empty prompt cache."""
        super().reset()
        with self._lock:
            self._replies = deque(self._initial_replies)
            self.default_reply = self._initial_default_reply
            self.prompt_cache.clear()

    # ------------------------------------------------------------------ what was asked

    def bodies(self, ok_only: bool = False) -> list[dict[str, Any]]:
        """The JSON bodies of `/v1/messages` calls, oldest first (`ok_only`: answered 200)."""
        with self._lock:
            return [
                r.body
                for r in self._records
                if r.kind == "messages" and isinstance(r.body, dict) and (r.ok or not ok_only)
            ]

    @property
    def last_body(self) -> dict[str, Any] | None:
        bodies = self.bodies()
        return bodies[-1] if bodies else None

    def replies_sent(self) -> list[str]:
        """The text of every Message answered (200), oldest first."""
        with self._lock:
            return [
                _text_of(r.response.get("content"))
                for r in self._records
                if r.kind == "messages" and r.ok and isinstance(r.response, dict)
            ]

    # ------------------------------------------------------------------ HTTP control

    def _control_ops(self) -> dict[str, ControlOp]:
        """Besides every stand-in's ops (`StandInBase.control`):

        - `{"op": "reply", "text": "..."}` / `{"texts": [...]}` / `{"content": [blocks]}` /
          `{"message": {partial Message}}`: queue replies.
        - `{"op": "default_reply", "text": "..."}`: a fixed default reply (null: the echo).
        - `{"op": "fail", "error": "overloaded", "count": 1}`: add a fault; fields of
          `MessagesFault` (error/error_type, status, message, retry_after, headers, raw_body,
          content_type, delay, count (null = forever), probability, drop), plus `seed`.
        - `{"op": "hang", "seconds": 30, "count": 1}`
        - `{"op": "outage", "seconds": 60, "error": "overloaded", "retry_after": 1}`: every
          call for that long fails (`fail_for`), then the API answers again.
        - `config` takes `api_keys` ([...] or null), `models` ([...] or null),
          `require_version`, `cut_at_max_tokens`; `reset_all` also restores the replies and
          empties the prompt cache.
        """
        return {
            **super()._control_ops(),
            "reply": self._control_reply,
            "default_reply": lambda p: self.set_default_reply(
                default_reply if p.get("text") is None else str(p["text"])
            ),
            "fail": self._control_fail,
            "hang": lambda p: self.hang_next(int(p.get("count", 1)), float(p.get("seconds", 30.0))),
            "outage": lambda p: self.fail_for(
                float(p["seconds"]),
                str(p.get("error", "overloaded_error")),
                retry_after=None if p.get("retry_after") is None else float(p["retry_after"]),
                status=None if p.get("status") is None else int(p["status"]),
            ),
        }

    def _control_reply(self, payload: Mapping[str, Any]) -> None:
        if "text" in payload:
            self.queue_reply(str(payload["text"]))
        if "texts" in payload:
            self.queue_reply(*[str(t) for t in payload["texts"]])
        if "content" in payload:
            self.queue_reply(list(payload["content"]))
        if "message" in payload:
            self.queue_reply(dict(payload["message"]))

    def _control_fail(self, payload: Mapping[str, Any]) -> None:
        if payload.get("seed") is not None:
            self._reseed(payload["seed"])
        fields = fault_fields(MessagesFault, payload)
        if "error" in payload:
            fields["error_type"] = payload["error"]
        fault = MessagesFault(**fields)
        if not fault.is_error and not fault.delay and not fault.drop:
            raise ValueError("a fault needs error, status, raw_body, delay or drop")
        self.add_fault(fault)

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "api_keys": list(self.api_keys) if self.api_keys is not None else None,
                "models": sorted(self.models) if self.models is not None else None,
                "require_version": self.require_version,
                "cut_at_max_tokens": self.cut_at_max_tokens,
                **self._fault_state(),
                "pending_replies": len(self._replies),
            }

    # ------------------------------------------------------------------ the Messages API

    def _key_problem(self, request: Request) -> str | None:
        key = request.headers.get("x-api-key")
        if key is None:
            auth = request.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                key = auth[7:].strip()
        if not key:
            return "x-api-key header is required"
        return None if accepts(self.api_keys, key) else "invalid x-api-key"

    async def _begin(self, request: Request, kind: str) -> tuple[RecordedRequest, Response | None]:
        """Record, latency, key check, injected faults; a Response means "answer this"."""
        record = await self._receive(request, kind=kind)
        if not await self._delay(record, self.latency):
            return record, self._stale(record)
        problem = self._key_problem(request)
        if problem is not None:
            return record, self._error(record, "authentication_error", problem)
        now = time.time()
        with self._lock:  # an outage that is over is gone
            self._faults[:] = [f for f in self._faults if f.until is None or f.until > now]
        fault = self._take_fault(lambda f: self._chance(f.probability))
        injected = await self._injected(record, fault)
        if injected is not None:
            return record, injected
        if self.require_version and not request.headers.get("anthropic-version"):
            return record, self._error(
                record, "invalid_request_error", "anthropic-version: header is required"
            )
        if not isinstance(record.body, dict):
            return record, self._error(
                record, "invalid_request_error", "The request body is not valid JSON."
            )
        return record, None

    def _stale(self, record: RecordedRequest) -> Response:
        return self._error(record, "api_error", "The stand-in was reset meanwhile.", status=503)

    def _fault_answer(self, record: RecordedRequest, fault: MessagesFault) -> Response | None:
        if not fault.is_error:
            return None
        response, body = fault.response()
        self._finish(record, response.status_code, body)
        return response

    def _error(
        self, record: RecordedRequest, error_type: str, message: str, status: int | None = None
    ) -> Response:
        request_id = _new_id("req_")
        body = anthropic_error_body(error_type, message, request_id)
        status = status or ERROR_TYPES[body["error"]["type"]][0]
        return self._answer(record, status, body, headers={"request-id": request_id})

    async def _messages(self, request: Request) -> Response:
        record, early = await self._begin(request, "messages")
        if early is not None:
            return early
        body: dict[str, Any] = record.body
        problem = _validate(body) or breakpoint_problem(body)
        if problem is not None:
            return self._error(record, "invalid_request_error", problem)
        if body.get("stream"):
            return self._error(
                record, "invalid_request_error", "stream: the stand-in does not stream"
            )
        if self.models is not None and body["model"] not in self.models:
            return self._error(record, "not_found_error", f"model: {body['model']}")

        with self._lock:
            reply: Reply = self._replies.popleft() if self._replies else self.default_reply
        try:
            value = reply(body) if callable(reply) else reply
        except Exception as exc:
            log.exception("scripted reply raised")
            return self._error(record, "api_error", f"scripted reply raised {exc!r}")
        if isinstance(value, MessagesFault):
            injected = await self._injected(record, value)
            if injected is not None:
                return injected
            value = default_reply(body)
        message = self._message(body, value)
        return self._answer(record, 200, message, headers={"request-id": _new_id("req_")})

    def _message(self, body: dict[str, Any], value: ReplyValue) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        if isinstance(value, dict):
            overrides = dict(value)
            content: Any = overrides.pop("content", default_reply(body))
        else:
            content = value
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        content = list(content)
        stop_reason = (
            "tool_use"
            if any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
            else "end_turn"
        )
        if self.cut_at_max_tokens and "stop_reason" not in overrides:
            content, cut = _cut_at(content, body["max_tokens"])
            stop_reason = "max_tokens" if cut else stop_reason
        message: dict[str, Any] = {
            "id": _new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                **self.prompt_cache.usage(body),
                "output_tokens": content_tokens(content),
                "service_tier": "standard",
            },
        }
        usage_overrides = overrides.pop("usage", None)
        message.update(overrides)
        if isinstance(usage_overrides, dict):
            message["usage"].update(usage_overrides)
        return message

    async def _count_tokens(self, request: Request) -> Response:
        record, early = await self._begin(request, "count_tokens")
        if early is not None:
            return early
        body: dict[str, Any] = record.body
        if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
            return self._error(record, "invalid_request_error", "model and messages are required")
        result = {"input_tokens": count_tokens(body)}
        return self._answer(record, 200, result)

    async def _unknown_path(self, request: Request) -> Response:
        record = await self._receive(request, kind="invalid")
        return self._error(record, "not_found_error", "Not Found")


def _cut_at(content: list[Any], max_tokens: int) -> tuple[list[Any], bool]:
    """The content as far as `max_tokens` reach (text blocks only, four bytes a token), and
    whether anything was cut."""
    budget = max_tokens * 4
    kept: list[Any] = []
    for block in content:
        if not (isinstance(block, dict) and block.get("type") == "text"):
            kept.append(block)
            continue
        raw = str(block.get("text", "")).encode()
        if len(raw) > budget:
            text = raw[:budget].decode(errors="ignore")
            return ([*kept, {**block, "text": text}] if text else kept), True
        budget -= len(raw)
        kept.append(block)
    return kept, False


def _ids(content: Any, kind: str, key: str) -> list[str]:
    if not isinstance(content, list):
        return []
    return [str(b.get(key)) for b in content if isinstance(b, dict) and b.get("type") == kind]


def _tool_problem(messages: list[Any]) -> str | None:
    """How the messages break the API's tool-use pairing, or None."""
    for i, message in enumerate(messages):
        content = message.get("content")
        uses = _ids(content, "tool_use", "id") if message["role"] == "assistant" else []
        if uses and i + 1 < len(messages):
            answered = set(_ids(messages[i + 1].get("content"), "tool_result", "tool_use_id"))
            missing = [u for u in uses if u not in answered]
            if missing:
                return (
                    f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks"
                    f" immediately after: {', '.join(missing)}. Each `tool_use` block must have"
                    " a corresponding `tool_result` block in the next message."
                )
        results = _ids(content, "tool_result", "tool_use_id") if message["role"] == "user" else []
        previous = _ids(messages[i - 1].get("content"), "tool_use", "id") if i else []
        unexpected = [r for r in results if r not in previous]
        if unexpected:
            return (
                f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks:"
                f" {', '.join(unexpected)}. Each `tool_result` block must have a corresponding"
                " `tool_use` block in the previous message."
            )
    last = messages[-1]
    content = last.get("content")
    final = content[-1] if isinstance(content, list) and content else content
    text = final.get("text") if isinstance(final, dict) else final
    if last["role"] == "assistant" and isinstance(text, str) and text != text.rstrip():
        return "messages: final assistant content cannot end with trailing whitespace"
    return None


IMAGE_MEDIA_TYPES = ("image/gif", "image/jpeg", "image/png", "image/webp")
IMAGE_MAX_BASE64 = 5 * 1024 * 1024  # of the base64 string


def _source_problem(block: dict[str, Any]) -> str | None:
    """What is wrong with an image or document block's `source`, as the API words it."""
    kind = block["type"]
    if kind not in ("image", "document"):
        return None
    source = block.get("source")
    if not isinstance(source, dict):
        return "source: Field required"
    if source.get("type") != "base64":
        known = ("url", "file", "text", "content") if kind == "document" else ("url", "file")
        return None if source.get("type") in known else "source.type: Input tag not expected"
    allowed = IMAGE_MEDIA_TYPES if kind == "image" else ("application/pdf",)
    if source.get("media_type") not in allowed:
        return f"source.media_type: Input should be {', '.join(repr(a) for a in allowed)}"
    encoded = str(source.get("data", ""))
    try:
        data = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        return "source.data: invalid base64 data"
    if not data:
        return "source.data: empty"
    if kind == "image" and len(encoded) > IMAGE_MAX_BASE64:
        return f"source.base64: image exceeds 5 MB maximum: {len(encoded)} bytes"
    return None


def _validate(body: dict[str, Any]) -> str | None:
    """The first problem with a Messages request, worded like the API, or None."""
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return f"{name}: Field required"
    if not isinstance(body["model"], str) or not body["model"]:
        return "model: Input should be a valid string"
    max_tokens = body["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Input should be a valid integer greater than or equal to 1"
    messages = body["messages"]
    if not isinstance(messages, list):
        return "messages: Input should be a valid list"
    if not messages:
        return "messages: at least one message is required"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages.{i}: Input should be a valid dictionary"
        if message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        content = message.get("content")
        if isinstance(content, str):
            if not content and i < len(messages) - 1:
                return f"messages.{i}: text content blocks must be non-empty"
        elif isinstance(content, list):
            if not content:
                return f"messages.{i}: all messages must have non-empty content"
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    return f"messages.{i}.content.{j}.type: Field required"
                if block["type"] == "text" and not block.get("text"):
                    return f"messages.{i}.content.{j}: text content blocks must be non-empty"
                problem = _source_problem(block)
                if problem is not None:
                    return f"messages.{i}.content.{j}.{problem}"
        else:
            return f"messages.{i}.content: Input should be a valid string or list"
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list) or not all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in system
        ):
            return "system: Input should be a valid string or a list of text blocks"
    for i, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            return f"tools.{i}.name: Field required"
        if "type" not in tool and not isinstance(tool.get("input_schema"), dict):
            return f"tools.{i}.custom.input_schema: Field required"
    problem = _tool_problem(messages)
    if problem is not None:
        return problem
    temperature = body.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float) or not 0 <= temperature <= 1
    ):
        return "temperature: Input should be less than or equal to 1"
    return None


# ---------------------------------------------------------------------- script


KEYS = Credentials("--api-key", "--any-key", "key", "ANTHROPIC_API_KEY", "test")


def main(argv: Sequence[str] | None = None) -> None:
    parser = script_parser(
        "anthropic_standin",
        "Local stand-in for Anthropic's Messages API.",
        "ANTHROPIC_STANDIN_PORT",
        8082,
        KEYS,
    )
    parser.add_argument("--reply", action="append", default=[], help="queue a reply (repeatable)")
    parser.add_argument("--default-reply", help="fixed reply when the queue is empty")
    parser.add_argument("--model", action="append", help="allowed model (repeatable; default any)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    standin = MessagesApiStandIn(
        api_keys=KEYS.accepted(args),
        replies=args.reply,
        default_reply=args.default_reply if args.default_reply is not None else default_reply,
        models=args.model,
        seed=args.seed,
    )
    serve_forever(standin, args, "messages stand-in", "POST /_control to script it")


if __name__ == "__main__":
    main()
