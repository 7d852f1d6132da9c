"""The human review list: batches the worker must not answer on its own.

    python -m worker.review list    --tenant 106540352242922 [--reason too_old]
    python -m worker.review show    --tenant 106540352242922 <id>
    python -m worker.review requeue --tenant 106540352242922 <id>   # back as a fresh batch
    python -m worker.review drop    --tenant 106540352242922 <id>

Items live in the tenant's review hash (`HGETALL 'wa:{<tenant>}:review'`), one JSON per batch
id with reason, error, attempts, the messages and the context the batch had taken (reactions,
edits of answered messages, ...). Requeue makes the item a fresh batch (attempt 0, due now,
exempt from the age check since a human asked for it, with that context); it waits while
the person has another batch in flight, to keep the person's order. An item with reason
`delivery_unknown` holds a send that may or may not have reached the person
(`delivery_unknown`: which part or template, when, why, its text): requeueing it asks the AI
again and sends a new reply, so do it only once you know the person did not get it.

Both requeue and drop lift the pause the review itself set (a WhatsApp review for a reason
that needs a person sets one: shared/ops/takeover.py): requeue hands the batch back to the AI,
drop says the person dealt with it; messages that waited through the pause are then answered.
A pause a person set (a reply by hand, the ops page, `python -m worker.takeover pause`, an echo
from the WhatsApp Business app) is never lifted by an action on a review item: the bot must
not talk over the person. A requeued batch then waits for that pause's end.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from shared.conversation.unknowns import describe, utc
from shared.keys import Keys
from shared.ops.review import ReviewError, ReviewList
from shared.settings import Settings
from shared.storage.redis_client import make_redis
from shared.storage.scripts import Scripts
from worker import cli


def _summary(item: dict[str, Any]) -> str:
    messages = item.get("messages") or []
    line = (
        f"{item.get('id')}  person={item.get('person')}  reason={item.get('reason')}  "
        f"messages={len(messages)}  attempts={item.get('attempts')}  error={item.get('error')!r}"
    )
    unknown = item.get("delivery_unknown")
    if isinstance(unknown, dict):
        line += f"  unknown={describe(unknown)!r} at {utc(int(unknown.get('at_ms') or 0))}"
    late = item.get("late_failure")
    if isinstance(
        late, dict
    ):  # Meta reported a sent part undelivered (worker/turn/late_failures.py)
        codes = ",".join(str(p.get("code")) for p in late.get("parts") or [] if isinstance(p, dict))
        line += f"  late={codes}" + (
            f"  template={late['template']!r}" if "template" in late else ""
        )
    if item.get("hand_over"):
        line += f"  hand_over={item['hand_over']!r}"
    return line


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    redis = make_redis(settings)
    try:
        review = ReviewList(redis, Keys(settings.key_prefix), Scripts())
        if args.command == "list":
            items = await review.items(args.tenant, args.reason)
            for item in items:
                print(_summary(item))
            print(f"{len(items)} item(s)")
        elif args.command == "show":
            item = await review.get(args.tenant, args.id)
            print(orjson.dumps(item, option=orjson.OPT_INDENT_2).decode())
        elif args.command == "requeue":
            await review.requeue(args.tenant, args.id)
            print(f"requeued {args.id}")
        elif args.command == "drop":
            await review.drop(args.tenant, args.id)
            print(f"dropped {args.id}")
    except ReviewError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await redis.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.review",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("list", "show", "requeue", "drop"):
        p = sub.add_parser(name)
        p.add_argument(
            "--tenant", required=True, help="tenant id (phone_number_id; Chatwoot: cw-<a>-<i>)"
        )
        if name == "list":
            p.add_argument("--reason", help="only items with this reason")
        else:
            p.add_argument("id", help="review item id (the batch id)")
    args = parser.parse_args(argv)
    return cli.run(lambda settings: _run(args, settings))


if __name__ == "__main__":
    sys.exit(main())
