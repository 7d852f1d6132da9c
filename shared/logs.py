"""Logging for both processes: one JSON object per line on stdout (or plain text for humans).

`configure_logging(level, fmt)` is called once at each entry point. A JSON line reads
`{"ts": "2026-11-29T20:31:02.114Z", "level": "INFO", "logger": "worker.process", "msg": "…",
"tenant": "…", …}`: fields passed with `extra={...}` ride along, an exception's traceback goes
under "exc". Persons appear only through `redact_person`, message bodies never at INFO.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

from shared.settings import Settings

LOG_FORMATS = ("json", "text")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The attributes every LogRecord has; anything else on a record came from `extra={...}`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's terminal-coloured copy of the message
}
# uvicorn configures these with text handlers of their own (not propagating to the root).
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
# The HTTP client libraries, which log every request they make at INFO: httpx a line per Graph
# API and Chatwoot call, httpx2 (the anthropic SDK's own client) one per Anthropic call: three
# or four per turn, more than the worker's own lines (which already say how each call ended).
# Their transports (httpcore*) and the SDK itself (anthropic) log requests at DEBUG, and a
# retry at INFO. The one place their level is set: shown at LOG_LEVEL=DEBUG, as
# docs/configuration.md says, their warnings always. A library new to the process that logs
# at INFO shows up in tests/test_logs.py's real turn.
CHATTY_AT_INFO = ("httpx", "httpx2", "httpcore", "httpcore2", "anthropic")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (orjson never emits a newline)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in line:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=repr).decode()


def make_formatter(fmt: str = "json") -> logging.Formatter:
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Give the root logger a stdout handler with our format, unless someone else gave it one.

    Under uvicorn the server configures its own loggers (not the root) with text handlers;
    in the json format they are routed through ours too, so every line of the process is one
    JSON object (call this before uvicorn's first line: receiver.app.create_app does). A
    root logger that already has handlers (tests, an embedding app) is left alone.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    root.setLevel(level.upper())
    if root.level > logging.DEBUG:
        for name in CHATTY_AT_INFO:
            logging.getLogger(name).setLevel(max(root.level, logging.WARNING))
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(make_formatter(fmt))
    root.addHandler(handler)
    if fmt == "json":
        for name in SERVER_LOGGERS:
            server = logging.getLogger(name)
            if not server.handlers and not server.propagate:
                # uvicorn turned this one off (`--no-access-log` leaves uvicorn.access with
                # no handler and no propagation). Routing it to the root would turn it back
                # on: uvicorn logs access lines whenever the logger `hasHandlers()`.
                continue
            server.handlers.clear()
            server.propagate = True


def served_by_uvicorn() -> bool:
    """Whether uvicorn's own logging is set up and the root's is not: the process is uvicorn's
    command line (it configures its loggers before importing the app)."""
    return bool(logging.getLogger("uvicorn").handlers) and not logging.getLogger().handlers


def redact_person(person: str) -> str:
    """A person id fit for logs: its last 4 characters and a short hash, e.g. `…0001#3f9a1c`.

    Enough to follow one conversation through the logs and to tell two persons apart, not
    enough to read anyone's phone number.
    """
    digest = hashlib.sha256(person.encode()).hexdigest()[:6]
    return f"…{person[-4:]}#{digest}"


def log_startup(logger: logging.Logger, process: str, settings: Settings) -> None:
    """Once at start-up: what a reader checks first on one short INFO line, and the whole
    effective configuration, secrets masked (`Settings.masked()`), at DEBUG."""
    shown = settings.masked()
    logger.info(
        "%s starting: brain=%s sender=%s redis=%s prefix=%s window=%gs max_wait=%gs",
        process,
        shown["brain"],
        shown["sender"],
        shown["redis_url"],
        shown["key_prefix"],
        shown["debounce_window_s"],
        shown["max_wait_s"],
    )
    logger.debug("%s settings: %s", process, shown)


async def warn_if_not_persistent(redis: Any, timeout_s: float, logger: logging.Logger) -> None:
    """Warn when Redis runs without appendonly; if CONFIG is refused (managed Redis), debug."""
    try:
        config = await asyncio.wait_for(redis.config_get("appendonly"), timeout_s)
    except Exception as exc:
        logger.debug("cannot check Redis persistence (CONFIG GET appendonly refused: %r)", exc)
        return
    if appendonly_off(config):
        logger.warning("Redis persistence (appendonly) is off: acknowledged items can be lost")


def appendonly_off(config: Any) -> bool:
    value = config.get("appendonly", config.get(b"appendonly")) if config else None
    return value in ("no", b"no")
