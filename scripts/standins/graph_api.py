"""A local stand-in for Meta's Graph API (WhatsApp Cloud API outbound), for tests and the dev stack.

    graph = GraphApiStandIn(access_tokens="test-token").start()    # or `with` / `async with`
    # point the product at it: WHATSAPP_API_BASE_URL=graph.url
    graph.fail_next(2, code=130429)                                 # the next two sends get 429
    ...
    [m.body for m in graph.sent_texts(to="5491155550001")]

It serves `POST /{version}/{phone_number_id}/messages` like Meta (and inbound media, `GET
/{version}/{media-id}` then its url: scripts/standins/_media.py): bearer token check (401, code
190), text / template / other message sends (200 with a fresh `wamid.`), read receipt + typing
indicator (`{"success": true}`), anything malformed 400 with code 100, Meta's error body
everywhere. A send names its person in `to` (a number) or, for a person known by a username,
in `recipient` (a business-scoped user id, `AR.4410...`; `SentMessage.to` then holds it, and
status webhooks name it as the recipient). Every request is recorded. Faults (error codes,
fractions, per-recipient rules, raw 5xx, latency, hangs, answers cut after the send was
accepted) are set from Python or over HTTP (`POST /_control`), so a product running in another
process can be driven too. With
`webhook_url` + `app_secret` it posts signed status webhooks (`sent`, `delivered`, `read`, or
`failed`) back to the receiver after each accepted send, retrying non-200 answers like Meta.

Control endpoint (`POST /_control`, JSON; `GET /_control` shows the state, `GET /_requests`
lists the records and webhook deliveries): the ops every stand-in takes are in
`StandInBase.control`, this one's own in `GraphApiStandIn._control_ops`.

Run alone: `scripts/graph_standin --port 8081 [--token T] [--webhook-url URL --app-secret S]`.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins._common import (
    UNSET,
    ControlOp,
    RecordedRequest,
    accepts,
    as_tuple,
    fault_fields,
)
from scripts.standins._media import MediaServer
from scripts.standins._script import Credentials, script_parser, serve_forever
from scripts.standins._webhooks import WebhookStandIn
from scripts.webhooks import (
    DISPLAY_PHONE_NUMBER,
    WABA_ID,
    meta_headers,
    sign_body,
    whatsapp_webhook,
)

__all__ = [
    "META_ERRORS",
    "SEND_KINDS",
    "GraphApiStandIn",
    "GraphFault",
    "ReadReceipt",
    "SentMessage",
    "WebhookDelivery",
    "meta_error_body",
    "sign_body",
    "status_webhook",
]

MAX_TEXT_CHARS = 4096
SEND_KINDS = frozenset({"text", "template"})
ALL_KINDS = frozenset(
    {
        "text",
        "template",
        "read",
        "image",
        "audio",
        "video",
        "document",
        "sticker",
        "location",
        "contacts",
        "interactive",
        "reaction",
    }
)
OTHER_MESSAGE_TYPES = ALL_KINDS - {"text", "template", "read"}
STATUS_RANK = {"sent": 0, "delivered": 1, "read": 2, "failed": 0}
VERSION_RE = re.compile(r"v\d+(\.\d+)?")

# code -> (HTTP status, message, error_data.details, title used in status webhooks)
META_ERRORS: dict[int, tuple[int, str, str, str]] = {
    1: (
        400,
        "An unknown error occurred",
        "Invalid request or possible server error.",
        "API Unknown",
    ),
    2: (
        503,
        "Service temporarily unavailable",
        "Temporary due to downtime or due to being overloaded.",
        "API Service",
    ),
    4: (
        400,
        "(#4) Application request limit reached",
        "The app has reached its API call rate limit.",
        "API Too Many Calls",
    ),
    100: (
        400,
        "(#100) Invalid parameter",
        "The request included invalid or unsupported parameters.",
        "Invalid parameter",
    ),
    190: (
        401,
        "Error validating access token: Session has expired.",
        "The access token has expired or is invalid.",
        "Access token has expired",
    ),
    368: (
        403,
        "Temporarily blocked for policies violations",
        "The WhatsApp Business Account is restricted.",
        "Temporarily blocked for policies violations",
    ),
    130429: (
        429,
        "(#130429) Rate limit hit",
        "Cloud API message throughput has been reached.",
        "Rate limit hit",
    ),
    130472: (
        400,
        "(#130472) User's number is part of an experiment",
        "Failed to send message because this user's phone number is part of an experiment.",
        "User's number is part of an experiment",
    ),
    131000: (
        500,
        "Something went wrong",
        "Message failed to send due to an unknown error.",
        "Something went wrong",
    ),
    131005: (
        403,
        "(#131005) Access denied",
        "Permission is either not granted or has been removed.",
        "Access denied",
    ),
    131008: (
        400,
        "(#131008) Required parameter is missing",
        "The request is missing a required parameter.",
        "Required parameter is missing",
    ),
    131009: (
        400,
        "(#131009) Parameter value is not valid",
        "One or more parameter values are invalid.",
        "Parameter value is not valid",
    ),
    131016: (
        503,
        "(#131016) Service unavailable",
        "A service is temporarily unavailable.",
        "Service unavailable",
    ),
    131021: (
        400,
        "(#131021) Recipient cannot be sender",
        "Sender and recipient phone number is the same.",
        "Recipient cannot be sender",
    ),
    131026: (
        400,
        "(#131026) Message Undeliverable",
        "Message failed to send because the recipient is not a WhatsApp user or cannot receive it.",
        "Message undeliverable",
    ),
    131047: (
        400,
        "(#131047) Re-engagement message",
        (
            "Message failed to send because more than 24 hours have passed since the customer"
            " last replied to this number."
        ),
        "Re-engagement message",
    ),
    131049: (
        400,
        "(#131049) Meta chose not to deliver",
        "This message was not delivered to maintain healthy ecosystem engagement.",
        "This message was not delivered to maintain healthy ecosystem engagement.",
    ),
    131050: (
        400,
        "(#131050) Unable to deliver the message",
        "This recipient has chosen to stop receiving marketing messages on WhatsApp from your"
        " business.",
        "Unable to deliver the message. This recipient has chosen to stop receiving marketing"
        " messages on WhatsApp from your business.",
    ),
    131051: (
        400,
        "(#131051) Unsupported message type",
        "Message type is not currently supported.",
        "Unsupported message type",
    ),
    131056: (
        400,
        "(#131056) (Business Account, Consumer Account) pair rate limit hit",
        (
            "Message failed to send because there were too many messages sent from this phone"
            " number to the same phone number in a short period of time."
        ),
        "Pair rate limit hit",
    ),
    132000: (
        400,
        "(#132000) Number of parameters does not match the expected number of params",
        "The number of variable parameter values does not match the template.",
        "Template param count mismatch",
    ),
    132001: (
        404,
        "(#132001) Template name does not exist in the translation",
        "The template does not exist in the specified language or has not been approved.",
        "Template does not exist",
    ),
}


def meta_error_body(
    code: int,
    message: str | None = None,
    details: str | None = None,
    *,
    subcode: int | None = None,
) -> dict[str, Any]:
    """Meta's error body: `{"error": {"message", "type", "code", "error_data", "fbtrace_id"}}`."""
    _, default_message, default_details, _ = META_ERRORS.get(
        code, (400, f"(#{code}) Error", "Error injected by the Graph API stand-in.", "Error")
    )
    error: dict[str, Any] = {
        "message": message if message is not None else default_message,
        "type": "OAuthException",
        "code": code,
        "error_data": {
            "messaging_product": "whatsapp",
            "details": details if details is not None else default_details,
        },
        "fbtrace_id": _fbtrace_id(),
    }
    if subcode is None and code == 190:
        subcode = 463  # "session has expired"
    if subcode is not None:
        error["error_subcode"] = subcode
    return {"error": error}


