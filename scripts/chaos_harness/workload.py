"""Many people writing in bursts, delivered as Meta delivers: signed POSTs, duplicates, retries.

Each person writes bursts of 1-4 messages a moment apart, then pauses several debounce windows.
A person's next message is sent only once the previous one was acknowledged (200), so the order
in which a person's messages are stored is the order they were written. A fraction of the
deliveries (`dup_fraction`) is delivered again later, byte for byte, as Meta does even without
failures. Any answer but 200 (a 503 while Redis is away, a connection error) is retried, at
once and then less often, until 200, like Meta's retries.

Every message carries a token `c<person>x<seq>` in its text. The Messages API stand-in answers
"stand-in reply to: <the batch's text>", so the AI requests and the replies sent name exactly
the messages of their batch: that is how the checks tell which messages formed which turn.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass, field

import httpx
import orjson

from scripts.webhooks import inbound_webhook, meta_headers, text_message

TOKEN_RE = re.compile(r"\bc(\d+)x(\d+)\b")
WORDS = ("hola", "una consulta", "¿tienen turno el sábado?", "a la tarde", "gracias", "dale")
TENANTS = ("106540352242001", "106540352242002")


def tokens_in(text: str) -> list[tuple[int, int]]:
    """(person index, seq) of every message token in a text, in order."""
    return [(int(p), int(s)) for p, s in TOKEN_RE.findall(text)]


@dataclass
class Person:
    index: int
    phone: str
    tenant: str
    window_closed: bool = False  # the Graph API answers 131047 to every send to this person


@dataclass
class Message:
    person: int
    seq: int
    burst: int
    wamid: str
    body: bytes
    first_sent: float = 0.0  # when the first delivery attempt started
    acked: float | None = None  # when the first 200 came back
    attempts: int = 0
    rejected: int = 0  # non-200 answers and connection errors
    stored: int = 0  # deliveries the receiver reported as stored (x-stored)
    duplicates: int = 0  # deliveries it reported as duplicates (x-duplicates)

    @property
    def token(self) -> tuple[int, int]:
        return (self.person, self.seq)


@dataclass
class Burst:
    person: int
    index: int
    seqs: list[int] = field(default_factory=list)


@dataclass
class Tally:
    deliveries: int = 0
    duplicate_deliveries: int = 0
    statuses: dict[int, int] = field(default_factory=dict)  # HTTP status -> count
    connection_errors: int = 0


class Workload:
    def __init__(
        self,
        url: str,
        secret: str,
        people: int,
        window_s: float,
        *,
        seed: int = 1,
        dup_fraction: float = 0.2,
        window_closed_people: int = 0,
    ) -> None:
        self.url = url
        self.secret = secret
        self.window_s = window_s
        self.dup_fraction = dup_fraction
        self.rng = random.Random(seed)
        self.run_id = f"{seed}{int(time.time()) % 100000}"
        self.people = [
            Person(i, f"54911{5550000 + i:07d}", TENANTS[i % len(TENANTS)]) for i in range(people)
        ]
        for person in self.rng.sample(self.people, window_closed_people):
            person.window_closed = True
        self.messages: dict[tuple[int, int], Message] = {}
        self.bursts: list[Burst] = []
        self.tally = Tally()
        self._dups: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self.give_up_at = float("inf")

    def by_phone(self) -> dict[str, Person]:
        return {p.phone: p for p in self.people}

    async def run(self, duration_s: float, give_up_after_s: float = 60.0) -> None:
        """Write for `duration_s`, then wait for every delivery (retries included) to end."""
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=5.0, limits=limits) as client:
            self._client = client
            stop_at = time.time() + duration_s
            self.give_up_at = stop_at + give_up_after_s
            await asyncio.gather(*(self._write(p, stop_at) for p in self.people))
            while self._dups:
                await asyncio.gather(*list(self._dups), return_exceptions=True)
            self._client = None

    async def _write(self, person: Person, stop_at: float) -> None:
        rng = random.Random(self.rng.random())
        seq = 0
        await asyncio.sleep(rng.uniform(0, 2 * self.window_s))
        while time.time() < stop_at:
            burst = Burst(person.index, len(self.bursts))
            self.bursts.append(burst)
            for i in range(rng.randint(1, 4)):
                if i:
                    await asyncio.sleep(rng.uniform(0.02, 0.3 * self.window_s))
                message = self._message(person, seq, burst.index, rng)
                burst.seqs.append(seq)
                seq += 1
                await self._deliver(message, first=True)
                if rng.random() < self.dup_fraction:
                    task = asyncio.create_task(
                        self._redeliver(message, rng.uniform(0, 4) * self.window_s)
                    )
                    self._dups.add(task)
                    task.add_done_callback(self._dups.discard)
            await asyncio.sleep(rng.uniform(3.0, 5.0) * self.window_s)

    def _message(self, person: Person, seq: int, burst: int, rng: random.Random) -> Message:
        wamid = f"wamid.chaos{self.run_id}.{person.index}.{seq}"
        text = f"c{person.index}x{seq} {rng.choice(WORDS)}"
        payload = inbound_webhook(
            person.tenant,
            person.phone,
            [text_message(wamid, text, person.phone)],
            name=f"P{person.index}",
        )
        message = Message(person.index, seq, burst, wamid, orjson.dumps(payload))
        self.messages[message.token] = message
        return message

    async def _redeliver(self, message: Message, after_s: float) -> None:
        await asyncio.sleep(after_s)
        self.tally.duplicate_deliveries += 1
        await self._deliver(message, first=False)

    async def _deliver(self, message: Message, first: bool) -> None:
        """POST until 200 (or the give-up time): immediately, then less and less often."""
        assert self._client is not None
        headers = meta_headers(self.secret, message.body)
        delay = 0.05
        while True:
            if first and message.attempts == 0:
                message.first_sent = time.time()
            message.attempts += 1
            self.tally.deliveries += 1
            try:
                response = await self._client.post(self.url, content=message.body, headers=headers)
            except httpx.HTTPError:
                self.tally.connection_errors += 1
                status = 0
            else:
                status = response.status_code
                self.tally.statuses[status] = self.tally.statuses.get(status, 0) + 1
            if status == 200:
                message.stored += int(response.headers.get("x-stored", "0"))
                message.duplicates += int(response.headers.get("x-duplicates", "0"))
                if message.acked is None:
                    message.acked = time.time()
                return
            message.rejected += 1
            if time.time() >= self.give_up_at:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
