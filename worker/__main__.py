"""`python -m worker`: run one worker process (Procfile `worker`)."""

from __future__ import annotations

import asyncio
import gc
import sys

from shared.logs import configure_logging
from shared.settings import ConfigError, Settings, exit_on_config_error
from worker.process import Worker

# Allocations between two young-generation collections of Python's cycle collector (its
# default is 700): a turn allocates a few hundred objects, nearly all freed by reference
# counting, so at 700 the collector ran every few turns and walked the 200 running turns' live
# objects each time (docs/benchmarks/worker.md).
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Before the loop starts: what the imports made lives as long as the process, so the
    collector stops looking at it (`gc.freeze`), and it looks at young objects less often. A
    worker run inside another program (the tests) leaves that program's collector alone."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


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
    tune_gc()
    try:
        asyncio.run(_main(settings))
    except ConfigError as exc:  # a BRAIN or SENDER that cannot be loaded
        exit_on_config_error(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
