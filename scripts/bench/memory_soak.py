"""Redis memory at a steady load: what a waiting conversation costs, what an answered message
leaves behind (its dedupe marker, its statuses, its outbound record), and how Redis grows.

    .venv/bin/python -m scripts.bench.memory_soak                  # this checkout
    .venv/bin/python -m scripts.bench.memory_soak --at main        # a revision (git archive)
    .venv/bin/python -m scripts.bench.memory_soak --rate 40 --duration 120 --people 5000

Everything goes through the product's own scripts, called in this process the way the receiver
and the worker call them (ingest.lua per webhook; the worker's ConversationStore for intake,
claim, reply, parts and finish), on a private Redis (appendonly off, no RDB saves). Four parts,
each on a fresh server:

1. waiting: `--people` conversations of 3 text messages, waiting for their window (300 s);
   used_memory per conversation, and the MEMORY USAGE of each key kind.
2. answered: `--people` one-message conversations answered (a reply of one part, accepted
   with a provider id), then Meta's `sent`, `delivered` and `read` posted back for each part as
   status webhooks; what is left, per answered message, by kind of key: the used_memory each
   kind frees when its keys are deleted (so the key space's own entries count), its TTL. The
   Redis CPU of `ingest.lua` per message and per status (`INFO commandstats`).
3. soak: `--rate` messages a second for `--duration` seconds from `--people` people (one
   delivery in ten sent twice), each answered within about a second, its three statuses posted
   back (one in ten twice); used_memory sampled every 5 s and its growth per hour fitted.
4. ingest: the Redis CPU of ingest.lua per message with 1, 10 and 100 messages a call.

A book of dedupe markers or outbound records (shared/lua/lib/book.lua) sizes a generation's
shards by the last generation's rate, so steady traffic fills them to a few hundred entries
each by the generation's end. A run of minutes cannot: before each part, the books are given
the generations a steady traffic leaves, the newest sized as if the run's entries were a
generation's (a smaller tenant's), so they land at the density a generation reaches by its end
(a larger tenant has more shards, as full), and a lookup asks as many generations as it will.
A revision without books is left as it is. The steady state extrapolates the per-message kinds
(markers, records) over their TTL at `--rate`.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import random
import shutil
import sys
import time
from collections import defaultdict
from typing import Any

import orjson

from scripts.bench import revision
from scripts.bench.commandstats import script_stats

STATUSES = ("sent", "delivered", "read")
WEEK_S = 7 * 86400


def family(key: str, base: str) -> str:
    """The kind of one of the tenant's keys, by its name (either release's layout)."""
    if not key.startswith(base):
        return "fleet-wide"
    rest = key[len(base) :]
    if rest.startswith("seen:"):
        return "status markers" if rest.endswith(tuple(f":{s}" for s in STATUSES)) else "dedupe"
    if rest.startswith("s:"):
        return "dedupe"
    if rest.startswith(("out:", "o:")):
        return "outbound"
    if rest.startswith("c:"):
        return f"person {rest.rsplit(':', 1)[1]}"
    return f"tenant {rest.split(':', 1)[0]}"


class Load:
    """The product's pieces on one private Redis, imported from the code under test."""

    def __init__(self, url: str, window_s: float) -> None:
        from redis.asyncio import Redis

        import worker.conversation_store as store
        from scripts.bench.worker_load import PREFIX, TENANT
        from shared import events
        from shared.keys import Keys
        from shared.settings import Settings
        from shared.storage.group_commit import GroupCommitter
        from shared.storage.scripts import Scripts

        self.events, self.tenant = events, TENANT
        self.redis = Redis.from_url(url)
        self.scripts = Scripts()
        self.keys = Keys(PREFIX)
        self.tk = self.keys.tenant(TENANT)
        self.base = self.tk.inbox[: -len("inbox")]
        settings = Settings().with_overrides(
            redis_url=url, key_prefix=PREFIX, debounce_window_s=window_s, max_wait_s=window_s * 2
        )
        self.store = store.ConversationStore(
            settings, self.scripts, GroupCommitter(self.redis, self.scripts)
        )
        self.store_module = store
        self._tenant_arg = "tenant" in inspect.signature(events.message_event).parameters

    async def __aenter__(self) -> Load:
        await self.scripts.load(self.redis)
        await self.redis.sadd(self.keys.tenants, self.tenant)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.redis.aclose()

    # --- what the receiver writes ----------------------------------------------------------
    def message(self, person: str, n: int) -> dict[str, Any]:
        from scripts.bench.worker_load import make_event

        return make_event(person, n)

    def status(self, person: str, wamid: str, status: str) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        raw = {
            "id": wamid,
            "status": status,
            "timestamp": str(now_ms // 1000),
            "recipient_id": person,
            "conversation": {"id": "c0ffee" * 5, "origin": {"type": "service"}},
            "pricing": {"billable": False, "pricing_model": "PMP", "category": "service"},
        }
        make: Any = self.events.status_event  # a revision's may take `tenant`
        return dict(
            make(
                **({"tenant": self.tenant} if self._tenant_arg else {}),
                channel="whatsapp",
                person=person,
                message_id=wamid,
                status=status,
                ts=now_ms // 1000,
                received_ms=now_ms,
                raw=raw,
            )
        )

    async def ingest(self, events: list[dict[str, Any]], per_call: int = 1) -> int:
        """One ingest call per webhook of one item (or `per_call` items, as the receiver's
        group commit makes under load), pipelined; how many were new."""
        from scripts.bench.worker_load import DEDUPE_TTL_S

        stored = 0
        for start in range(0, len(events), 500):
            pipe = self.redis.pipeline(transaction=False)
            chunk = events[start : start + 500]
            for at in range(0, len(chunk), per_call):
                items = chunk[at : at + per_call]
                self.scripts.ingest.queue(
                    pipe,
                    self.tk,
                    seen=[self.tk.seen(self.events.dedupe_id(e)) for e in items],
                    dedupe_ttl_s=DEDUPE_TTL_S,
                    events=[self.events.encode(e) for e in items],
                )
            stored += sum(sum(int(x) for x in r) for r in await pipe.execute())
        return stored

    # --- what the worker does --------------------------------------------------------------
    async def intake(self) -> None:
        saved = self.store_module.MAX_INTAKE_PER_CALL
        self.store_module.MAX_INTAKE_PER_CALL = int(await self.redis.llen(self.tk.inbox)) + 1
        try:
            await self.store.claim(self.tenant, 0, "intake")
        finally:
            self.store_module.MAX_INTAKE_PER_CALL = saved

    async def answer_due(self, parts: list[tuple[str, str]]) -> int:
        """Claim what is due and answer it: a reply of one part, accepted as a provider id
        (appended to `parts` with its person), and the finish; how many turns."""
        done = 0
        while True:
            claim = await self.store.claim(self.tenant, 200, f"t{time.monotonic_ns()}")
            if not claim.batches:
                return done
            await asyncio.gather(*(self._answer(b, parts) for b in claim.batches))
            done += len(claim.batches)

    async def _answer(self, batch: Any, parts: list[tuple[str, str]]) -> None:
        reply = "¡Hola! Sí, tenemos turno el sábado a la tarde. ¿A qué hora te queda bien?"
        await self.store.save_reply(batch, reply)
        wamid = f"wamid.HBgNout{batch.id}{random.getrandbits(64):016x}AA=="
        await self.store.record_part(batch, 0, wamid)
        exchange = {"user": batch.user_text, "assistant": reply, "ids": [], "out": [wamid]}
        await self.store.finish_done(batch, orjson.dumps(exchange))
        parts.append((batch.person, wamid))

    # --- the books -------------------------------------------------------------------------
    async def seed_books(self, markers: int, records: int, windows: int = 0) -> None:
        """Give each book the generations a steady traffic leaves (lib/book.lua), the newest
        sized to make the next one hold this run's `markers` or `records` at about the
        entries per shard a generation reaches by its end, when the code under test has
        books. Their shards are not written: lookups ask them as they would (finding nothing)."""
        from scripts.bench.worker_load import DEDUPE_TTL_S

        keep = DEDUPE_TTL_S
        # book -> (how long a generation takes entries, entries a shard is sized for, entries)
        books = {
            "seen_gens": (keep, 256, markers, keep),
            "outbound_gens": (86400, 48, records, keep),
            "lastin_gens": (86400, 64, windows, 86400 + 3600),  # the 24-hour windows
        }
        now = int((await self.redis.time())[0])
        for name, (gen_s, fill, entries, keep) in books.items():
            key = getattr(self.tk, name, None)
            if key is None or not entries:
                continue
            shards = 1
            while shards * fill < entries:
                shards *= 2
            live = (gen_s + keep) // gen_s  # generations older than the newest still kept
            for age in range(1, live + 1):
                start = now - age * gen_s + 60
                # The newest filled up with half as many shards: the next one gets `shards`.
                value = f"{start}:{max(1, shards // 2)}:{start + gen_s + keep}:full"
                if age > 1:
                    value = f"{start}:1:{start + gen_s + keep}"
                await self.redis.hset(key, str(start), value)
                if age == 1:
                    await self.redis.hset(key, "newest", value)
            await self.redis.hset(key, "since", now - live * gen_s)  # upgraded long ago

    # --- measuring -------------------------------------------------------------------------
    async def used(self) -> int:
        """used_memory without the clients' buffers, once it holds still: a key space that
        just grew rehashes its tables over the next server ticks, and each read's own buffers
        come and go (tens of KB either way)."""
        last = -1
        for _ in range(40):
            await asyncio.sleep(0.1)
            info = await self.redis.info("memory")
            now = int(info["used_memory"]) - int(info["mem_clients_normal"])
            now -= int(info.get("mem_clients_slaves", 0))
            if now == last:
                return now
            last = now
        return last

    async def families(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = defaultdict(list)
        async for raw in self.redis.scan_iter(match="*", count=1000):
            key = raw.decode()
            found[family(key, self.base)].append(key)
        return found

    async def sizes(self) -> dict[str, tuple[list[str], int, float]]:
        """Each kind of key: (its keys, bytes, median TTL s). Bytes: MEMORY USAGE (the value,
        the name, the key space's entry) plus the key space's share Redis does not report per
        key: 24 B of expires entry for a key with a TTL and about 8 B of table slot in each
        table it is in."""
        out: dict[str, tuple[list[str], int, float]] = {}
        for name, keys in sorted((await self.families()).items()):
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.memory_usage(key, samples=0)
                pipe.ttl(key)
            answers = await pipe.execute()
            usage, ttls = answers[0::2], [int(t) for t in answers[1::2]]
            size = sum(int(u or 0) for u in usage)
            size += sum(24 + 16 if ttl >= 0 else 8 for ttl in ttls)
            out[name] = (keys, size, float(sorted(ttls)[len(ttls) // 2]))
        return out

    async def by_family(self) -> dict[str, tuple[int, int, int, float]]:
        """Each kind of key: (keys, bytes as `sizes` counts them, used_memory freed by deleting
        them, median TTL s). Deletes everything."""
        out: dict[str, tuple[int, int, int, float]] = {}
        for name, (keys, size, ttl) in (await self.sizes()).items():
            before = await self.used()
            for start in range(0, len(keys), 1000):
                await self.redis.delete(*keys[start : start + 1000])
            out[name] = (len(keys), size, before - await self.used(), ttl)
        return out

    async def script_usec(self) -> tuple[int, int]:
        stats = script_stats(await self.redis.info("commandstats"))
        return stats["calls"], stats["usec"]


def person_id(i: int) -> str:
    return f"549116{i:07d}"


# --- the three parts ------------------------------------------------------------------------
async def waiting(url: str, people: int) -> dict[str, float]:
    async with Load(url, 300.0) as load:
        await load.seed_books(markers=3 * people, records=0, windows=people)
        before = await load.used()
        events = [load.message(person_id(i), m) for m in range(3) for i in range(people)]
        await load.ingest(events)
        await load.intake()
        after = await load.used()
        text = sum(len(e["text"].encode()) for e in events) / people
        out = {"per_conversation_B": (after - before) / people, "text_B": text}
        out["event_B"] = sum(len(load.events.encode(e)) for e in events) / len(events)
        sizes: dict[str, list[int]] = defaultdict(list)
        for i in range(0, people, max(1, people // 50)):
            async for raw in load.redis.scan_iter(match=f"{load.base}c:{person_id(i)}:*"):
                kind = raw.decode().rsplit(":", 1)[1]
                sizes[kind].append(int(await load.redis.memory_usage(raw, samples=0) or 0))
        for kind, values in sorted(sizes.items()):
            out[f"usage {kind}_B"] = sorted(values)[len(values) // 2]
        for name, (_, size, freed, _) in (await load.by_family()).items():
            out[f"{name}_B"] = size / people
            out[f"freed {name}_B"] = freed / people
        return out


async def answered(url: str, people: int) -> dict[str, float]:
    async with Load(url, 0.001) as load:
        await load.seed_books(markers=people, records=people, windows=people)
        before = await load.used()
        await load.redis.config_resetstat()
        stored = await load.ingest([load.message(person_id(i), 0) for i in range(people)])
        calls, usec = await load.script_usec()
        out = {"ingest_message_us": usec / max(1, calls), "stored": float(stored)}
        await load.intake()
        await asyncio.sleep(0.01)
        parts: list[tuple[str, str]] = []
        await load.redis.config_resetstat()
        while len(parts) < people:
            await load.answer_due(parts)
        out["turn_scripts_us"] = (await load.script_usec())[1] / people
        calls, usec, intake_usec = 0, 0, 0
        for status in STATUSES:
            # The intake's claim calls are script calls too: count the ingest calls alone.
            await load.redis.config_resetstat()
            await load.ingest([load.status(p, w, status) for p, w in parts])
            more_calls, more_usec = await load.script_usec()
            calls, usec = calls + more_calls, usec + more_usec
            await load.redis.config_resetstat()
            await load.intake()
            intake_usec += (await load.script_usec())[1]
        out["ingest_status_us"] = usec / max(1, calls)
        out["intake_status_us"] = intake_usec / (len(STATUSES) * people)
        after = await load.used()
        out["per_message_B"] = (after - before) / people
        for name, (keys, size, freed, ttl) in (await load.by_family()).items():
            out[f"{name}_B"] = size / people
            out[f"freed {name}_B"] = freed / people
            out[f"keys {name}"] = keys / people
            out[f"ttl {name}_s"] = ttl
        return out


async def ingest_cost(url: str, per_call: int, n: int = 6000) -> float:
    """Redis µs (`EVALSHA`, `INFO commandstats`) per new message, `per_call` a call."""
    async with Load(url, 300.0) as load:
        await load.seed_books(markers=n, records=0)
        await load.redis.config_resetstat()
        await load.ingest([load.message(person_id(i), 0) for i in range(n)], per_call)
        return (await load.script_usec())[1] / n


async def soak(url: str, rate: float, duration_s: float, people: int) -> dict[str, float]:
    """After a warm-up in which every person wrote once and was answered (so the people's own
    keys exist, as in a steady day), `rate` messages a second for `duration_s`."""
    rng = random.Random(7)
    async with Load(url, 1.0) as load:
        expected = int(rate * duration_s)
        await load.seed_books(markers=expected + people, records=expected + people, windows=people)
        warm: list[tuple[str, str]] = []
        await load.ingest([load.message(person_id(i), 0) for i in range(people)])
        await asyncio.sleep(1.05)
        while len(warm) < people:
            await load.answer_due(warm)
            await asyncio.sleep(0.05)
        for status in STATUSES:
            await load.ingest([load.status(p, w, status) for p, w in warm])
        await load.intake()
        before = await load.sizes()
        start_used = await load.used()
        samples: list[tuple[float, int]] = []
        sent: list[dict[str, Any]] = []
        parts: list[tuple[str, str]] = []
        statuses: list[tuple[float, dict[str, Any]]] = []
        counts = {"messages": 0, "duplicates": 0, "statuses": 0}
        t0 = time.monotonic()
        next_sample = t0
        while (now := time.monotonic()) - t0 < duration_s:
            batch = []
            while counts["messages"] + counts["duplicates"] < rate * (now - t0):
                if sent and rng.random() < 0.1:
                    batch.append(rng.choice(sent[-500:]))
                    counts["duplicates"] += 1
                else:
                    counts["messages"] += 1
                    sent.append(load.message(person_id(rng.randrange(people)), counts["messages"]))
                    batch.append(sent[-1])
            due_statuses = [e for at, e in statuses if at <= now]
            statuses = [(at, e) for at, e in statuses if at > now]
            await load.ingest(batch + due_statuses)
            counts["statuses"] += len(due_statuses)
            answered_before = len(parts)
            await load.answer_due(parts)
            for person, wamid in parts[answered_before:]:
                for delay, status in zip((0.3, 0.8, 2.0), STATUSES, strict=True):
                    event = load.status(person, wamid, status)
                    statuses.append((now + delay, event))
                    if rng.random() < 0.1:
                        statuses.append((now + delay + 0.2, event))
            if now >= next_sample:
                samples.append((now - t0, await load.used()))
                next_sample += 5.0
            await asyncio.sleep(max(0.0, 0.25 - (time.monotonic() - now)))
        elapsed = time.monotonic() - t0
        grown = await load.used() - start_used
        fit = [(t, u) for t, u in samples if t >= 10.0] or samples
        out = {
            "messages": float(counts["messages"]),
            "duplicates": float(counts["duplicates"]),
            "statuses": float(counts["statuses"]),
            "turns": float(len(parts)),
            "seconds": elapsed,
            "grown_MB": grown / 2**20,
            "growth_MB_per_h": _slope(fit) * 3600 / 2**20,
        }
        after = await load.sizes()
        for name, (_, size, ttl) in after.items():
            grew = size - (before[name][1] if name in before else 0)
            out[f"{name}_B"] = grew / max(1, counts["messages"])
            out[f"ttl {name}_s"] = ttl
        return out


def _slope(points: list[tuple[float, int]]) -> float:
    """Least-squares bytes per second."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_u = sum(u for _, u in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (u - mean_u) for t, u in points) / var if var else 0.0


# --- report ---------------------------------------------------------------------------------
PER_MESSAGE = ("dedupe", "status markers", "outbound")  # the kinds that grow with messages


def lifetime_s(ttl_s: float) -> float:
    """How long an entry of a kind whose newest keys have `ttl_s` left lives on average: a
    key each lives its TTL (7 days); a book's entry lives from its write to its generation's
    end, the newest shards' TTL just after it opened (lib/book.lua): on average halfway
    between that and the 7 days every entry is kept at least."""
    return (max(ttl_s, WEEK_S) + WEEK_S) / 2


def summary(args: argparse.Namespace, parts: dict[str, dict[str, float]]) -> list[str]:
    lines = ["[summary]"]
    wait = parts.get("waiting")
    if wait:
        lines.append(
            f"  a waiting conversation (3 messages, {wait['text_B']:.0f} B of text): "
            f"{wait['per_conversation_B']:,.0f} B of used_memory"
        )
    done = parts.get("answered")
    if done:
        left = sum(done.get(f"{k}_B", 0.0) for k in PER_MESSAGE)
        held = sum(
            done.get(f"{k}_B", 0.0) * lifetime_s(done.get(f"ttl {k}_s", 0.0)) for k in PER_MESSAGE
        )
        per_h = left * args.rate * 3600 / 2**20
        lines += [
            f"  left per answered message (dedupe marker, statuses, outbound record): {left:,.1f}"
            f" B, kept {held / max(left, 1e-9) / 86400:.1f} days on average",
            f"  at {args.rate:g} msg/s: Redis grows {per_h:,.1f} MB/h with them until the oldest"
            f" expire, then holds {held * args.rate / 2**30:,.2f} GiB of them",
            f"  Redis CPU: ingest {done['ingest_message_us']:.1f} µs a message,"
            f" {done['ingest_status_us']:.1f} µs a status (one item a call); a turn's scripts"
            f" {done['turn_scripts_us']:.0f} µs; a status's intake"
            f" {done['intake_status_us']:.1f} µs",
        ]
    soak = parts.get("soak")
    if soak:
        rate = (soak["messages"] + soak["duplicates"]) / soak["seconds"]
        left = sum(soak.get(f"{k}_B", 0.0) for k in PER_MESSAGE)
        held = sum(
            soak.get(f"{k}_B", 0.0) * lifetime_s(soak.get(f"ttl {k}_s", 0.0)) for k in PER_MESSAGE
        )
        per_person = sum(v for k, v in soak.items() if k.startswith("person ") and k.endswith("_B"))
        lines += [
            f"  soak, {rate:.1f} deliveries/s for {soak['seconds']:.0f} s: Redis grew"
            f" {soak['growth_MB_per_h']:,.1f} MB/h; a message added {left:,.1f} B of dedupe,"
            f" statuses and outbound records, {per_person:,.0f} B to its person's keys",
            f"  steady state of the per-message kinds at this rate:"
            f" {held * soak['messages'] / soak['seconds'] / 2**30:,.2f} GiB",
        ]
    return lines


def report(args: argparse.Namespace, parts: dict[str, dict[str, float]]) -> str:
    lines = [f"code: {revision.describe()}"]
    for name, values in parts.items():
        lines.append(f"[{name}]")
        lines += [f"  {key:40s} {value:14,.1f}" for key, value in values.items()]
    return "\n".join(lines + summary(args, parts))


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from scripts.dev.redis_server import RedisServer

    parts: dict[str, dict[str, float]] = {}
    wanted = args.only.split(",")
    if "waiting" in wanted:
        with RedisServer() as server:
            parts["waiting"] = await waiting(server.url, args.people)
    if "answered" in wanted:
        with RedisServer() as server:
            parts["answered"] = await answered(server.url, args.people)
    if "ingest" in wanted:
        parts["ingest"] = {}
        for per_call in (1, 10, 100):
            with RedisServer() as server:
                cost = await ingest_cost(server.url, per_call)
            parts["ingest"][f"ingest_{per_call}_a_call_us"] = cost
    if "soak" in wanted:
        with RedisServer() as server:
            parts["soak"] = await soak(server.url, args.rate, args.duration, args.people)
    return parts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--at", default="", help="a git revision's product code (default: this tree)")
    p.add_argument("--people", type=int, default=5000)
    p.add_argument("--rate", type=float, default=40.0, help="soak: messages a second")
    p.add_argument("--duration", type=float, default=60.0, help="soak: seconds")
    p.add_argument("--only", default="waiting,answered,ingest,soak")
    args = p.parse_args()
    if args.at and not revision.exported():
        code, description = revision.export(args.at)
        try:
            return revision.run_on(code, description, "scripts.bench.memory_soak", sys.argv[1:])
        finally:
            shutil.rmtree(code, ignore_errors=True)
    print(report(args, asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
