"""Forget a person (a privacy request): delete what the product holds about them.

    python -m worker.forget --tenant 106540352242922 --person 5491155550001 --by ana
    python -m worker.forget --tenant 106540352242922 --person 5491155550001 --by ana --yes

Deletes the person's conversation (pending messages, memory, context, window), their review
items, outbound records, outbox entries and user-id mappings, and rewrites the audit log's
entries about them to keep only that something happened (shared/ops/forget.py says what and how).
Asks for confirmation unless `--yes`. Refused while a turn of the person runs (a batch waiting
for a retry goes with the rest): run it again once the turn ended. Run it again a minute later
when the report says events were waiting in the inbox or the person wrote meanwhile.

Exit codes: 0 done (also when nothing was held), 1 refused or Redis unreachable, 2 bad
configuration or not confirmed.
"""

from __future__ import annotations

import argparse
import sys

from shared.keys import Keys
from shared.ops.forget import ForgetError, ForgetReport, forget_person
from shared.settings import Settings
from shared.storage.redis_client import make_redis
from worker import cli


def _print(report: ForgetReport, tenant: str, person: str) -> None:
    if report.deleted == 0:
        print(f"nothing held about {person} in tenant {tenant}")
    else:
        print(f"forgot {person} in tenant {tenant}: {report.deleted} deleted or rewritten")
    print(f"  {report.summary()}")
    if report.inbox_waiting or report.arrived_meanwhile:
        print(
            f"  note: {report.inbox_waiting} events of the tenant were not taken in yet"
            + (" and the person wrote meanwhile" if report.arrived_meanwhile else "")
            + ": run this again in a minute"
        )


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    redis = make_redis(settings)
    try:
        report = await forget_person(
            redis,
            Keys(settings.key_prefix),
            args.tenant,
            args.person,
            by=args.by,
            retention_s=settings.review_retention_s,
        )
    except ForgetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await redis.aclose()
    _print(report, args.tenant, args.person)
    return 0


def _confirmed(args: argparse.Namespace) -> bool:
    if args.yes:
        return True
    prompt = (
        f"Delete everything held about {args.person} in tenant {args.tenant}"
        " (cannot be undone)? Type yes: "
    )
    try:
        return input(prompt).strip().lower() == "yes"
    except EOFError:  # no terminal: only --yes can confirm
        print()
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.forget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--tenant", required=True, help="tenant id (phone_number_id; Chatwoot: cw-<a>-<i>)"
    )
    parser.add_argument(
        "--person", required=True, help="the person (phone number; Chatwoot: conversation id)"
    )
    parser.add_argument("--by", required=True, help="who asks (your name): for the audit log")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    args = parser.parse_args(argv)
    if not _confirmed(args):
        print("not confirmed: nothing deleted", file=sys.stderr)
        return 2
    return cli.run(lambda settings: _run(args, settings))


if __name__ == "__main__":
    sys.exit(main())