def default_status_for(code: int) -> int:
    return META_ERRORS.get(code, (400, "", "", ""))[0]


def _fbtrace_id() -> str:
    return "A" + secrets.token_urlsafe(16).replace("-", "x").replace("_", "Y")[:22]


def _digits(number: str) -> str:
    return "".join(ch for ch in number if ch.isdigit())


def _is_user_id(value: str) -> bool:
    """A business-scoped user id as Meta writes them: a country code, a dot, digits."""
    country, dot, rest = value.partition(".")
    return bool(dot) and country.isalpha() and rest.isalnum()


def _address(body: dict[str, Any]) -> Any:
    """Who a send is addressed to: `to` (a number), else `recipient` (a user id)."""
    return body["to"] if "to" in body else body.get("recipient")


def _recipient_id(address: str) -> str:
    """A status webhook's recipient: the user id as given, a number as its digits."""
    return address if _is_user_id(address) else _digits(address)


# ---------------------------------------------------------------------- public data types


@dataclass
class GraphFault:
    """One fault rule. The first rule (in the order added) that matches a request decides.

    Matching: `kinds` (default: text and template sends; add "read" for read receipts), `to`
    (recipient, digits compared), then `probability` (seeded RNG). Each match consumes one of
    `count` (None = never used up). What it does, after sleeping `delay` seconds:
    - `raw_body` set: answer `status` (default 502) with that non-JSON body;
    - `code` set: answer Meta's error body with that code, HTTP `status` (default per code);
    - neither (a pure delay, e.g. `hang_next`): the request is then handled normally, so the
      message IS accepted and recorded as sent even if the client gave up waiting;
    - `drop` (`drop_next`): handled normally too, but the connection is closed halfway through
      the answer (the client never learns the wamid of a message Meta accepted).
    """

    code: int | None = None
    status: int | None = None
    message: str | None = None
    details: str | None = None
    raw_body: str | None = None
    content_type: str = "text/html"
    delay: float = 0.0
    count: int | None = 1
    probability: float = 1.0
    to: str | None = None
    kinds: frozenset[str] = SEND_KINDS
    drop: bool = False
    hits: int = 0

    @property
    def is_error(self) -> bool:
        return self.code is not None or self.raw_body is not None

    def matches(self, kind: str, to: str | None) -> bool:
        if kind not in self.kinds:
            return False
        return self.to is None or (to is not None and _digits(self.to) == _digits(to))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kinds"] = sorted(self.kinds)
        return data


