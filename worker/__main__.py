"""`python -m worker`: run one worker process (Procfile `worker`)."""

from __future__ import annotations

import asyncio
import sys

from shared.logs import configure_logging
from shared.settings import ConfigError, Settings, exit_on_config_error
from worker.process import Worker


async def _main(settings: Settings) -> None:
    worker = Worker(settings)
    worker.install_signal_handlers()
    await worker.run()


def main() -> int:
    settings = Settings.from_env_or_exit()
    configure_logging(settings.log_level, settings.log_format)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - optional speed-up
        pass
    try:
        asyncio.run(_main(settings))
    except ConfigError as exc:  # a BRAIN or SENDER that cannot be loaded
        exit_on_config_error(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
