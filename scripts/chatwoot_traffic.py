"""The Chatwoot part of `scripts/simulate`: signed `message_created` bursts, and their replies.

Each burst is one Chatwoot conversation (a fresh conversation id per burst, so nothing of an
earlier run mixes in) in inbox 3 of account 1, tenant `cw-1-3`: 3-4 incoming lines with human
gaps, signed as Chatwoot signs (`X-Chatwoot-Signature` over `"{timestamp}.{body}"`), or with
`?token=` when only a webhook token is known; one line of the first burst is delivered twice
with a new `X-Chatwoot-Delivery` (Chatwoot's known duplicate bug: the same message id).

The replies are read from the Chatwoot API stand-in (`GET /_requests`): the public outgoing
message created in the burst's conversation, and the stand-in's `message_created` webhook
posting that reply back to the receiver (the bot's own message, `message_type: outgoing`).
That echo must get a 200 and never be stored: its dedupe marker must not exist in Redis, and
no second turn may follow. The turn a reply came from is read from its outbound record
(shared/ops/outbound.py). Only 127.0.0.1 is ever a target.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from scripts.traffic import Tally, answers_200, fleet_counters, post_until_taken, summary_line
from scripts.webhooks import chatwoot_headers, message_created
from shared.chatwoot import tenant_id
from shared.keys import Keys
from shared.ops import markers, outbound

ACCOUNT = 1
INBOX = 3  # the stand-in's default inbox: its echoes name it
TENANT = tenant_id(ACCOUNT, INBOX)
PEOPLE = ("Valentina Ríos", "Tomás Acosta", "Camila Duarte", "Jorge Medina")
BURSTS = (
    ("hola", "les escribo por la web", "¿hacen envíos a Córdoba?"),
    ("buenas tardes", "compré ayer", "todavía no me llegó el mail", "pedido 4512"),
    ("hi", "is the 20% discount still on?", "for shoes too?"),
    ("hola!", "quiero cambiar un talle", "me queda chico", "¿cómo hago?"),
)
GAP_S = (0.3, 1.5)
ECHO_WAIT_S = (
    20.0  # after a reply: how long the stand-in's webhook and the outbound record may take
)


@dataclass(eq=False)
class CreatedReply:
    """A public outgoing message the bot created in a simulated conversation."""

    id: int
    text: str
    at_s: float = field(default_factory=time.monotonic)
    batch_id: str | None = None  # from the outbound record: the turn that sent it
    echo_status: int | None = None  # the receiver's answer to the stand-in's webhook of it
    echo_error: str | None = None
    echo_stored: bool | None = None  # its dedupe marker exists in Redis (must stay False)

    @property
    def checked(self) -> bool:
        return self.echo_stored is not None and self.batch_id is not None

    @property
    def ok(self) -> bool:
        return self.echo_status == 200 and self.echo_stored is False


@dataclass(eq=False)
class ChatwootBurst:
    number: int
    conversation: int
    name: str
    lines: tuple[str, ...]
    duplicate_at: int | None
    message_ids: list[int] = field(default_factory=list)
    last_sent_s: float | None = None
    replies: list[CreatedReply] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    reported: int = 0  # replies already printed

    @property
    def complete(self) -> bool:
        return self.last_sent_s is not None and bool(self.replies)

    @property
    def settled(self) -> bool:
        """Every reply's echo was answered and looked up in Redis (or waited long enough)."""
        return all(r.checked or time.monotonic() - r.at_s > ECHO_WAIT_S for r in self.replies)

    @property
    def ok(self) -> bool:
        return (
            self.complete
            and len(self.replies) == 1
            and self.replies[0].ok
            and self.replies[0].batch_id is not None
            and not self.problems
        )


