"""Simulated WhatsApp traffic: realistic, signed webhooks, and the replies they turned into.

Every ~10 s two or three people write to one of three businesses (tenants) in bursts of 3-4
lines, 0.3-1.5 s apart, as people do on WhatsApp; in each round one delivery arrives twice, as
Meta's sometimes do, and a status webhook or two is delivered again, late (taken in again and
changing nothing: a status has no dedupe marker).
Meanwhile it watches the replies and prints each one next to the burst it answers, so one sees
four lines become one reply. Where it finds them:

- `--graph-url URL` (what `scripts/run` passes): the workers send through the WhatsApp sender to
  the local Graph API stand-in, which posts signed `sent`/`delivered`/`read` status webhooks
  back to the receiver, as Meta does. The simulation reads the stand-in's record
  (`GET /_requests`): the read receipt a turn starts with names the last message of the batch
  it answers, which identifies the burst; the text sent to that person after it is the reply.
  It prints the reply once the worker recorded its statuses (the outbound record in Redis).
- otherwise: the tenants' Redis outbox lists (`SENDER=outbox`), whose entries list the ids of
  the messages they answer.

With `--chatwoot-url URL` (the Chatwoot API stand-in, which `scripts/run` passes) each round
also has one Chatwoot burst, signed `message_created` webhooks of a fresh conversation
(scripts/chatwoot_traffic.py): its reply is read at the stand-in, and so is the stand-in's
webhook posting that reply back, which the receiver must answer 200 and not store.
`--provider whatsapp|chatwoot|both` picks whose bursts are sent (default: both with the
stand-in).

At the end (`--bursts N`, or Ctrl-C) it prints a summary: what it sent, what the receiver
stored and dropped as duplicates (its `x-stored` / `x-duplicates` answer headers), and what the
fleet did, read from the tenants' counters in Redis (messages taken in, turns, replies, review
items) as the difference between the start and the end of the run.

`scripts/run` starts it; it also runs alone against a running receiver:

    scripts/simulate --url http://127.0.0.1:8000 --secret dev-secret \\
        --redis-url redis://127.0.0.1:6390/0 --bursts 3 [--graph-url http://127.0.0.1:8081]

With `--bursts N` it sends N bursts, waits for their replies (at most `--timeout` seconds
after the last message) and exits 0 only if every burst became exactly one reply (and, through
the stand-in, that reply's statuses came back as far as `read`).

With `--rate R --duration S` it is a load generator instead (scripts/load_traffic.py): R
messages per second for S seconds, in bursts from fresh people, one progress line a second,
then the same summary. It only ever sends to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from scripts.chatwoot_traffic import ChatwootTraffic
from scripts.load_traffic import LoadGenerator
from scripts.traffic import (
    MAX_DURATION_S,
    MAX_RATE,
    TENANT_IDS,
    TENANTS,
    Person,
    Tally,
    Tenant,
    answers_200,
    fleet_counters,
    loopback_only,
    post_webhook,
    status_body,
    summary_line,
    webhook_body,
)
from shared.keys import Keys
from shared.ops import outbound

PEOPLE = (
    Person("5491155550001", "Ana Pérez"),
    Person("5491155550002", "Martín Gómez"),
    Person("14155550123", "Emily Clark"),
    Person("5491155550003", "Lucía Fernández"),
    Person("447700900123", "Oliver Smith"),
    Person("5491155550004", "Diego Ruiz"),
    Person("5215555550005", "Sofía Herrera"),
)
BURSTS = (
    ("hola", "una consulta", "¿tienen turno el sábado?", "a la tarde"),
    ("buenas!", "quería saber el precio del corte", "y si hacen color también"),
    ("hi", "quick question", "do you deliver to Palermo?", "today if possible"),
    ("hola, cómo va?", "ayer dejé una campera", "negra, talle M", "¿la tienen ahí?"),
    ("hello", "I booked for tomorrow at 5", "can I move it to 6?"),
    ("buen día", "¿hasta qué hora abren hoy?", "voy en auto, ¿hay estacionamiento?"),
    ("good morning", "is the shop open on Sunday?", "and until what time?", "thanks!"),
    ("hola", "me pasás la dirección?", "gracias!!"),
)
ROUND_INTERVAL_S = 10.0
GAP_S = (0.3, 1.5)
POLL_INTERVAL_S = 0.5
PAGE = 100
EXTRA_REPLY_GRACE_S = 2.0
GIVE_UP_S = 60.0
STATUS_WAIT_S = 20.0  # after a reply went to the stand-in: how long its statuses may take
STATUS_RANK = {"accepted": 0, "sent": 1, "delivered": 2, "read": 3, "played": 4, "failed": 5}
FINAL_STATUSES = frozenset({"read", "played", "failed"})
STATUS_REPEATS = 2  # late duplicate status webhooks per run (through the stand-in)
PROVIDERS = ("whatsapp", "chatwoot", "both")
DEV_CHATWOOT_SECRET = "dev-chatwoot-secret"  # scripts/run's dev default


@dataclass(eq=False)  # identity: the same reply may be counted once in a set
class Reply:
    batch_id: str
    text: str
    message_ids: tuple[str, ...]
    wamid: str | None = None  # through the stand-in: Meta's id, which statuses are reported by
    tenant: str = ""
    at_s: float = field(default_factory=time.monotonic)
    status: str | None = None  # the outbound record's status in Redis (stand-in only)
    statuses: tuple[str, ...] = ()  # statuses the stand-in posted and the receiver took (200)
    reported: bool = False

    @property
    def settled(self) -> bool:
        """Outbox replies have no statuses; stand-in replies wait for a final one (or time)."""
        if self.wamid is None or self.reported:
            return True
        return self.status in FINAL_STATUSES

    @property
    def read(self) -> bool:
        return self.wamid is None or self.status in ("read", "played")


@dataclass(eq=False)  # identity: a burst is a key in dicts and sets
class Burst:
    number: int
    tenant: Tenant
    person: Person
    lines: tuple[str, ...]
    duplicate_at: int | None
    message_ids: list[str] = field(default_factory=list)
    last_sent_s: float | None = None
    replies: list[Reply] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    missing_reported: bool = False
    receipts: list[str] = field(default_factory=list)  # message ids read receipts named

    @property
    def sent(self) -> bool:
        return self.last_sent_s is not None

    @property
    def complete(self) -> bool:
        return self.sent and self.answered >= set(self.message_ids)

    @property
    def ok(self) -> bool:
        read = all(r.read for r in self.replies)
        return self.complete and self.one_reply_per_message and read and not self.problems

    @property
    def one_reply_per_message(self) -> bool:
        """One reply, listing each message once (a listed duplicate would mean no dedupe)."""
        return len(self.replies) == 1 and len(self.replies[0].message_ids) == len(self.message_ids)


@dataclass(frozen=True)
class Options:
    url: str
    secret: str
    redis_url: str
    key_prefix: str
    bursts: int | None
    interval_s: float
    timeout_s: float
    seed: int | None
    graph_url: str | None = None
    rate: float | None = None  # load generator: messages per second...
    duration_s: float | None = None  # ...for this long
    provider: str = "whatsapp"  # whatsapp, chatwoot or both
    chatwoot_url: str | None = None  # the Chatwoot API stand-in
    chatwoot_secret: str | None = None  # signs the Chatwoot webhooks...
    chatwoot_token: str | None = None  # ...or, without a secret, the URL carries this token

    @property
    def whatsapp(self) -> bool:
        return self.provider in ("whatsapp", "both")

    @property
    def chatwoot(self) -> bool:
        return self.provider in ("chatwoot", "both")

    @property
    def load(self) -> bool:
        return self.rate is not None


def parse_options(argv: Sequence[str]) -> Options:
    secret = os.environ.get("WHATSAPP_APP_SECRET", "").split(",")[0].strip() or "dev-secret"
    parser = argparse.ArgumentParser(
        description="Signed WhatsApp bursts to a receiver, and the replies they turned into."
    )
    port = os.environ.get("PORT") or "8000"
    parser.add_argument("--url", default=f"http://127.0.0.1:{port}", help="the receiver")
    parser.add_argument(
        "--secret",
        default=secret,
        help="the receiver's WHATSAPP_APP_SECRET (default: $WHATSAPP_APP_SECRET or dev-secret)",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6390/0",
        help="the Redis the workers write their outbox to",
    )
    parser.add_argument("--key-prefix", default=os.environ.get("KEY_PREFIX") or "wa")
    parser.add_argument("--bursts", type=int, help="send N bursts, check the replies, exit")
    parser.add_argument("--interval", type=float, default=ROUND_INTERVAL_S, help="s per round")
    parser.add_argument(
        "--timeout", type=float, default=GIVE_UP_S, help="s to wait for replies (--bursts)"
    )
    parser.add_argument("--seed", type=int, help="for a reproducible sequence")
    parser.add_argument(
        "--graph-url",
        help="the Graph API stand-in the workers send to: read the replies there "
        "(default: read the Redis outbox)",
    )
    parser.add_argument(
        "--rate", type=float, help=f"load generator: messages per second (at most {MAX_RATE:g})"
    )
    parser.add_argument(
        "--duration",
        type=float,
        help=f"load generator: seconds to send for (with --rate; at most {MAX_DURATION_S:g})",
    )
    parser.add_argument(
        "--chatwoot-url",
        help="the Chatwoot API stand-in the workers reply through (scripts/run starts one): "
        "Chatwoot bursts too, their replies read there",
    )
    parser.add_argument(
        "--provider",
        choices=PROVIDERS,
        help="whose webhooks to send (default: both with --chatwoot-url, else whatsapp)",
    )
    parser.add_argument(
        "--chatwoot-secret",
        default=first(os.environ.get("CHATWOOT_WEBHOOK_SECRET")),
        help="the receiver's CHATWOOT_WEBHOOK_SECRET (default: $CHATWOOT_WEBHOOK_SECRET, or "
        f"{DEV_CHATWOOT_SECRET} without $CHATWOOT_WEBHOOK_TOKEN)",
    )
    parser.add_argument(
        "--chatwoot-token",
        default=first(os.environ.get("CHATWOOT_WEBHOOK_TOKEN")),
        help="without a secret: the receiver's CHATWOOT_WEBHOOK_TOKEN, sent as ?token=",
    )
    args = parser.parse_args(argv)
    if args.bursts is not None and args.bursts < 1:
        parser.error("--bursts must be at least 1")
    if (args.rate is None) != (args.duration is None):
        parser.error("--rate and --duration go together")
    if args.rate is not None:
        if not 0 < args.rate <= MAX_RATE:
            parser.error(f"--rate must be more than 0 and at most {MAX_RATE:g}")
        if not 0 < args.duration <= MAX_DURATION_S:
            parser.error(f"--duration must be more than 0 and at most {MAX_DURATION_S:g}")
        if args.bursts is not None:
            parser.error("--bursts is for the narrated simulation; drop it with --rate")
    provider = args.provider or ("both" if args.chatwoot_url else "whatsapp")
    if provider != "whatsapp" and not args.chatwoot_url:
        parser.error(
            f"--provider {provider} needs --chatwoot-url (the Chatwoot API stand-in, which "
            "scripts/run starts): the replies are read there"
        )
    if args.rate is not None and provider != "whatsapp":
        parser.error("the load generator (--rate) sends WhatsApp traffic only: --provider whatsapp")
    chatwoot_secret = args.chatwoot_secret
    if not chatwoot_secret and not args.chatwoot_token:
        chatwoot_secret = DEV_CHATWOOT_SECRET
    for url in (args.url, args.redis_url, args.graph_url, args.chatwoot_url):
        if url and (problem := loopback_only(url)):
            parser.error(problem)
    return Options(
        url=args.url.rstrip("/"),
        secret=args.secret,
        redis_url=args.redis_url,
        key_prefix=args.key_prefix,
        bursts=args.bursts,
        interval_s=args.interval,
        timeout_s=args.timeout,
        seed=args.seed,
        graph_url=args.graph_url.rstrip("/") if args.graph_url else None,
        rate=args.rate,
        duration_s=args.duration,
        provider=provider,
        chatwoot_url=args.chatwoot_url.rstrip("/") if args.chatwoot_url else None,
        chatwoot_secret=chatwoot_secret or None,
        chatwoot_token=args.chatwoot_token or None,
    )


def first(value: str | None) -> str | None:
    """The first of a comma-separated list of secrets (the one in use during a rotation)."""
    return (value or "").split(",")[0].strip() or None


def say(text: str) -> None:
    print(f"[sim] {text}", flush=True)


def quoted(text: str, limit: int = 160) -> str:
    flat = " / ".join(part.strip() for part in text.splitlines() if part.strip())
    return f'"{flat[: limit - 1]}…"' if len(flat) > limit else f'"{flat}"'


def short(batch_id: str) -> str:
    return batch_id if len(batch_id) <= 16 else f"{batch_id[:13]}..."


def digits(number: str) -> str:
    return "".join(ch for ch in number if ch.isdigit())


def record_key(record: dict[str, Any]) -> str:
    """Identifies one of the stand-in's records across fetches (it has no id of its own)."""
    sent, read = record.get("sent"), record.get("read")
    if isinstance(sent, dict):
        return f"sent:{sent.get('wamid')}"
    if isinstance(read, dict):
        return f"read:{read.get('time')}:{read.get('message_id')}"
    return f"{record.get('time')}:{record.get('path')}:{record.get('status')}"


