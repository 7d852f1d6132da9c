"""What a review item says, in sentences a person of the business reads: its error, and what
of the reply went out and what did not.

The worker stores errors as the code raised them (`RetryLater: HTTP 500, code None: <html>…`,
`131047: Re-engagement message`, `Chatwoot HTTP 502: …`): exact, and what the logs and the
providers' support need, but not what an operator should have to decode. `sentence` turns the
known shapes into one sentence; the page keeps the raw text one click away (<details>).
Anything it does not recognise is shown as it is, shortened, markup taken out.
"""

from __future__ import annotations

import re
from typing import Any

from shared.conversation.unknowns import describe, utc
from shared.ops.live_state import duration

HTTP_STATUS = {
    400: "bad request",
    401: "not authorised: the token is wrong or expired",
    403: "forbidden",
    404: "not found",
    408: "request timeout",
    409: "conflict",
    413: "too large",
    422: "refused as invalid",
    429: "too many requests: rate limited",
    500: "server error",
    502: "bad gateway",
    503: "service unavailable",
    504: "gateway timeout",
}
# Meta's error codes (Cloud API) an item may carry, in words.
META_CODES = {
    1: "API unknown error",
    2: "API service temporarily unavailable",
    100: "invalid parameter",
    190: "the access token has expired",
    130429: "rate limit hit",
    130472: "the person's number is part of a Meta experiment",
    131000: "something went wrong at Meta",
    131008: "a required parameter is missing",
    131009: "a parameter value is not valid",
    131016: "service unavailable",
    131026: "message undeliverable: not on WhatsApp, an old app, or it cannot be received",
    131047: "the 24-hour window had closed: only a template may be sent",
    131049: "held back by Meta to keep engagement healthy",
    131050: "the person stopped marketing messages",
    131051: "message type not supported",
    131056: "too many messages to this person: pair rate limit",
}
PROVIDERS = {"Graph API": "WhatsApp", "Chatwoot": "Chatwoot", "Anthropic": "The AI (Anthropic)"}
SHOWN_CHARS = 240

_EXCEPTION = re.compile(r"^(?:RetryLater|NeedsReview|DeliveryUnknown|TurnError|[A-Z]\w*Error): ")
_GRAPH = re.compile(r"^HTTP (\d{3}), code (\w+): ?(.*)$", re.S)
_CHATWOOT = re.compile(r"^Chatwoot HTTP (\d{3}): ?(.*)$", re.S)
_UNREACHABLE = re.compile(r"^(Graph API|Chatwoot) unreachable: (\w+)")
_NO_ANSWER = re.compile(r"^Graph API did not answer: (\w+)")
_META = re.compile(r"^(\d{1,6}): ?(.*)$", re.S)
_TOO_OLD = re.compile(r"^oldest message (\d+)s old$")
_TAGS = re.compile(r"<[^>]*>")
_SPACES = re.compile(r"\s+")


def _status(code: int) -> str:
    return f"{code} ({HTTP_STATUS.get(code, 'error' if code >= 400 else 'unexpected')})"


def _body(text: str) -> str:
    """An answer's body as a short clause: an HTML page is named, not shown."""
    text = text.strip()
    if not text or text in ("None", "''"):
        return ""
    if text.lstrip().lower().startswith(("<html", "<!doctype")):
        return " with an HTML page instead of an error message"
    return f": {_short(text)}"


def _short(text: str) -> str:
    plain = _SPACES.sub(" ", _TAGS.sub(" ", text)).strip()
    return plain if len(plain) <= SHOWN_CHARS else plain[: SHOWN_CHARS - 1] + "…"


