"""What the stand-ins' scripts share (`scripts/graph_standin`, `anthropic_standin`,
`chatwoot_standin`): their common options, and serving the stand-in in the foreground."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass

from scripts.standins._common import F, StandInBase


@dataclass(frozen=True)
class Credentials:
    """Which credentials a stand-in script accepts: `flag` (repeatable; default $`variable`,
    else `default`), or any non-empty one with `any_flag` (e.g. --any-token)."""

    flag: str
    any_flag: str
    what: str  # in the help: "accepted <what>"
    variable: str
    default: str

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            self.flag,
            action="append",
            dest="credentials",
            metavar=self.flag.removeprefix("--").replace("-", "_").upper(),
            help=f"accepted {self.what} (repeatable; default ${self.variable} or {self.default})",
        )
        anything = self.any_flag.removeprefix("--any-")
        parser.add_argument(
            self.any_flag,
            action="store_true",
            dest="any_credential",
            help=f"accept any non-empty {anything}",
        )

    def accepted(self, args: argparse.Namespace) -> list[str] | str | None:
        """For the stand-in's constructor: the credentials given, or None for any."""
        if args.any_credential:
            return None
        given: list[str] | None = args.credentials
        return given or os.environ.get(self.variable) or self.default


def script_parser(
    prog: str, description: str, port_variable: str, port: int, credentials: Credentials
) -> argparse.ArgumentParser:
    """The options every stand-in script has: --host, --port (default $port_variable or
    `port`), --log-level, and its `credentials`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get(port_variable, port)))
    parser.add_argument("--log-level", default="info")
    credentials.add_to(parser)
    return parser


def serve_forever(standin: StandInBase[F], args: argparse.Namespace, title: str, hint: str) -> None:
    """Serve `standin` on uvicorn in the foreground, as `args` (from `script_parser`) say."""
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(message)s")
    print(f"{title} on http://{args.host}:{args.port}  ({hint})")
    uvicorn.run(standin.app, host=args.host, port=args.port, log_level=args.log_level)
