"""Pause and resume the bot for one person: a human takes the conversation over.

    python -m worker.takeover pause  --tenant 106540352242922 --person 16505551234 \\
        [--seconds 3600] [--why "answering by phone"] [--by alice]
    python -m worker.takeover resume --tenant 106540352242922 --person 16505551234 [--by alice]
    python -m worker.takeover status --tenant 106540352242922 --person 16505551234

While paused the bot sends that person nothing; their messages wait (`pending`) and are
answered when the pause lapses (`--seconds`, default `HUMAN_PAUSE_S`) or is lifted with
`resume`, which makes them due at once. How it works: shared/ops/takeover.py, docs/operating.md.
Exit codes: 0 done (status: paused), 1 nothing to do or an error (status: not paused; resume:
there was no pause), 2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from datetime import UTC, datetime
from typing import Any

from shared.keys import KeyError_, Keys
from shared.ops import takeover
from shared.settings import Settings
from shared.storage.redis_client import make_redis
from worker import cli


def _describe(pause: dict[str, Any]) -> str:
    until = datetime.fromtimestamp(int(pause.get("until_ms") or 0) / 1000, UTC)
    return (
        f"paused until {until:%Y-%m-%d %H:%M:%S} UTC  by={pause.get('by')!r}  "
        f"why={pause.get('why')!r}"
    )


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    redis = make_redis(settings)
    keys = Keys(settings.key_prefix)
    try:
        if args.command == "pause":
            seconds = (
                settings.tenant(args.tenant).human_pause_s if args.seconds is None else args.seconds
            )
            pause = await takeover.pause(
                redis, keys, args.tenant, args.person, by=args.by, why=args.why, seconds=seconds
            )
            print(_describe(pause))
            return 0
        if args.command == "resume":
            if await takeover.resume(redis, keys, args.tenant, args.person, by=args.by):
                print(f"resumed: the bot answers {args.person} again")
                return 0
            print(f"error: {args.person} was not paused", file=sys.stderr)
            return 1
        state = await takeover.pause_state(redis, keys, args.tenant, args.person)
        print(_describe(state) if state else "not paused")
        return 0 if state else 1
    except (takeover.TakeoverError, KeyError_) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.takeover",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("pause", "resume", "status"):
        p = sub.add_parser(name)
        p.add_argument(
            "--tenant", required=True, help="tenant id (phone_number_id; Chatwoot: cw-<a>-<i>)"
        )
        p.add_argument("--person", required=True, help="the person (phone number or user id)")
        if name != "status":
            p.add_argument("--by", default=_who(), help="who does it (default: the login name)")
        if name == "pause":
            p.add_argument(
                "--seconds", type=float, help="how long (default: the tenant's HUMAN_PAUSE_S)"
            )
            p.add_argument("--why", default="paused by hand", help="why, for whoever reads it")
    args = parser.parse_args(argv)
    return cli.run(lambda settings: _run(args, settings))


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


if __name__ == "__main__":
    sys.exit(main())