def sentence(error: Any) -> str:
    """The item's error as one sentence ("" for none)."""
    raw = str(error or "").strip()
    if not raw:
        return ""
    text = _EXCEPTION.sub("", raw, count=1)
    if found := _GRAPH.match(text):
        status, code, body = int(found.group(1)), found.group(2), found.group(3)
        said = f"WhatsApp answered {_status(status)}"
        if code.isdigit():
            said += f", error {code} ({META_CODES.get(int(code), 'see Meta error codes')})"
        return said + _body(body) + "."
    if found := _CHATWOOT.match(text):
        return f"Chatwoot answered {_status(int(found.group(1)))}{_body(found.group(2))}."
    if found := _UNREACHABLE.match(text):
        who = PROVIDERS[found.group(1)]
        return f"{who} could not be reached ({found.group(2)}); nothing was sent."
    if found := _NO_ANSWER.match(text):
        return (
            f"WhatsApp did not answer ({found.group(1)}) after the request was sent: "
            "the message may or may not have arrived."
        )
    if found := _TOO_OLD.match(text):
        waited = duration(int(found.group(1)) * 1000)
        return (
            f"The oldest message had waited {waited} (longer than REVIEW_AFTER_S) when a "
            "worker got to it: too late to answer without a person looking first."
        )
    if found := _META.match(text):
        code = int(found.group(1))
        if code in META_CODES:
            return f"WhatsApp refused it: error {code} ({META_CODES[code]}){_body(found.group(2))}."
    for prefix, who in PROVIDERS.items():
        if text.startswith(f"{prefix}: "):
            return f"{who} failed: {_short(text[len(prefix) + 2 :])}."
    return _short(text)


def raw_differs(error: Any) -> bool:
    """Whether the raw error says more than its sentence (then the page offers it)."""
    raw = str(error or "").strip()
    return bool(raw) and sentence(raw) != raw


def deliveries(item: dict[str, Any]) -> list[dict[str, str]]:
    """What of the item's reply went out and what did not: rows of `state` (sent, not sent,
    unknown, not delivered), `what` (which part) and `text`, in the order a person reads them."""
    rows: list[dict[str, str]] = []
    reason = str(item.get("reason") or "")
    given = item.get("parts_sent")
    sent: dict[str, Any] = given if isinstance(given, dict) else {}
    total = int(item.get("parts_total") or 0)
    reply = item.get("reply")
    if isinstance(reply, str) and reply:
        went = sorted(int(i) + 1 for i, wamid in sent.items() if str(i).isdigit() and wamid)
        if went:
            parts = ", ".join(str(p) for p in went)
            what = f"part {parts} of {total}" if total > 1 else "the reply"
            rows.append({"state": "sent", "what": what, "text": ""})
        rest = "the rest of the reply" if went else "the reply"
        if reason == "window_closed":
            rows.append(
                {"state": "not sent", "what": f"{rest} (24-hour window closed)", "text": reply}
            )
        elif reason != "delivery_unknown":
            rows.append({"state": "written, not sent", "what": rest, "text": reply})
    unknown = item.get("delivery_unknown")
    if isinstance(unknown, dict):
        at = int(unknown.get("at_ms") or 0)
        rows.append(
            {
                "state": "unknown",
                "what": f"{describe(unknown)}, sent {utc(at) if at else 'at an unknown time'}: "
                f"{sentence(unknown.get('error')) or 'no answer'} It is not sent again.",
                "text": str(unknown.get("text") or ""),
            }
        )
    late = item.get("late_failure")
    if isinstance(late, dict):
        for part in late.get("parts") or []:
            if not isinstance(part, dict):
                continue
            code = part.get("code")
            words = META_CODES.get(code, "") if isinstance(code, int) else ""
            title = str(part.get("title") or words or "no reason given")
            details = str(part.get("details") or "")
            number = int(part.get("part") or 0) + 1
            rows.append(
                {
                    "state": "not delivered",
                    "what": f"part {number}: Meta reported error {code} ({title})"
                    + (f": {_short(details)}" if details else ""),
                    "text": str(part.get("text") or ""),
                }
            )
        if late.get("template"):
            rows.append(
                {"state": "sent", "what": f"template {late['template']} in its place", "text": ""}
            )
    return rows