class ChatwootTraffic:
    """Sends the Chatwoot bursts of a simulation and follows their replies at the stand-in."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        redis: Any,
        keys: Keys,
        *,
        url: str,
        standin_url: str,
        secret: str | None,
        token: str | None,
        rng: random.Random,
        say: Callable[[str], None],
        replied: asyncio.Event,
    ) -> None:
        self.http, self.redis, self.keys = http, redis, keys
        self.url, self.standin_url = url, standin_url
        self.secret, self.token = secret, token
        self.rng, self.say, self.replied = rng, say, replied
        self.tally = Tally()
        self.bursts: list[ChatwootBurst] = []
        self.by_conversation: dict[int, ChatwootBurst] = {}
        self.handled: set[int] = set()  # created message ids already taken (or not this run's)
        self.echoes: list[CreatedReply] = []  # replies whose echo is still awaited
        # Fresh ids per run: conversations from the clock (8 digits), messages from the ms clock.
        self.conversation_base = int(time.time()) % 100_000 * 1000
        self.message_ids = iter(range(int(time.time() * 1000) * 100, 2**53))
        self.counters_before: dict[str, int] = {}

    # --- start ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Forget what the stand-in did before this run; take the tenant's counters."""
        data = await self.standin_get("/_requests")
        for record in data.get("requests") or ():
            if isinstance(created := record.get("created"), dict):
                self.handled.add(int(created["id"]))
        self.counters_before = await fleet_counters(self.redis, self.keys, [TENANT])

    async def standin_get(self, path: str) -> Any:
        response = await self.http.get(f"{self.standin_url}{path}")
        response.raise_for_status()
        return orjson.loads(response.content)

    async def standin_ready(self) -> bool:
        problem = await answers_200(self.http, f"{self.standin_url}/_health")
        if problem is not None:
            self.say(f"the Chatwoot API stand-in at {self.standin_url} is not up ({problem})")
        return problem is None

    # --- sending --------------------------------------------------------------------------
    def plan(self, size: int) -> list[ChatwootBurst]:
        planned = []
        for _ in range(size):
            number = len(self.bursts) + 1
            lines = BURSTS[(number - 1) % len(BURSTS)]
            burst = ChatwootBurst(
                number=number,
                conversation=self.conversation_base + number,
                name=PEOPLE[(number - 1) % len(PEOPLE)],
                lines=lines,
                duplicate_at=self.rng.randrange(len(lines)) if number == 1 else None,
            )
            self.bursts.append(burst)
            self.by_conversation[burst.conversation] = burst
            planned.append(burst)
        return planned

    async def send_burst(self, burst: ChatwootBurst) -> None:
        await asyncio.sleep(self.rng.uniform(0.0, 1.0))
        who = f"chatwoot conversation {burst.conversation} ({burst.name.split()[0]})"
        for i, text in enumerate(burst.lines):
            if i:
                await asyncio.sleep(self.rng.uniform(*GAP_S))
            message_id = next(self.message_ids)
            burst.message_ids.append(message_id)
            self.tally.messages += 1
            body = orjson.dumps(
                message_created(
                    message_id=message_id,
                    content=text,
                    conversation=burst.conversation,
                    account=ACCOUNT,
                    inbox=INBOX,
                    sender_name=burst.name,
                )
            )
            self.say(f"{who} -> tenant {TENANT}: {_quoted(text)}")
            await self.deliver(body, burst)
            if i == burst.duplicate_at:
                await asyncio.sleep(self.rng.uniform(0.05, 0.3))
                self.say(
                    f"{who}: {_quoted(text)} delivered twice, with a new X-Chatwoot-Delivery "
                    "(Chatwoot's duplicate bug: must count once)"
                )
                self.tally.duplicates_sent += 1
                await self.deliver(body, burst)
        burst.last_sent_s = time.monotonic()

    async def deliver(self, body: bytes, burst: ChatwootBurst) -> None:
        """POST like Chatwoot: signed (or with the URL token), retried while not 200; a fresh
        delivery id and timestamp per POST (the signature covers the timestamp)."""
        url = f"{self.url}/webhooks/chatwoot"
        detail = await post_until_taken(
            self.http,
            url,
            body,
            lambda: chatwoot_headers(body, self.secret),
            self.tally,
            params={"token": self.token} if self.token and not self.secret else None,
            refused_hint="is --chatwoot-secret the receiver's CHATWOOT_WEBHOOK_SECRET?",
        )
        if detail is not None:
            burst.problems.append(f"delivery failed: {detail}")
            self.say(f"delivery to {url} failed: {detail}")

    # --- replies --------------------------------------------------------------------------
    async def poll(self) -> None:
        """New replies at the stand-in, their echoes, and their outbound records in Redis."""
        data = await self.standin_get("/_requests")
        for record in data.get("requests") or ():
            created = record.get("created")
            if record.get("status") != 200 or not isinstance(created, dict):
                continue
            message_id = int(created["id"])
            if message_id in self.handled:
                continue
            self.handled.add(message_id)
            burst = self.by_conversation.get(int(created["conversation"]))
            if burst is None or created.get("private"):
                continue  # another conversation's, or a hand-over note (the review list has it)
            reply = CreatedReply(id=message_id, text=str(created.get("content", "")))
            burst.replies.append(reply)
            self.echoes.append(reply)
            self.replied.set()
        deliveries = {int(w["message_id"]): w for w in data.get("webhooks") or ()}
        for reply in list(self.echoes):
            await self.check_echo(reply, deliveries.get(reply.id))
        for burst in self.bursts:
            self.report(burst)

    async def check_echo(self, reply: CreatedReply, delivery: dict[str, Any] | None) -> None:
        tenant = self.keys.tenant(TENANT)
        if reply.batch_id is None:
            (record,) = await outbound.records(self.redis, tenant, [str(reply.id)])
            reply.batch_id = record.get("batch") or None
        if delivery is not None and reply.echo_stored is None:
            reply.echo_status = delivery.get("response_status")
            reply.echo_error = delivery.get("error")
            (marked,) = await markers.marked(self.redis, tenant, [f"chatwoot:{reply.id}"])
            reply.echo_stored = marked
        if reply.checked:
            self.echoes.remove(reply)

    def report(self, burst: ChatwootBurst) -> None:
        """Print each reply once its echo and turn are known (or waited for long enough)."""
        while burst.reported < len(burst.replies):
            reply = burst.replies[burst.reported]
            if not reply.checked and time.monotonic() - reply.at_s <= ECHO_WAIT_S:
                return
            burst.reported += 1
            who, n = f"chatwoot conversation {burst.conversation}", len(burst.message_ids)
            turn = reply.batch_id or "(no outbound record)"
            if burst.reported > 1:
                self.say(
                    f"WARNING {who} got reply #{burst.reported} (turn {turn}): "
                    f"{_quoted(reply.text)}"
                )
                continue
            after = ""
            if burst.last_sent_s is not None:
                after = f" {reply.at_s - burst.last_sent_s:.1f}s after the last line"
            self.say(
                f"{who} sent {n} messages -> turn {turn} -> 1 reply (message {reply.id}){after}: "
                f"{_quoted(reply.text)} ({self.echo_text(reply)})"
            )

    @staticmethod
    def echo_text(reply: CreatedReply) -> str:
        if reply.echo_stored is None:
            return f"WARNING: its echo webhook did not come back within {ECHO_WAIT_S:g}s"
        if reply.echo_stored:
            return "WARNING: its echo webhook was STORED as a customer message"
        if reply.echo_status != 200:
            why = reply.echo_error or f"HTTP {reply.echo_status}"
            return f"WARNING: its echo webhook got {why}"
        return "echoed back as an outgoing message_created: 200, not stored"

    # --- the end --------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return all(b.complete for b in self.bursts)

    @property
    def settled(self) -> bool:
        return all(b.settled for b in self.bursts)

    def failures(self, timeout_s: float) -> list[str]:
        found = []
        for burst in self.bursts:
            if burst.ok:
                continue
            if burst.problems:
                problem = "; ".join(dict.fromkeys(burst.problems))
            elif not burst.replies:
                problem = f"no reply within {timeout_s:g}s"
            elif len(burst.replies) > 1:
                problem = f"{len(burst.replies)} replies instead of one"
            elif burst.replies[0].batch_id is None:
                problem = "the reply has no outbound record in Redis"
            else:
                problem = self.echo_text(burst.replies[0]).removeprefix("WARNING: ")
            found.append(
                f"chatwoot burst {burst.number} (conversation {burst.conversation}): {problem}"
            )
        return found

    async def summary(self) -> str:
        after = await fleet_counters(self.redis, self.keys, [TENANT])
        replies = [r for b in self.bursts for r in b.replies]
        echoed = [r for r in replies if r.echo_status is not None]
        taken = sum(r.echo_status == 200 for r in echoed)
        stored = sum(bool(r.echo_stored) for r in echoed)
        line = summary_line(self.tally, self.counters_before, after, len(self.bursts), "Chatwoot")
        return line.replace(
            "; Redis:",
            f"; the stand-in posted {len(echoed)} of the bot's replies back: {taken} answered "
            f"200, {stored} stored; Redis:",
        )


def _quoted(text: str, limit: int = 160) -> str:
    flat = " / ".join(part.strip() for part in text.splitlines() if part.strip())
    return f'"{flat[: limit - 1]}…"' if len(flat) > limit else f'"{flat}"'
