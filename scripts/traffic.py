"""Signed WhatsApp webhook traffic for a receiver on this machine: the tenants, the bodies
Meta sends (messages and statuses), delivery with Meta's retries, and the counts a run is
summarised by (the receiver's answer headers, the tenants' counters in Redis).

Used by scripts/simulate.py (the narrated simulation) and scripts/load_traffic.py (the load
generator). Only 127.0.0.1 is ever a target.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from scripts.webhooks import inbound_webhook, meta_headers, text_message, whatsapp_webhook
from shared.keys import Keys


@dataclass(frozen=True)
class Tenant:
    phone_number_id: str
    display_phone_number: str
    waba_id: str


@dataclass(frozen=True)
class Person:
    wa_id: str
    name: str


TENANTS = (
    Tenant("106500000000001", "15550001001", "102200000000001"),
    Tenant("106500000000002", "15550001002", "102200000000002"),
    Tenant("106500000000003", "15550001003", "102200000000003"),
)
TENANT_IDS = tuple(t.phone_number_id for t in TENANTS)
MAX_RATE = 2000.0  # messages per second: a load generator, not a flood
MAX_DURATION_S = 3600.0
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def loopback_only(url: str) -> str | None:
    """Why `url` may not be used (traffic goes to this machine only), or None if it may."""
    host = httpx.URL(url).host
    if host not in LOOPBACK:
        return f"{url}: only 127.0.0.1 is allowed (this tool sends traffic only to this machine)"
    return None


def webhook_body(tenant: Tenant, person: Person, message_id: str, text: str) -> bytes:
    """One inbound text message exactly as Meta's Cloud API delivers it."""
    return orjson.dumps(
        inbound_webhook(
            tenant.phone_number_id,
            person.wa_id,
            [text_message(message_id, text, person.wa_id)],
            name=person.name,
            display_phone_number=tenant.display_phone_number,
            waba_id=tenant.waba_id,
        )
    )


def status_body(tenant: Tenant, recipient: str, wamid: str, status: str) -> bytes:
    """A status webhook for one of our outbound messages, as Meta sends it."""
    entry_status = {
        "id": wamid,
        "status": status,
        "timestamp": str(int(time.time())),
        "recipient_id": recipient,
    }
    return orjson.dumps(
        whatsapp_webhook(
            {"statuses": [entry_status]},
            phone_number_id=tenant.phone_number_id,
            display_phone_number=tenant.display_phone_number,
            waba_id=tenant.waba_id,
        )
    )


@dataclass
class Tally:
    """What this run sent, and what the receiver's 200 answers said it did with it."""

    messages: int = 0  # distinct messages
    duplicates_sent: int = 0  # the same delivery again
    statuses_sent: int = 0
    stored: int = 0  # x-stored
    dropped: int = 0  # x-duplicates
    failed: int = 0  # deliveries that never got a 200
    latencies_s: list[float] = field(default_factory=list)

    def took(self, response: httpx.Response, seconds: float) -> None:
        self.latencies_s.append(seconds)
        self.stored += int(response.headers.get("x-stored", 0))
        self.dropped += int(response.headers.get("x-duplicates", 0))


# Counters of the tenants' stats hashes the summary reports (their change during the run).
FLEET_COUNTERS = ("messages", "turns", "replies", "retries", "statuses")


async def fleet_counters(redis: Any, keys: Keys, tenants: Sequence[str]) -> dict[str, int]:
    """The simulated tenants' counters summed, plus the size of their review lists."""
    totals = dict.fromkeys((*FLEET_COUNTERS, "review"), 0)
    for tenant in tenants:
        k = keys.tenant(tenant)
        stats = await redis.hgetall(k.stats)
        for name in FLEET_COUNTERS:
            totals[name] += int(stats.get(name.encode(), 0))
        totals["review"] += int(await redis.hlen(k.review))
    return totals


def summary_line(
    tally: Tally,
    before: dict[str, int],
    after: dict[str, int],
    bursts: int,
    provider: str | None = None,
) -> str:
    """What was sent, what the receiver did with it, and what the fleet did (Redis). WhatsApp's
    line is `summary: ...` (with the statuses sent); another provider's `summary (name): ...`."""
    fleet = {name: after[name] - before[name] for name in after}
    head = "summary:" if provider is None else f"summary ({provider}):"
    statuses = f", {tally.statuses_sent} statuses" if provider is None else ""
    return (
        f"{head} sent {tally.messages} messages in {bursts} bursts "
        f"(+{tally.duplicates_sent} duplicate deliveries{statuses}); "
        f"receiver stored {tally.stored}, dropped {tally.dropped} duplicates"
        f"{f', {tally.failed} deliveries failed' if tally.failed else ''}; "
        f"Redis: {fleet['messages']} messages in, {fleet['turns']} turns, "
        f"{fleet['replies']} replies, {fleet['retries']} retries, "
        f"{fleet['review']} new review items"
    )


async def post_webhook(
    http: httpx.AsyncClient, url: str, secret: str, body: bytes, tally: Tally, attempts: int = 4
) -> str | None:
    """POST like Meta does: signed raw bytes to the receiver at `url`, retried while the answer
    is not 200. None when the receiver took it (its counts go to `tally`), else what went
    wrong."""
    return await post_until_taken(
        http,
        f"{url}/webhooks/whatsapp",
        body,
        lambda: meta_headers(secret, body),
        tally,
        attempts=attempts,
        refused_hint="is --secret the receiver's WHATSAPP_APP_SECRET?",
    )


async def post_until_taken(
    http: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Callable[[], Mapping[str, str]],
    tally: Tally,
    *,
    attempts: int = 4,
    params: Mapping[str, str] | None = None,
    refused_hint: str,
) -> str | None:
    """POST `body` as a provider does, retried with backoff (0.5, 1, 2 s) while the answer is
    not 200; `headers()` is called per attempt (a provider signs each delivery afresh). None
    when the receiver took it (its counts go to `tally`), else what went wrong; a 401/403 is
    not retried, and says `refused_hint`."""
    detail = ""
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(0.5 * 2 ** (attempt - 1))
        try:
            started = time.monotonic()
            response = await http.post(url, content=body, headers=headers(), params=params)
        except httpx.HTTPError as exc:
            detail = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code == 200:
            tally.took(response, time.monotonic() - started)
            return None
        detail = f"HTTP {response.status_code} {response.text[:120]!r}"
        if response.status_code in (401, 403):
            detail += f" ({refused_hint})"
            break
    tally.failed += 1
    return detail


async def answers_200(http: httpx.AsyncClient, url: str, timeout_s: float = 15.0) -> str | None:
    """Poll GET `url` until it answers 200 (a service coming up): None, or after `timeout_s`
    what it answered last."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = await http.get(url)
            if response.status_code == 200:
                return None
            detail = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            detail = type(exc).__name__
        if time.monotonic() > deadline:
            return detail
        await asyncio.sleep(0.25)
