"""Reply to a person by hand from the command line (the ops library's `ManualReplies`,
shared/ops/manual_reply.py, does the work):

    python -m worker.manual_reply --tenant 106540352242922 --person 5491155550001 \\
        --by ana "Hola, soy Ana: ya le confirmo el turno."
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shared.keys import Keys
from shared.ops import audit
from shared.ops.manual_reply import ManualReplies, ManualReplyError
from shared.settings import Settings
from shared.storage.redis_client import make_redis
from shared.storage.scripts import Scripts
from worker import cli


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    redis = make_redis(settings)
    keys = Keys(settings.key_prefix)
    replies = ManualReplies(redis, keys, Scripts(), settings)
    try:
        try:
            result = await replies.reply(args.tenant, args.person, args.text, by=args.by)
        except ManualReplyError as exc:
            if exc.provider_ids:  # something went out all the same: that is on the record
                await _audit(redis, keys, settings, args, f"(partly) {args.text}")
            print(f"error: {exc}", file=sys.stderr)
            return 1
        await _audit(redis, keys, settings, args, args.text)
    finally:
        await replies.aclose()
        await redis.aclose()
    for provider_id in result.provider_ids:
        print(provider_id)
    what = "the window was closed: the template went out" if result.template else "sent"
    print(f"{what}; answered {result.answered} waiting message(s)", file=sys.stderr)
    return 0


async def _audit(
    redis: Any, keys: Keys, settings: Settings, args: argparse.Namespace, detail: str
) -> None:
    await audit.record(
        redis,
        keys,
        who=args.by,
        action="reply",
        tenant=args.tenant,
        person=args.person,
        detail=detail.strip()[:200],
        retention_s=settings.review_retention_s,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.manual_reply",
        description="Reply to a person by hand, through the tenant's provider; prints the"
        " provider's id of each part sent (exit 0), or the reason it was not sent (exit 1).",
    )
    parser.add_argument("--tenant", required=True, help="tenant id (phone_number_id; cw-<a>-<i>)")
    parser.add_argument("--person", required=True, help="the person (phone number, user id)")
    parser.add_argument("--by", required=True, help="who writes (kept in the audit log)")
    parser.add_argument("text", help="the reply, as the person will read it")
    args = parser.parse_args(argv)
    return cli.run(lambda settings: _run(args, settings))


if __name__ == "__main__":
    sys.exit(main())