@dataclass(frozen=True)
class SentMessage:
    """A send the stand-in accepted (HTTP 200)."""

    wamid: str
    to: str
    type: str
    phone_number_id: str
    payload: dict[str, Any]
    time: float

    @property
    def body(self) -> str | None:
        """The text body (text sends), else None."""
        text = self.payload.get("text")
        return text.get("body") if isinstance(text, dict) else None

    @property
    def context_message_id(self) -> str | None:
        context = self.payload.get("context")
        return context.get("message_id") if isinstance(context, dict) else None

    @property
    def template_name(self) -> str | None:
        template = self.payload.get("template")
        return template.get("name") if isinstance(template, dict) else None

    @property
    def template_language(self) -> str | None:
        template = self.payload.get("template")
        if isinstance(template, dict) and isinstance(template.get("language"), dict):
            code = template["language"].get("code")
            return code if isinstance(code, str) else None
        return None


@dataclass(frozen=True)
class ReadReceipt:
    """An accepted read receipt (with or without typing indicator)."""

    message_id: str
    typing_indicator: str | None  # "text" when the typing indicator was asked for
    phone_number_id: str
    time: float


@dataclass(frozen=True)
class WebhookDelivery:
    """One attempt to POST a status webhook to `webhook_url`."""

    time: float
    wamid: str
    status: str
    recipient_id: str
    attempt: int
    response_status: int | None
    error: str | None
    body: bytes

    @property
    def ok(self) -> bool:
        return self.response_status == 200


# ---------------------------------------------------------------------- the stand-in


