"""What is going on in Redis, for operators who need not know the key layout.

    python -m worker.inspect                      # every tenant: queues and counters
    python -m worker.inspect TENANT               # inbox, waiting, running, pending, review
    python -m worker.inspect TENANT PERSON        # one conversation: messages, lease, batch
    python -m worker.inspect TENANT PERSON --text # ... with message bodies and the reply
    python -m worker.inspect ... --json           # the same as JSON

It reads the same settings as the worker (`REDIS_URL`, `KEY_PREFIX`, ...) and changes
nothing. Times are relative to Redis's clock. The README lists the equivalent redis-cli
commands (section "What lives in Redis").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import Any

import orjson
from redis.exceptions import RedisError

from shared.conversation.unknowns import describe, utc
from shared.keys import KeyError_, Keys
from shared.ops import live_state
from shared.ops.live_state import duration
from shared.settings import ConfigError, Settings, exit_on_config_error
from shared.storage.redis_client import explain, make_redis


def until(ms: int) -> str:
    return f"in {duration(ms)}" if ms >= 0 else f"overdue by {duration(-ms)}"


def clock(now_ms: int) -> str:
    return datetime.fromtimestamp(now_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_fleet(state: dict[str, Any]) -> list[str]:
    lines = [f"fleet (Redis clock {clock(state['now_ms'])})"]
    if not state["tenants"]:
        lines.append("  no tenant has received traffic yet")
    for t in state["tenants"]:
        lines.append(
            f"  {t['tenant']}  inbox={t['inbox']} waiting={t['waiting']} "
            f"running={t['running']} review={t['review']} "
            f"messages={t['messages']} turns={t['turns']}"
            + (f" unknown={t['unknown']}" if t.get("unknown") else "")
        )
    lines.append(f"  dead-letter list: {state['deadletter']} bodies")
    lines += render_workers(state["workers"])
    lines.append(
        f"  workers listening: {state['workers_listening']}; tenants waiting for a worker: "
        f"{state['wake_queue']} with new work, {state['relay_queue']} relayed"
    )
    return lines


def render_workers(workers: dict[str, Any]) -> list[str]:
    """Which workers are alive (heartbeats), since when, and how many turns each runs."""
    live = workers["live"]
    lines = [f"  workers alive: {len(live)}"]
    for w in live:
        lines.append(
            f"    {w['worker']}  up {duration(w['up_ms'])} (since {clock(w['started_ms'])}), "
            f"seen {duration(w['seen_ago_ms'])} ago, running {w['running']}/{w['concurrency']}"
        )
    if workers["dead_entries"]:
        lines.append(f"    ({workers['dead_entries']} dead workers' heartbeats not yet removed)")
    return lines


def render_tenant(state: dict[str, Any]) -> list[str]:
    lines = [f"tenant {state['tenant']} (Redis clock {clock(state['now_ms'])})"]
    if not state["registered"]:
        lines.append("  (not in the tenant registry: no traffic received for it)")
    lines.append(f"  inbox       {state['inbox']} events not yet taken in by a worker")
    lines.append(f"  waiting     {state['waiting_total']} conversations")
    for w in state["waiting"]:
        lines.append(f"    {w['person']}  due {until(w['due_in_ms'])}")
    lines += _more(state["waiting_total"], len(state["waiting"]))
    lines.append(f"  running     {state['running_total']} turns")
    for r in state["running"]:
        lines.append(
            f"    {r['person']}  batch {r['batch']} attempt {r['attempt']}, "
            f"{r['messages']} messages, lease {_left(r['lease_left_ms'])} (lock {r['token']})"
        )
    lines += _more(state["running_total"], len(state["running"]))
    pending = state["pending"]["conversations"]
    more = "+" if state["pending"]["truncated"] else ""
    lines.append(f"  pending     {len(pending)}{more} conversations hold messages for a batch")
    for p in pending:
        flight = ", a batch in flight" if p["batch_in_flight"] else ""
        lines.append(f"    {p['person']}  {p['messages']} messages{flight}")
    lines.append(f"  review      {state['review_total']} items")
    for item in state["review"]:
        lines += _review_lines(item)
    lines += _more(state["review_total"], len(state["review"]))
    unknown = state.get("deliveries_unknown") or {}
    if unknown:
        kinds = " ".join(f"{kind}={n}" for kind, n in sorted(unknown.items()))
        lines.append(
            f"  unknown     {sum(unknown.values())} sends nobody can confirm ({kinds}; "
            "never sent again: see the review items)"
        )
    lag = state["dispatch_lag"]
    if lag["claims"]:
        lines.append(
            f"  lag         {lag['claims']} claims, mean {lag['mean_ms']:.1f} ms after due"
        )
    counters = " ".join(
        f"{name}={value}"
        for name, value in state["counters"].items()
        if not name.startswith(("lag_", "ai_", "send_"))  # histogram buckets
    )
    lines.append(f"  counters    {counters or '(none)'}")
    if state["unroutable"]:
        lines.append(f"  unroutable  {state['unroutable']} inbox entries the worker set aside")
    return lines


def render_person(state: dict[str, Any]) -> list[str]:
    lines = [
        f"conversation {state['tenant']} / {state['person']} (Redis clock {clock(state['now_ms'])})"
    ]
    pending = state["pending"]
    lines.append(f"  pending     {len(pending)} messages for the next batch")
    for m in pending:
        text = f"  {m['text']!r}" if "text" in m else f"  ({m.get('chars', 0)} chars)"
        received = duration(m.get("received_ago_ms"))
        lines.append(f"    {m['id']}  {m['type']}  received {received} ago{text}")
    if state["due"]:
        lines.append(f"  due         {until(state['due']['due_in_ms'])}")
    else:
        lines.append("  due         not scheduled")
    lease = state["lease"]
    if lease:
        lines.append(
            f"  turn        running, lease {_left(lease['lease_left_ms'])} "
            f"(lock {lease['token']}, lock TTL {duration(lease['lock_ttl_ms'])})"
        )
    else:
        lines.append("  turn        none running")
    batch = state["batch"]
    if batch:
        lines.append(
            f"  batch       {batch['id']}  attempt {batch['attempt']}, "
            f"{batch['messages']} messages, {'in a turn' if batch['in_turn'] else 'waiting'}"
        )
        if batch["last_error"]:
            lines.append(f"    last error  {batch['last_error']}")
        if batch["reply_stored"]:
            sent = ", ".join(str(p) for p in batch["parts_sent"]) or "none"
            lines.append(
                f"    reply       stored ({batch['reply_chars']} chars), parts sent: {sent}"
            )
            if "reply" in batch:
                lines.append(f"    reply text  {batch['reply']!r}")
        template = batch.get("template")
        if template:
            lines.append(
                f"    template    noted {_at(template['noted_ms'])} in place of part "
                f"{template['part'] + 1} (not sent again; unknown if that part is not recorded)"
            )
        journal = batch.get("review_journal")
        if journal:
            steps = ", ".join(f"{k}={v}" for k, v in journal.get("steps", {}).items())
            decided = _at(journal.get("decided_ms"))
            lines.append(
                f"    review      decided ({journal.get('reason')}) {decided}, not finished; "
                f"hand-over: {steps or 'not begun'}"
            )
    else:
        lines.append("  batch       none")
    window = state["window"]
    if window["open"]:
        lines.append(f"  24h window  open, closes in {duration(window['closes_in_s'] * 1000)}")
    else:
        lines.append("  24h window  closed (or no message seen)")
    lines.append(f"  memory      {state['memory_exchanges']} exchanges remembered")
    silent = state.get("silent")
    if silent:
        by = f", {silent['by']}" if silent.get("by") else ""
        lines.append(
            f"  silent      a person handles it ({silent.get('why')}{by}) since "
            f"{_at(silent.get('since_ms'))}: the customer's messages go to the memory"
        )
    human = state.get("human")
    if isinstance(human, dict):
        left = duration(int(human.get("until_ms") or 0) - state["now_ms"])
        lines.append(
            f"  human       bot paused by {human.get('by')!r} ({human.get('why')!r}), "
            f"ends in {left}"
        )
    lines.append(f"  review      {len(state['review'])} items")
    for item in state["review"]:
        lines += _review_lines(item)
    return lines


def _left(ms: int | None) -> str:
    if ms is None:
        return "unknown"
    return f"{duration(ms)} left" if ms >= 0 else f"ended {duration(-ms)} ago (expired)"


def _more(total: int, shown: int) -> list[str]:
    return [f"    ... and {total - shown} more"] if total > shown else []


def _review_lines(item: dict[str, Any]) -> list[str]:
    messages = item["messages"]
    count = messages if isinstance(messages, int) else len(messages or [])
    lines = [
        f"    {item.get('id')}  person={item.get('person')}  reason={item.get('reason')}  "
        f"attempts={item.get('attempts')}  messages={count}  error={item.get('error')!r}"
    ]
    unknown = item.get("delivery_unknown")
    if unknown:
        send = unknown.get("send") or describe(unknown)
        lines.append(
            f"      delivery unknown: {send}, request made {_at(unknown.get('at_ms'))}: "
            f"{unknown.get('error')}"
        )
    if item.get("hand_over"):
        lines.append(f"      hand-over: {item['hand_over']}")
    return lines


def _at(ms: int | None) -> str:
    return "at an unknown time" if not ms else f"at {utc(int(ms))}"


async def read(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    redis = make_redis(settings)
    keys = Keys(settings.key_prefix)
    try:
        if args.tenant is None:
            return await live_state.fleet(redis, keys)
        if args.person is None:
            return await live_state.tenant(redis, keys, args.tenant, args.limit)
        return await live_state.person(redis, keys, args.tenant, args.person, args.text)
    finally:
        await redis.aclose()


def render(args: argparse.Namespace, state: dict[str, Any]) -> str:
    if args.json:
        return orjson.dumps(state, option=orjson.OPT_INDENT_2).decode()
    if args.tenant is None:
        return "\n".join(render_fleet(state))
    if args.person is None:
        return "\n".join(render_tenant(state))
    return "\n".join(render_person(state))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.inspect",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("tenant", nargs="?", help="tenant id (the business phone_number_id)")
    parser.add_argument("person", nargs="?", help="person id (wa_id)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--text", action="store_true", help="include message bodies and reply")
    parser.add_argument("--limit", type=int, default=50, help="entries shown per list")
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error("--limit must be at least 1")
    try:
        settings = Settings.from_env()
        if args.tenant is not None:
            Keys(settings.key_prefix).tenant(args.tenant).pending(args.person or "x")
    except ConfigError as exc:
        exit_on_config_error(exc)
    except KeyError_ as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        state = asyncio.run(read(args, settings))
    except (RedisError, OSError) as exc:
        print(
            f"error: cannot read Redis at {settings.masked()['redis_url']}: {explain(exc)}",
            file=sys.stderr,
        )
        return 1
    print(render(args, state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