class Simulation:
    def __init__(self, options: Options, http: httpx.AsyncClient, redis: Any) -> None:
        self.options = options
        self.http = http
        self.redis = redis
        self.rng = random.Random(options.seed)
        self.keys = Keys(options.key_prefix)
        self.bursts: list[Burst] = []
        self.by_message: dict[str, Burst] = {}
        self.seen: set[bytes] = set()
        self.redis_failing = False
        self.replied = asyncio.Event()
        # Through the Graph API stand-in: its records already taken, how many it had, the burst
        # each conversation's last read receipt named, replies whose statuses are awaited.
        self.handled: set[str] = set()
        self.graph_count = -1
        self.turns: dict[tuple[str, str], Burst] = {}
        self.awaiting: list[Reply] = []
        self.burst_of: dict[Reply, Burst] = {}
        self.tally = Tally()
        self.counters_before: dict[str, int] = {}
        # Late status deliveries (the summary waits for them; the poller does not).
        self.repeats: set[asyncio.Task[None]] = set()
        self.chatwoot: ChatwootTraffic | None = None
        if options.chatwoot and options.chatwoot_url is not None:
            self.chatwoot = ChatwootTraffic(
                http,
                redis,
                self.keys,
                url=options.url,
                standin_url=options.chatwoot_url,
                secret=options.chatwoot_secret,
                token=options.chatwoot_token,
                rng=self.rng,
                say=say,
                replied=self.replied,
            )

    async def run(self) -> int:
        if not await self.receiver_ready():
            return 2
        graph = self.options.graph_url
        tails: list[asyncio.Task[None]] = []
        if self.options.whatsapp:
            try:
                if graph is None:
                    await self.skip_old_replies()
                elif await self.graph_ready():
                    await self.skip_old_graph_records()
                else:
                    return 2
                self.counters_before = await fleet_counters(self.redis, self.keys, TENANT_IDS)
            except RedisError as exc:
                say(f"cannot read the outbox at {self.options.redis_url}: {exc}")
                return 2
            except (httpx.HTTPError, ValueError) as exc:
                say(f"cannot read the Graph API stand-in at {graph}: {exc!r}")
                return 2
            tails.append(asyncio.create_task(self.tail() if graph is None else self.tail_graph()))
        if self.chatwoot is not None:
            if not await self.chatwoot.standin_ready():
                return 2
            try:
                await self.chatwoot.start()
            except (httpx.HTTPError, ValueError, KeyError, RedisError) as exc:
                say(f"cannot read the Chatwoot API stand-in or Redis: {exc!r}")
                return 2
            tails.append(asyncio.create_task(self.tail_chatwoot(self.chatwoot)))
        say(
            "people write in bursts of 3-4 lines; each burst should come back as ONE reply, "
            "a debounce window after its last line"
        )
        if graph is not None and self.options.whatsapp:
            say(
                f"replies go to the Graph API stand-in at {graph}, which reports them "
                "sent, delivered and read to the receiver, like Meta"
            )
        if self.chatwoot is not None:
            say(
                f"Chatwoot conversations are answered through the Chatwoot API stand-in at "
                f"{self.options.chatwoot_url}, which posts each reply back as an outgoing "
                "message_created webhook, like Chatwoot: the receiver must ignore it"
            )
        try:
            if self.options.bursts is None:
                try:
                    await self.send_rounds(None)
                finally:
                    await self.say_summary()  # on Ctrl-C too (a cancellation)
                return 0
            await self.send_rounds(self.options.bursts)
            return await self.verdict()
        finally:
            for tail in tails:
                tail.cancel()

    async def tail_chatwoot(self, chatwoot: ChatwootTraffic) -> None:
        failing = False
        while True:
            try:
                await chatwoot.poll()
                failing = False
            except (httpx.HTTPError, RedisError, ValueError, KeyError, TypeError) as exc:
                if not failing:
                    say(f"cannot read the Chatwoot replies: {exc!r} (retrying)")
                failing = True
            await asyncio.sleep(POLL_INTERVAL_S)

    async def receiver_ready(self) -> bool:
        problem = await answers_200(self.http, f"{self.options.url}/readyz")
        if problem is not None:
            say(f"the receiver at {self.options.url} is not ready ({problem})")
        return problem is None

    async def graph_ready(self) -> bool:
        problem = await answers_200(self.http, f"{self.options.graph_url}/_health")
        if problem is not None:
            say(f"the Graph API stand-in at {self.options.graph_url} is not up ({problem})")
        return problem is None

    # --- sending --------------------------------------------------------------------------
    async def send_rounds(self, total: int | None) -> None:
        sent = 0
        while total is None or sent < total:
            started = time.monotonic()
            self.report_missing()
            whatsapp = self.options.whatsapp
            size = self.rng.randint(2, 3) if whatsapp else self.rng.randint(1, 2)
            if total is not None:
                size = min(size, total - sent)
            # --bursts counts WhatsApp's bursts; with both, each round adds one Chatwoot burst.
            sends = []
            if whatsapp:
                round_ = self.plan_round(size)
                sends += [self.send_burst(b) for b in round_]
                size = len(round_)
            if self.chatwoot is not None:
                planned = self.chatwoot.plan(1 if whatsapp else size)
                sends += [self.chatwoot.send_burst(b) for b in planned]
            await asyncio.gather(*sends)
            sent += size
            if total is not None and sent >= total:
                return
            pause = self.options.interval_s * self.rng.uniform(0.9, 1.1)
            await asyncio.sleep(max(0.0, started + pause - time.monotonic()))

    def plan_round(self, size: int) -> list[Burst]:
        """People with no burst awaiting its reply, each writing to one of the two tenants."""
        waiting = {b.person for b in self.bursts if not b.complete and not self.given_up(b)}
        free = [p for p in PEOPLE if p not in waiting]
        people = self.rng.sample(free, min(size, len(free)))
        first_tenant = self.rng.randrange(len(TENANTS))
        duplicate_in = self.rng.randrange(len(people)) if people else -1
        scripts = self.rng.sample(BURSTS, len(people))
        round_ = []
        for i, (person, lines) in enumerate(zip(people, scripts, strict=True)):
            burst = Burst(
                number=len(self.bursts) + 1,
                tenant=TENANTS[(first_tenant + i) % len(TENANTS)],
                person=person,
                lines=lines,
                duplicate_at=self.rng.randrange(len(lines)) if i == duplicate_in else None,
            )
            self.bursts.append(burst)
            round_.append(burst)
        return round_

    def given_up(self, burst: Burst) -> bool:
        return burst.last_sent_s is not None and time.monotonic() - burst.last_sent_s > GIVE_UP_S

    def report_missing(self) -> None:
        for burst in self.bursts:
            if self.given_up(burst) and not burst.complete and not burst.missing_reported:
                burst.missing_reported = True
                n = len(burst.message_ids) - len(burst.answered)
                say(f"no reply after {GIVE_UP_S:g}s for {n} messages of {burst.person.wa_id}")

    async def send_burst(self, burst: Burst) -> None:
        await asyncio.sleep(self.rng.uniform(0.0, 1.0))  # people do not start in lockstep
        who = f"{burst.person.wa_id} ({burst.person.name.split()[0]})"
        for i, text in enumerate(burst.lines):
            if i:
                await asyncio.sleep(self.rng.uniform(*GAP_S))
            message_id = f"wamid.SIM{secrets.token_hex(10).upper()}"
            burst.message_ids.append(message_id)
            self.tally.messages += 1
            self.by_message[message_id] = burst
            body = webhook_body(burst.tenant, burst.person, message_id, text)
            say(f"{who} -> tenant {burst.tenant.phone_number_id}: {quoted(text)}")
            await self.deliver(body, burst)
            if i == burst.duplicate_at:
                await asyncio.sleep(self.rng.uniform(0.05, 0.3))
                say(f"{who}: {quoted(text)} delivered twice (a duplicate: must count once)")
                self.tally.duplicates_sent += 1
                await self.deliver(body, burst)
        burst.last_sent_s = time.monotonic()

    async def deliver(self, body: bytes, burst: Burst) -> None:
        detail = await post_webhook(
            self.http, self.options.url, self.options.secret, body, self.tally
        )
        if detail is not None:
            burst.problems.append(f"delivery failed: {detail}")
            say(f"delivery to {self.options.url} failed: {detail}")

    async def repeat_status(self, reply: Reply, burst: Burst) -> None:
        """Meta delivers statuses more than once, and out of order: a late `delivered` for a
        reply already read is a duplicate the receiver drops (and must never downgrade)."""
        if reply.wamid is None or self.tally.statuses_sent >= STATUS_REPEATS:
            return
        body = status_body(burst.tenant, burst.person.wa_id, reply.wamid, "delivered")
        say(f"{burst.person.wa_id}: a late 'delivered' for reply {short(reply.wamid)} (duplicate)")
        self.tally.statuses_sent += 1
        await self.deliver(body, burst)

    # --- replies --------------------------------------------------------------------------
    async def skip_old_replies(self) -> None:
        """Replies already in the outbox (earlier runs) are not this run's."""
        for tenant in TENANTS:
            key = self.keys.tenant(tenant.phone_number_id).outbox
            self.seen.update(await self.redis.lrange(key, 0, PAGE - 1))

    async def tail(self) -> None:
        while True:
            try:
                for tenant in TENANTS:
                    for raw in await self.new_replies(tenant):
                        self.on_reply(raw)
                self.redis_failing = False
            except RedisError as exc:
                if not self.redis_failing:
                    say(f"cannot read the outbox: {exc} (retrying)")
                self.redis_failing = True
            await asyncio.sleep(POLL_INTERVAL_S)

    async def new_replies(self, tenant: Tenant) -> list[bytes]:
        """Entries pushed since the last poll, oldest first (the sender LPUSHes: newest first)."""
        key = self.keys.tenant(tenant.phone_number_id).outbox
        fresh: list[bytes] = []
        start = 0
        while True:
            page = await self.redis.lrange(key, start, start + PAGE - 1)
            for raw in page:
                if raw in self.seen:
                    return fresh[::-1]
                fresh.append(raw)
            if len(page) < PAGE:
                return fresh[::-1]
            start += PAGE

    def on_reply(self, raw: bytes) -> None:
        self.seen.add(raw)
        try:
            entry = orjson.loads(raw)
            reply = Reply(
                batch_id=str(entry.get("batch_id", "?")),
                text=str(entry.get("text", "")),
                message_ids=tuple(str(i) for i in entry.get("message_ids") or ()),
            )
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            say(f"an outbox entry that is not a reply: {raw[:200]!r}")
            return
        known = [self.by_message[i] for i in reply.message_ids if i in self.by_message]
        bursts = list(dict.fromkeys(known))
        if not bursts:
            person = entry.get("person", "?")
            say(f"reply to {person} (batch {short(reply.batch_id)}): {quoted(reply.text)}")
            return
        for burst in bursts:
            burst.replies.append(reply)
            burst.answered.update(set(reply.message_ids) & set(burst.message_ids))
            self.report(burst, reply)
        self.replied.set()

    # --- replies through the Graph API stand-in ---------------------------------------------
    async def graph_get(self, path: str) -> Any:
        response = await self.http.get(f"{self.options.graph_url}{path}")
        response.raise_for_status()
        return orjson.loads(response.content)

    async def skip_old_graph_records(self) -> None:
        """What the stand-in recorded before this run started is not this run's."""
        data = await self.graph_get("/_requests")
        for record in data.get("requests") or ():
            if record.get("status") is not None:
                self.handled.add(record_key(record))

    async def tail_graph(self) -> None:
        failing = False
        while True:
            try:
                await self.poll_graph()
                failing = False
            except (httpx.HTTPError, RedisError, ValueError) as exc:
                if not failing:
                    say(f"cannot read the replies: {exc!r} (retrying)")
                failing = True
            await asyncio.sleep(POLL_INTERVAL_S)

    async def poll_graph(self) -> None:
        """New requests at the stand-in, and statuses of the replies that await them.

        The stand-in's record only grows: it is fetched when its size changed (`GET /_control`
        is cheap) or when a reply's statuses are to be shown (its webhook deliveries)."""
        state = await self.graph_get("/_control")
        due = await self.statuses_due()
        if int(state.get("requests", 0)) == self.graph_count and not due:
            return
        data = await self.graph_get("/_requests")
        records = data.get("requests") or []
        unfinished = False
        for record in records:
            if record.get("status") is None:
                unfinished = True  # still waiting for its answer: look again next time
            elif (key := record_key(record)) not in self.handled:
                self.handled.add(key)
                self.on_graph_record(record)
        self.graph_count = -1 if unfinished else len(records)
        for reply in due:
            self.report_statuses(reply, data.get("webhooks") or [])
            task = asyncio.create_task(self.repeat_status(reply, self.burst_of[reply]))
            self.repeats.add(task)

    async def statuses_due(self) -> list[Reply]:
        """Replies whose outbound record in Redis reached a final status, or that waited long
        enough; refreshes `reply.status` of each awaited reply."""
        due = []
        for reply in self.awaiting:
            assert reply.wamid is not None
            k = self.keys.tenant(reply.tenant)
            (record,) = await outbound.records(self.redis, k, [reply.wamid])
            reply.status = record.get("status")
            if record.get("batch"):  # the turn that sent it
                reply.batch_id = record["batch"]
            if reply.status in FINAL_STATUSES or time.monotonic() - reply.at_s > STATUS_WAIT_S:
                due.append(reply)
        return due

    def on_graph_record(self, record: dict[str, Any]) -> None:
        if record.get("status") != 200:
            kind, status = record.get("kind") or "request", record.get("status")
            detail = str(record.get("response"))[:200]
            say(f"the Graph API stand-in answered {status} to a {kind}: {detail}")
            return
        if isinstance(read := record.get("read"), dict):
            self.on_read_receipt(read)
        elif isinstance(sent := record.get("sent"), dict):
            self.on_graph_send(sent)

    def on_read_receipt(self, read: dict[str, Any]) -> None:
        """A turn starts with a read receipt naming the last message of its batch: which burst."""
        burst = self.by_message.get(str(read.get("message_id")))
        if burst is not None:
            self.turns[(str(read.get("phone_number_id")), burst.person.wa_id)] = burst
            burst.receipts.append(str(read.get("message_id")))

    def on_graph_send(self, sent: dict[str, Any]) -> None:
        tenant, person = str(sent.get("phone_number_id")), digits(str(sent.get("to")))
        payload = sent.get("payload") or {}
        text = (payload.get("text") or {}).get("body") or f"[{sent.get('type')}]"
        burst = self.turns.get((tenant, person))
        if burst is None:  # no read receipt (it is best effort): the person's latest burst
            mine = [
                b
                for b in self.bursts
                if b.message_ids and b.person.wa_id == person and b.tenant.phone_number_id == tenant
            ]
            burst = mine[-1] if mine else None
        if burst is None:
            say(f"reply to {person} (not this run's): {quoted(text)}")
            return
        upto = burst.message_ids.index(burst.receipts[-1]) if burst.receipts else None
        named = burst.message_ids if upto is None else burst.message_ids[: upto + 1]
        reply = Reply(
            batch_id=str(sent.get("wamid")),
            text=text,
            message_ids=tuple(m for m in named if m not in burst.answered),
            wamid=str(sent.get("wamid")),
            tenant=tenant,
        )
        burst.replies.append(reply)
        burst.answered.update(reply.message_ids)
        self.burst_of[reply] = burst
        self.awaiting.append(reply)
        if len(burst.replies) > 1 or not burst.complete:
            self.report(burst, reply)  # a problem shows at once; a good reply with its statuses
        self.replied.set()

    def report_statuses(self, reply: Reply, webhooks: list[dict[str, Any]]) -> None:
        taken = {
            str(w.get("status"))
            for w in webhooks
            if w.get("wamid") == reply.wamid and w.get("response_status") == 200
        }
        if reply.status is not None and reply.status != "accepted":
            taken.add(reply.status)  # recorded by the worker even if the stand-in lags
        reply.statuses = tuple(sorted(taken, key=lambda s: STATUS_RANK.get(s, 9)))
        reply.reported = True
        self.awaiting.remove(reply)
        burst = self.burst_of[reply]
        if burst.complete and burst.replies == [reply]:
            self.report(burst, reply)
        else:
            who, statuses = burst.person.wa_id, ", ".join(reply.statuses) or "no status"
            say(f"{who}: reply {short(str(reply.wamid))} was {statuses}")

    def report(self, burst: Burst, reply: Reply) -> None:
        who, n = burst.person.wa_id, len(burst.message_ids)
        batch, text = short(reply.batch_id), quoted(reply.text)
        if len(burst.replies) > 1:
            say(f"WARNING {who}'s burst got reply #{len(burst.replies)} (batch {batch}): {text}")
        elif burst.complete and not burst.one_reply_per_message:
            listed = len(reply.message_ids)
            say(f"WARNING {who}: the reply lists {listed} message ids for {n} messages: {text}")
        elif burst.complete and reply.wamid is not None:
            after = ""
            if burst.last_sent_s is not None:
                after = f" {reply.at_s - burst.last_sent_s:.1f}s after the last line"
            statuses = ", ".join(reply.statuses) or "no status"
            if not reply.read:
                statuses += f"; Redis has {reply.status or 'no status'} after {STATUS_WAIT_S:g}s"
                say(f"WARNING {who}: the reply's statuses did not come back as far as read")
            say(f"{who} sent {n} messages -> turn {batch} -> 1 reply{after}: {text} ({statuses})")
        elif burst.complete:
            after = ""
            if burst.last_sent_s is not None:
                after = f" {time.monotonic() - burst.last_sent_s:.1f}s after the last line"
            say(f"{who} sent {n} messages -> turn {batch} -> 1 reply{after}: {text}")
        else:
            covered = len(burst.answered)
            say(f"{who}: a reply (batch {batch}) covers {covered} of {n} messages so far: {text}")

    async def verdict(self) -> int:
        if await self.all_answered(self.options.timeout_s):
            await asyncio.sleep(EXTRA_REPLY_GRACE_S)  # a second reply would be a bug: catch it
            await self.all_settled(STATUS_WAIT_S + 2.0)
            if self.repeats:
                await asyncio.wait(self.repeats, timeout=10.0)
        summaries = []
        failed = [b for b in self.bursts if not b.ok]
        if self.options.whatsapp:
            messages = sum(len(b.message_ids) for b in self.bursts)
            duplicates = sum(b.duplicate_at is not None for b in self.bursts)
            replies = {r for b in self.bursts for r in b.replies}
            summary = (
                f"{len(self.bursts)} bursts, {messages} messages (+{duplicates} duplicate "
                f"deliver{'y' if duplicates == 1 else 'ies'}) -> {len(replies)} replies"
            )
            if self.options.graph_url is not None:
                read = sum(r.read for r in replies)
                summary += f" via the Graph API stand-in ({read} delivered and read)"
            summaries.append(summary)
        chatwoot_failed: list[str] = []
        total = len(self.bursts)
        if self.chatwoot is not None:
            cw = self.chatwoot
            messages = sum(len(b.message_ids) for b in cw.bursts)
            duplicates = sum(b.duplicate_at is not None for b in cw.bursts)
            replies_cw = [r for b in cw.bursts for r in b.replies]
            ignored = sum(r.ok for r in replies_cw)
            summaries.append(
                f"Chatwoot: {len(cw.bursts)} bursts, {messages} messages (+{duplicates} "
                f"duplicate deliver{'y' if duplicates == 1 else 'ies'}) -> {len(replies_cw)} "
                f"replies via the Chatwoot API stand-in ({ignored} echoed back and ignored)"
            )
            chatwoot_failed = cw.failures(self.options.timeout_s)
            total += len(cw.bursts)
        summary = "; ".join(summaries)
        await self.say_summary()
        if not failed and not chatwoot_failed:
            say(f"{summary}: every burst became exactly one reply")
            return 0
        for burst in failed:
            say(f"FAILED burst {burst.number} from {burst.person.wa_id}: {self.problem(burst)}")
        for problem in chatwoot_failed:
            say(f"FAILED {problem}")
        bad = len(failed) + len(chatwoot_failed)
        say(f"{summary}: {bad} of {total} bursts did not become one reply")
        return 1

    async def say_summary(self) -> None:
        try:
            if self.options.whatsapp:
                after = await asyncio.wait_for(
                    fleet_counters(self.redis, self.keys, TENANT_IDS), 5.0
                )
                say(summary_line(self.tally, self.counters_before, after, len(self.bursts)))
            if self.chatwoot is not None:
                say(await asyncio.wait_for(self.chatwoot.summary(), 5.0))
        except (RedisError, TimeoutError) as exc:
            say(f"cannot read the tenants' counters for the summary: {exc!r}")

    def chatwoot_pending(self, settled: bool = False) -> bool:
        if self.chatwoot is None:
            return False
        return not (self.chatwoot.settled if settled else self.chatwoot.complete)

    async def all_answered(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not all(b.complete for b in self.bursts) or self.chatwoot_pending():
            self.replied.clear()
            try:
                await asyncio.wait_for(self.replied.wait(), deadline - time.monotonic())
            except TimeoutError:
                return False
        return True

    async def all_settled(self, timeout_s: float) -> bool:
        """Every stand-in reply's statuses came back (or it waited STATUS_WAIT_S for them)."""
        deadline = time.monotonic() + timeout_s
        while not all(r.settled for b in self.bursts for r in b.replies) or self.chatwoot_pending(
            settled=True
        ):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_INTERVAL_S / 2)
        if self.chatwoot is not None:
            await self.chatwoot.poll()  # print what the last checks completed
        return True

    def problem(self, burst: Burst) -> str:
        if burst.problems:
            return "; ".join(dict.fromkeys(burst.problems))
        if not burst.replies:
            return f"no reply within {self.options.timeout_s:g}s"
        if not burst.complete:
            covered = len(burst.answered)
            return f"replies covered {covered} of {len(burst.message_ids)} messages"
        if len(burst.replies) > 1:
            return f"{len(burst.replies)} replies instead of one"
        unread = [r for r in burst.replies if not r.read]
        if unread:
            status = unread[0].status or "none recorded"
            return f"the reply's status in Redis is {status}, not read ({STATUS_WAIT_S:g}s)"
        listed = len(burst.replies[0].message_ids)
        return f"the reply lists {listed} message ids for {len(burst.message_ids)} messages"


async def run(options: Options) -> int:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    redis = Redis.from_url(options.redis_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        async with httpx.AsyncClient(timeout=10.0) as http:
            simulation = Simulation(options, http, redis)
            if not options.load:
                return await simulation.run()
            if not await simulation.receiver_ready():
                return 2
            assert options.rate is not None and options.duration_s is not None
            load = LoadGenerator(
                http,
                redis,
                url=options.url,
                secret=options.secret,
                key_prefix=options.key_prefix,
                rate=options.rate,
                duration_s=options.duration_s,
                timeout_s=options.timeout_s,
                seed=options.seed,
                say=say,
            )
            return await load.run()
    finally:
        await redis.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(run(options))
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130


if __name__ == "__main__":
    sys.exit(main())