class GraphApiStandIn(WebhookStandIn[GraphFault, WebhookDelivery]):
    """Meta's Graph API `/{version}/{phone_number_id}/messages`, in-process or as a script.

    Constructor (all keyword-only, all changeable later with `configure`):
    - `access_tokens`: accepted bearer tokens (str, comma-separated str, or iterable);
      None accepts any non-empty token. Default "test-token".
    - `webhook_url`, `app_secret`: where and how to sign status webhooks; no URL, no webhooks.
    - `phone_number_id`: `metadata.phone_number_id` in webhooks (default: the id in the send URL);
      `display_phone_number`, `waba_id` (`entry[].id`) likewise.
    - `status_order`: statuses posted after each accepted send, in this order
      (default sent, delivered, read); `out_of_order=True` posts them reversed.
    - `status_delays`: seconds before each status POST (the last value repeats).
    - `fail_status_recipients`: {recipient: code}: such sends are accepted (200, wamid) but the
      webhook is a single `failed` status with that code (Meta reports 131047 this way; a
      template to such a recipient is delivered, as Meta's are outside the window).
    - `webhook_retries` / `webhook_retry_delay`: extra attempts on a non-200 answer or a
      connection error, with doubling delays.
    - `seed`: seeds the RNG used by `fail_fraction`.
    - `host`, `port`: where `start()` listens (port 0: a free one).
    """

    name = "graph-standin"

    def __init__(
        self,
        *,
        access_tokens: str | Iterable[str] | None = ("test-token",),
        webhook_url: str | None = None,
        app_secret: str | None = None,
        phone_number_id: str | None = None,
        display_phone_number: str = DISPLAY_PHONE_NUMBER,
        waba_id: str = WABA_ID,
        status_order: Sequence[str] = ("sent", "delivered", "read"),
        out_of_order: bool = False,
        status_delays: Sequence[float] = (0.02,),
        fail_status_recipients: Mapping[str, int] | None = None,
        webhook_retries: int = 3,
        webhook_retry_delay: float = 0.1,
        webhook_timeout: float = 5.0,
        seed: int | None = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port, seed=seed)
        self.access_tokens: tuple[str, ...] | None = ()
        self.webhook_url: str | None = None
        self.app_secret: str | None = None
        self.phone_number_id = phone_number_id
        self.display_phone_number = display_phone_number
        self.waba_id = waba_id
        self.status_order: tuple[str, ...] = ()
        self.out_of_order = out_of_order
        self.status_delays: tuple[float, ...] = ()
        self.fail_status_recipients: dict[str, int] = {}
        self.webhook_retries = webhook_retries
        self.webhook_retry_delay = webhook_retry_delay
        self.webhook_timeout = webhook_timeout
        self._counter = itertools.count(1)
        self._initial_config = {
            "access_tokens": access_tokens,
            "webhook_url": webhook_url,
            "app_secret": app_secret,
            "phone_number_id": phone_number_id,
            "display_phone_number": display_phone_number,
            "waba_id": waba_id,
            "status_order": status_order,
            "out_of_order": out_of_order,
            "status_delays": status_delays,
            "fail_status_recipients": dict(fail_status_recipients or {}),
            "webhook_retries": webhook_retries,
            "webhook_retry_delay": webhook_retry_delay,
            "webhook_timeout": webhook_timeout,
        }
        self.configure(**self._initial_config)
        self.media = MediaServer(self, self._authorized)  # inbound media (_media.py)
        self._app = self._serve(
            [
                Route("/{version}/{phone_number_id}/messages", self._messages, methods=["POST"]),
                *self.media.routes(),
            ]
        )

    # ------------------------------------------------------------------ configuration

    def configure(
        self,
        *,
        access_tokens: str | Iterable[str] | None = UNSET,
        webhook_url: str | None = UNSET,
        app_secret: str | None = UNSET,
        phone_number_id: str | None = UNSET,
        display_phone_number: str = UNSET,
        waba_id: str = UNSET,
        status_order: Sequence[str] = UNSET,
        out_of_order: bool = UNSET,
        status_delays: Sequence[float] = UNSET,
        fail_status_recipients: Mapping[str, int] = UNSET,
        webhook_retries: int = UNSET,
        webhook_retry_delay: float = UNSET,
        webhook_timeout: float = UNSET,
    ) -> None:
        """Change any constructor setting at runtime (only the ones given)."""
        unset = UNSET
        with self._lock:
            if access_tokens is not unset:
                self.access_tokens = as_tuple(access_tokens)
            if webhook_url is not unset:
                self.webhook_url = webhook_url or None
            if app_secret is not unset:
                secret = as_tuple(app_secret) if app_secret else None
                self.app_secret = secret[0] if secret else None  # first of a rotation list
            if phone_number_id is not unset:
                self.phone_number_id = phone_number_id or None
            if display_phone_number is not unset:
                self.display_phone_number = display_phone_number
            if waba_id is not unset:
                self.waba_id = waba_id
            if status_order is not unset:
                order = tuple(status_order)
                bad = [s for s in order if s not in ("sent", "delivered", "read", "played")]
                if bad:
                    raise ValueError(f"unknown statuses {bad}")
                self.status_order = order
            if out_of_order is not unset:
                self.out_of_order = bool(out_of_order)
            if status_delays is not unset:
                delays = tuple(float(d) for d in status_delays)
                self.status_delays = delays or (0.0,)
            if fail_status_recipients is not unset:
                self.fail_status_recipients = {
                    _digits(to): int(code) for to, code in fail_status_recipients.items()
                }
            if webhook_retries is not unset:
                self.webhook_retries = int(webhook_retries)
            if webhook_retry_delay is not unset:
                self.webhook_retry_delay = float(webhook_retry_delay)
            if webhook_timeout is not unset:
                self.webhook_timeout = float(webhook_timeout)
            if self.webhook_url and not self.app_secret:
                raise ValueError("webhook_url needs app_secret (Meta signs every webhook)")

    def fail_status_for(self, to: str, code: int = 131047) -> None:
        """Sends to `to` are accepted, then reported by a `failed` status webhook with `code`."""
        with self._lock:
            self.fail_status_recipients[_digits(to)] = code

    # ------------------------------------------------------------------ faults

    def fail_next(
        self,
        n: int = 1,
        code: int = 131000,
        *,
        status: int | None = None,
        message: str | None = None,
        details: str | None = None,
        to: str | None = None,
        kinds: Iterable[str] = SEND_KINDS,
        delay: float = 0.0,
    ) -> GraphFault:
        """The next `n` matching sends fail with Meta error `code` (HTTP status per code)."""
        return self.add_fault(
            GraphFault(
                code=code,
                status=status,
                message=message,
                details=details,
                to=to,
                kinds=frozenset(kinds),
                delay=delay,
                count=n,
            )
        )

    def fail_fraction(
        self,
        p: float,
        code: int = 131000,
        *,
        seed: int | None = None,
        n: int | None = None,
        status: int | None = None,
        message: str | None = None,
        details: str | None = None,
        to: str | None = None,
        kinds: Iterable[str] = SEND_KINDS,
    ) -> GraphFault:
        """Each matching send fails with probability `p` (at most `n` times; None: no limit).
        `seed` reseeds the stand-in's RNG, so a run is reproducible."""
        if seed is not None:
            self._reseed(seed)
        return self.add_fault(
            GraphFault(
                code=code,
                status=status,
                message=message,
                details=details,
                to=to,
                kinds=frozenset(kinds),
                probability=p,
                count=n,
            )
        )

    def fail_recipient(
        self,
        to: str,
        code: int = 131047,
        *,
        status: int | None = None,
        message: str | None = None,
        details: str | None = None,
        kinds: Iterable[str] = SEND_KINDS,
    ) -> GraphFault:
        """Every send to `to` fails with `code` (e.g. 131047: the 24-hour window is closed)."""
        return self.add_fault(
            GraphFault(
                code=code,
                status=status,
                message=message,
                details=details,
                to=to,
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
        kinds: Iterable[str] = SEND_KINDS,
    ) -> GraphFault:
        """The next `n` sends get HTTP `status` with a non-JSON body (a proxy's error page)."""
        return self.add_fault(
            GraphFault(
                status=status,
                raw_body=body,
                content_type=content_type,
                kinds=frozenset(kinds),
                count=n,
            )
        )

    def hang_next(
        self,
        n: int = 1,
        seconds: float = 30.0,
        *,
        code: int | None = None,
        kinds: Iterable[str] = SEND_KINDS,
    ) -> GraphFault:
        """The next `n` sends wait `seconds` before answering (longer than the client's timeout
        to make it time out). Without `code` the send is then ACCEPTED (recorded as sent, status
        webhooks follow): Meta may deliver a message whose answer the client never saw."""
        return self.add_fault(GraphFault(code=code, delay=seconds, kinds=frozenset(kinds), count=n))

    def drop_next(self, n: int = 1, *, kinds: Iterable[str] = SEND_KINDS) -> GraphFault:
        """The next `n` sends are ACCEPTED (recorded as sent, status webhooks follow), then the
        connection is closed before the answer is complete: a dropped connection after Meta
        took the request."""
        return self.add_fault(GraphFault(drop=True, kinds=frozenset(kinds), count=n))

    def reset(self) -> None:
        """As every stand-in's, and the media files forgotten too."""
        super().reset()
        self.media.reset()

    def reset_faults(self) -> None:
        """No faults, no latency, no failed-status recipients."""
        with self._lock:
            super().reset_faults()
            self.fail_status_recipients.clear()

    def _admits(self, kind: str, to: str | None) -> GraphFault | None:
        return self._take_fault(lambda f: f.matches(kind, to) and self._chance(f.probability))

    # ------------------------------------------------------------------ what was sent

    def sent_messages(self, to: str | None = None) -> list[SentMessage]:
        """Every accepted send (any type), oldest first; `to` filters by recipient."""
        with self._lock:
            sent = [r.extra["sent"] for r in self._records if r.ok and "sent" in r.extra]
        if to is not None:
            sent = [m for m in sent if _digits(m.to) == _digits(to)]
        return sent

    def sent_texts(self, to: str | None = None) -> list[SentMessage]:
        """Accepted text sends (`.body`, `.to`, `.wamid`, `.context_message_id`, `.payload`)."""
        return [m for m in self.sent_messages(to) if m.type == "text"]

    def sent_templates(self, to: str | None = None) -> list[SentMessage]:
        """Accepted template sends (`.template_name`, `.template_language`)."""
        return [m for m in self.sent_messages(to) if m.type == "template"]

    def read_receipts(self) -> list[ReadReceipt]:
        """Accepted read receipts (`.message_id`, `.typing_indicator`), oldest first."""
        with self._lock:
            return [r.extra["read"] for r in self._records if r.ok and "read" in r.extra]

    # ------------------------------------------------------------------ HTTP control

    def _control_ops(self) -> dict[str, ControlOp]:
        """Besides every stand-in's ops (`StandInBase.control`):

        - `{"op": "fail", "code": 130429, "count": 2}`: add a fault; fields of `GraphFault`:
          code, status, message, details, raw_body, content_type, delay, count (null = forever),
          probability, to, kinds, drop; plus `seed` to reseed the RNG first.
        - `{"op": "hang", "seconds": 30, "count": 1, "code": null}`: as `hang_next`.
        - `{"op": "fail_status", "to": "549...", "code": 131047}`: as `fail_status_for`.
        - `reset` also forgets the failed-status recipients; `clear`, the webhook deliveries.
        """
        return {
            **super()._control_ops(),
            "fail": self._control_fail,
            "hang": lambda p: self.hang_next(
                int(p.get("count", 1)),
                float(p.get("seconds", 30.0)),
                code=p.get("code"),
                kinds=p.get("kinds", SEND_KINDS),
            ),
            "fail_status": lambda p: self.fail_status_for(str(p["to"]), int(p.get("code", 131047))),
            "media": self.media.control,
        }

    def _control_fail(self, payload: Mapping[str, Any]) -> None:
        if payload.get("seed") is not None:
            self._reseed(payload["seed"])
        fault = GraphFault(**fault_fields(GraphFault, payload))
        if not fault.is_error and not fault.delay and not fault.drop:
            raise ValueError("a fault needs code, raw_body, delay or drop")
        if fault.raw_body is not None and fault.status is None:
            fault.status = 502
        self.add_fault(fault)

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "access_tokens": list(self.access_tokens)
                if self.access_tokens is not None
                else None,
                "webhook_url": self.webhook_url,
                "phone_number_id": self.phone_number_id,
                "display_phone_number": self.display_phone_number,
                "waba_id": self.waba_id,
                "status_order": list(self.status_order),
                "out_of_order": self.out_of_order,
                "status_delays": list(self.status_delays),
                "fail_status_recipients": dict(self.fail_status_recipients),
                **self._fault_state(),
                "pending_webhooks": self._pending_webhooks,
            }

    # ------------------------------------------------------------------ the Graph API

    def _authorized(self, header: str | None) -> bool:
        if not header or not header.lower().startswith("bearer "):
            return False
        return accepts(self.access_tokens, header[7:].strip())

    async def _unknown_path(self, request: Request) -> Response:
        record = await self._receive(request, kind="invalid")
        body = meta_error_body(
            100,
            f"Unsupported {request.method.lower()} request. Object with ID "
            f"'{request.url.path.strip('/')}' does not exist, cannot be loaded due to missing "
            "permissions, or does not support this operation.",
            "Unknown path.",
            subcode=33,
        )
        return self._answer(record, 400, body)

    def _stale(self, record: RecordedRequest) -> Response:
        body = meta_error_body(2, details="The stand-in was reset meanwhile.")
        return self._answer(record, 503, body)

    def _fault_answer(self, record: RecordedRequest, fault: GraphFault) -> Response | None:
        if fault.raw_body is not None:
            return self._raw_answer(record, fault)
        if fault.code is None:
            return None
        status = fault.status or default_status_for(fault.code)
        return self._answer(
            record, status, meta_error_body(fault.code, fault.message, fault.details)
        )

    async def _messages(self, request: Request) -> Response:
        version = request.path_params["version"]
        phone_number_id = request.path_params["phone_number_id"]
        record = await self._receive(request, extra={"phone_number_id": phone_number_id})
        if not await self._delay(record, self.latency):
            return self._stale(record)

        if not self._authorized(request.headers.get("authorization")):
            return self._answer(
                record,
                401,
                meta_error_body(
                    190,
                    "Invalid OAuth access token - Cannot parse access token",
                    "The access token is missing, malformed or not accepted.",
                ),
                "unauthorized",
            )
        if not VERSION_RE.fullmatch(version) or not phone_number_id.isdigit():
            return self._answer(
                record,
                400,
                meta_error_body(
                    100,
                    f"Unsupported post request. Object with ID '{phone_number_id}' does not "
                    "exist, cannot be loaded due to missing permissions, or does not support "
                    "this operation.",
                    f"Bad version {version!r} or phone number id {phone_number_id!r}.",
                    subcode=33,
                ),
                "invalid",
            )
        kind, problem = _classify(record.body)
        to = _address(record.body) if isinstance(record.body, dict) else None
        to = to if isinstance(to, str) else None
        record.extra["to"] = to
        if problem is not None:
            return self._answer(record, 400, meta_error_body(100, details=problem), "invalid")
        record.kind = kind

        injected = await self._injected(record, self._admits(kind, to))
        if injected is not None:
            return injected
        body: dict[str, Any] = record.body
        if kind == "read":
            return self._answer(record, 200, self._read(record, phone_number_id, body))
        assert to is not None
        sent = SentMessage(
            wamid=self._new_wamid(),
            to=to,
            type=kind,
            phone_number_id=phone_number_id,
            payload=body,
            time=time.time(),
        )
        record.extra["sent"] = sent
        response = self._answer(record, 200, _send_result(sent))
        self._schedule_statuses(sent)
        return response

    def _read(
        self, record: RecordedRequest, phone_number_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Take a read receipt (and typing indicator); the Graph API's answer to it."""
        typing = body.get("typing_indicator")
        record.extra["read"] = ReadReceipt(
            message_id=body["message_id"],
            typing_indicator=typing.get("type") if isinstance(typing, dict) else None,
            phone_number_id=phone_number_id,
            time=time.time(),
        )
        return {"success": True}

    def _new_wamid(self) -> str:
        n = next(self._counter)
        return f"wamid.SI{n:06d}{secrets.token_hex(10).upper()}"

    # ------------------------------------------------------------------ status webhooks

    def _schedule_statuses(self, sent: SentMessage) -> None:
        with self._lock:
            url, secret = self.webhook_url, self.app_secret
            if not url or not secret:
                return
            fail_code = self.fail_status_recipients.get(_digits(sent.to))
            if fail_code == 131047 and sent.type == "template":
                fail_code = None  # a template may go out after the 24-hour window: delivered
            if fail_code is not None:
                order: tuple[str, ...] = ("failed",)
            else:
                order = self.status_order
                if self.out_of_order:
                    order = tuple(reversed(order))
            plan = _StatusPlan(
                url=url,
                secret=secret,
                order=order,
                delays=self.status_delays,
                fail_code=fail_code,
                phone_number_id=self.phone_number_id or sent.phone_number_id,
                display_phone_number=self.display_phone_number,
                waba_id=self.waba_id,
                retries=self.webhook_retries,
                retry_delay=self.webhook_retry_delay,
                timeout=self.webhook_timeout,
                generation=self._generation,
            )
        self._spawn(self._deliver_statuses(sent, plan), sent.wamid)

    async def _deliver_statuses(self, sent: SentMessage, plan: _StatusPlan) -> None:
        base = int(sent.time)
        for i, status in enumerate(plan.order):
            await self._sleep(plan.delays[min(i, len(plan.delays) - 1)])
            if self._stopping.is_set() or plan.generation != self._generation:
                return
            payload = status_webhook(
                wamid=sent.wamid,
                status=status,
                recipient_id=_recipient_id(sent.to),
                timestamp=base + STATUS_RANK.get(status, 0),
                phone_number_id=plan.phone_number_id,
                display_phone_number=plan.display_phone_number,
                waba_id=plan.waba_id,
                error_code=plan.fail_code if status == "failed" else None,
                category="utility" if sent.type == "template" else "service",
            )
            await self._post_webhook(plan, sent, status, orjson.dumps(payload))

    async def _post_webhook(
        self, plan: _StatusPlan, sent: SentMessage, status: str, body: bytes
    ) -> None:
        client = self._client()
        headers = meta_headers(plan.secret, body)
        for attempt in range(1, plan.retries + 2):
            response_status: int | None = None
            error: str | None = None
            try:
                response = await client.post(
                    plan.url, content=body, headers=headers, timeout=plan.timeout
                )
                response_status = response.status_code
            except httpx.HTTPError as exc:
                error = repr(exc)
            delivery = WebhookDelivery(
                time=time.time(),
                wamid=sent.wamid,
                status=status,
                recipient_id=_digits(sent.to),
                attempt=attempt,
                response_status=response_status,
                error=error,
                body=body,
            )
            if not self._deliver(delivery, plan.generation):
                return
            if response_status == 200 or attempt > plan.retries or self._stopping.is_set():
                return
            await self._sleep(plan.retry_delay * 2 ** (attempt - 1))


@dataclass(frozen=True)
class _StatusPlan:
    url: str
    secret: str
    order: tuple[str, ...]
    delays: tuple[float, ...]
    fail_code: int | None
    phone_number_id: str
    display_phone_number: str
    waba_id: str
    retries: int
    retry_delay: float
    timeout: float
    generation: int


def _send_result(sent: SentMessage) -> dict[str, Any]:
    """The Graph API's answer to an accepted send."""
    message: dict[str, Any] = {"id": sent.wamid}
    if sent.type == "template":
        message["message_status"] = "accepted"
    return {
        "messaging_product": "whatsapp",
        "contacts": [{"input": sent.to, "wa_id": _digits(sent.to)}],
        "messages": [message],
    }


def status_webhook(
    *,
    wamid: str,
    status: str,
    recipient_id: str,
    timestamp: int,
    phone_number_id: str,
    display_phone_number: str = DISPLAY_PHONE_NUMBER,
    waba_id: str = WABA_ID,
    error_code: int | None = None,
    category: str = "service",
) -> dict[str, Any]:
    """A status webhook exactly as Meta shapes it (see shared/fixtures/whatsapp/status_*.json)."""
    item: dict[str, Any] = {
        "id": wamid,
        "status": status,
        "timestamp": str(timestamp),
        "recipient_id": recipient_id,
    }
    if status == "sent":
        item["pricing"] = {
            "billable": category != "service",
            "pricing_model": "PMP",
            "type": "free_customer_service" if category == "service" else "regular",
            "category": category,
        }
    if status == "failed":
        code = error_code if error_code is not None else 131000
        _, _, details, title = META_ERRORS.get(
            code, (400, "", "Error injected by the Graph API stand-in.", "Error")
        )
        item["errors"] = [
            {"code": code, "title": title, "message": title, "error_data": {"details": details}}
        ]
    return whatsapp_webhook(
        {"statuses": [item]},
        phone_number_id=phone_number_id,
        display_phone_number=display_phone_number,
        waba_id=waba_id,
    )


def _classify(body: Any) -> tuple[str, str | None]:
    """(kind, problem): kind is text | template | read | another message type."""
    if not isinstance(body, dict):
        return "invalid", "The request body must be a JSON object."
    if body.get("messaging_product") != "whatsapp":
        return "invalid", "The parameter messaging_product is required and must be 'whatsapp'."
    if "status" in body:
        if body["status"] != "read":
            return "invalid", "Param status must be 'read'."
        if not isinstance(body.get("message_id"), str) or not body["message_id"]:
            return "invalid", "The parameter message_id is required."
        typing = body.get("typing_indicator")
        if typing is not None and (not isinstance(typing, dict) or typing.get("type") != "text"):
            return "invalid", "Param typing_indicator['type'] must be 'text'."
        return "read", None
    to = body.get("to")
    if "to" not in body and "recipient" in body:  # a username's business-scoped user id
        recipient = body["recipient"]
        if not isinstance(recipient, str) or not _is_user_id(recipient):
            return "invalid", "Param recipient must be a business-scoped user id (CC.digits)."
    elif not isinstance(to, str) or not _digits(to):
        return "invalid", "The parameter to is required."
    kind = body.get("type", "text")
    context = body.get("context")
    if context is not None and (
        not isinstance(context, dict) or not isinstance(context.get("message_id"), str)
    ):
        return "invalid", "Param context['message_id'] must be a string."
    if kind == "text":
        text = body.get("text")
        if not isinstance(text, dict) or not isinstance(text.get("body"), str):
            return "invalid", "The parameter text['body'] is required."
        if not text["body"].strip():
            return "invalid", "Param text['body'] must not be empty."
        if len(text["body"]) > MAX_TEXT_CHARS:
            return (
                "invalid",
                f"Param text['body'] must be at most {MAX_TEXT_CHARS} characters long.",
            )
        return "text", None
    if kind == "template":
        template = body.get("template")
        if not isinstance(template, dict) or not isinstance(template.get("name"), str):
            return "invalid", "The parameter template['name'] is required."
        language = template.get("language")
        if not isinstance(language, dict) or not isinstance(language.get("code"), str):
            return "invalid", "The parameter template['language']['code'] is required."
        return "template", None
    if isinstance(kind, str) and kind in OTHER_MESSAGE_TYPES:
        if not isinstance(body.get(kind), dict):
            return "invalid", f"The parameter {kind} is required."
        return kind, None
    return "invalid", f"Param type must be one of {sorted(ALL_KINDS - {'read'})}."


# ---------------------------------------------------------------------- script


TOKENS = Credentials(
    "--token", "--any-token", "bearer token", "WHATSAPP_ACCESS_TOKEN", "test-token"
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = script_parser(
        "graph_standin",
        "Local stand-in for Meta's Graph API (WhatsApp).",
        "GRAPH_STANDIN_PORT",
        8081,
        TOKENS,
    )
    parser.add_argument("--webhook-url", help="post status webhooks here (the receiver)")
    parser.add_argument("--app-secret", default=os.environ.get("WHATSAPP_APP_SECRET"))
    parser.add_argument("--phone-number-id", help="metadata.phone_number_id in webhooks")
    parser.add_argument("--status-delay", type=float, action="append", help="seconds (repeatable)")
    parser.add_argument("--out-of-order", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    standin = GraphApiStandIn(
        access_tokens=TOKENS.accepted(args),
        webhook_url=args.webhook_url,
        app_secret=args.app_secret if args.webhook_url else None,
        phone_number_id=args.phone_number_id,
        out_of_order=args.out_of_order,
        status_delays=args.status_delay or (0.5, 1.0, 2.0),
        seed=args.seed,
    )
    serve_forever(standin, args, "graph stand-in", "POST /_control to inject faults")


if __name__ == "__main__":
    main()
