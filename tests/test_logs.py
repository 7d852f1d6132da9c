"""Logs: one JSON object per line with the structured fields; no message text at INFO; the
persistence warning at start-up of both processes; persons only redacted."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest
from redis.asyncio import Redis

from scripts.dev.redis_server import RedisServer
from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.keys import Keys
from shared.logs import JsonFormatter, log_startup, make_formatter, redact_person
from shared.settings import ConfigError, Settings
from tests.receiver.support import running
from tests.support.helpers import API_KEY, APP_SECRET, TOKEN, RedisTarget
from tests.worker.support import REPO, TENANT, WorkerFleet, listening, push_message, wait_for
from worker.process import Worker

PERSON = "5491155550042"
SECRET_TEXT = "my-card-number-is-4111-zebra"
APPENDONLY_WARNING = "appendonly"


def json_lines(records: list[logging.LogRecord]) -> list[str]:
    formatter = JsonFormatter()
    return [formatter.format(r) for r in records]


def test_a_record_is_one_json_object_on_one_line_with_its_extra_fields() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(make_formatter("json"))
    logger = logging.getLogger("tests.logs.sample")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("turn failed\nbatch=%s", "b1", extra={"tenant": "t1", "person": "…0042#abc"})
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("it broke", extra={"batch": "b2", "outcome": "retry"})
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (orjson.loads(line) for line in lines)
    assert first["level"] == "WARNING" and first["logger"] == "tests.logs.sample"
    assert first["msg"] == "turn failed\nbatch=b1"
    assert first["tenant"] == "t1" and first["person"] == "…0042#abc"
    assert first["ts"].startswith("20") and "T" in first["ts"]
    assert "exc" not in first
    assert second["batch"] == "b2" and second["outcome"] == "retry"
    assert "RuntimeError: boom" in second["exc"]


def test_text_format_and_unknown_formats() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    assert make_formatter("text").format(record).endswith("INFO x: hello you")
    with pytest.raises(ValueError):
        make_formatter("xml")


def test_log_settings_are_read_and_validated() -> None:
    s = Settings.from_env({"LOG_FORMAT": "TEXT", "LOG_LEVEL": "debug"})
    assert (s.log_format, s.log_level) == ("text", "DEBUG")
    assert (Settings().log_format, Settings().log_level) == ("json", "INFO")
    with pytest.raises(ConfigError, match="LOG_FORMAT"):
        Settings.from_env({"LOG_FORMAT": "xml"})
    with pytest.raises(ConfigError, match="LOG_LEVEL"):
        Settings.from_env({"LOG_LEVEL": "loud"})


def test_start_up_is_one_short_line_at_info_and_every_setting_masked_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = Settings.from_env(
        {"REDIS_URL": "redis://user:hunter2@redis.internal:6379/0", "WHATSAPP_APP_SECRET": "s3"}
    )
    caplog.set_level(logging.DEBUG, logger="tests.logs.startup")
    log_startup(logging.getLogger("tests.logs.startup"), "worker", s)
    (info,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info == (
        "worker starting: brain=echo sender=outbox redis=redis://***@redis.internal:6379/0"
        " prefix=wa window=20s max_wait=60s"
    )
    (debug,) = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == f"worker settings: {s.masked()}"
    assert "hunter2" not in debug and "'s3'" not in debug


def test_redacted_persons_keep_four_digits_and_tell_persons_apart() -> None:
    one, other = redact_person(PERSON), redact_person("5491155559942")
    assert PERSON not in one and one.startswith("…0042#")
    assert one != other and one == redact_person(PERSON)


async def test_a_worker_turn_logs_no_message_text_at_info(
    redis: Redis, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    prefix = f"tl{uuid.uuid4().hex[:8]}"
    s = settings.with_overrides(
        key_prefix=prefix, brain="echo", debounce_window_s=0.05, max_wait_s=0.05
    )
    worker = Worker(s)
    task = asyncio.create_task(worker.run())
    try:

        async def up() -> bool:
            return await listening(redis, prefix) == 1

        await wait_for(up, "the worker listening")
        await push_message(redis, prefix, PERSON, "wamid.logs1", SECRET_TEXT)

        async def replied() -> list[bytes]:
            return list(await redis.lrange(Keys(prefix).tenant(TENANT).outbox, 0, -1))

        (reply,) = await wait_for(replied, "the echo reply in the outbox")
        assert SECRET_TEXT.encode() in reply  # the text did go through the turn
    finally:
        worker.handle_exit()
        await asyncio.wait_for(task, 10)
    lines = json_lines(caplog.records)
    assert any("worker starting" in line for line in lines)
    assert any(APPENDONLY_WARNING in line for line in lines)
    for line in lines:
        assert SECRET_TEXT not in line
        assert PERSON not in line
        assert APP_SECRET not in line  # the start-up configuration is masked


async def test_the_receiver_warns_when_appendonly_is_off(
    redis: Redis, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="receiver.app")
    async with running(settings):
        pass
    lines = json_lines(caplog.records)
    assert any("receiver starting" in line for line in lines)
    assert any("receiver settings" in line and "***" in line for line in lines)
    (warning,) = [r for r in caplog.records if APPENDONLY_WARNING in r.getMessage()]
    assert warning.levelno == logging.WARNING and warning.name == "receiver.app"
    assert all(APP_SECRET not in line for line in lines)


async def test_the_worker_warns_only_when_appendonly_is_off(
    redis: Redis, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="worker")
    await redis.config_set("appendonly", "yes")
    try:
        worker = Worker(settings.with_overrides(key_prefix=f"tl{uuid.uuid4().hex[:8]}"))
        await worker.startup()
        await worker.shutdown()
    finally:
        await redis.config_set("appendonly", "no")
    assert not [r for r in caplog.records if APPENDONLY_WARNING in r.getMessage()]


def test_python_m_worker_writes_json_lines_on_stdout(redis_server: RedisServer) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "REDIS_URL": redis_server.url,
        "KEY_PREFIX": f"tl{uuid.uuid4().hex[:8]}",
        "WHATSAPP_APP_SECRET": APP_SECRET,
        "BRAIN": "echo",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for raw in proc.stdout:
            lines.append(orjson.loads(raw))
            if " started" in lines[-1]["msg"]:
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += [orjson.loads(raw) for raw in out.splitlines()]
    assert proc.returncode == 0, err
    assert {"ts", "level", "logger", "msg"} <= set(lines[0])
    assert lines[0]["msg"].startswith("worker starting")
    assert APP_SECRET not in out.decode() and all(APP_SECRET not in line["msg"] for line in lines)
    assert any(line["level"] == "WARNING" and "appendonly" in line["msg"] for line in lines)
    assert lines[-1]["msg"].endswith("stopped")


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_httpx_request_lines_show_only_at_debug(level: str) -> None:
    """A fresh process, as each entry point configures it: httpx's line per request stays out
    at INFO, where ours and httpx's warnings stay in; so does the anthropic SDK's client's
    (`httpx2`, issue 21)."""
    script = (
        "import logging\n"
        "from shared.logs import configure_logging\n"
        f"configure_logging({level!r}, 'json')\n"
        "logging.getLogger('httpx').info('HTTP Request: POST http://graph/messages 200')\n"
        "logging.getLogger('httpx2').info('HTTP Request: POST http://ai/v1/messages 200')\n"
        "logging.getLogger('httpx').warning('httpx warning')\n"
        "logging.getLogger('httpx2').warning('httpx2 warning')\n"
        "logging.getLogger('worker.process').info('ours')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=30, check=True
    )
    messages = [orjson.loads(line)["msg"] for line in done.stdout.splitlines()]
    expected = ["httpx warning", "httpx2 warning", "ours"]
    if level == "DEBUG":
        expected[:0] = [
            "HTTP Request: POST http://graph/messages 200",
            "HTTP Request: POST http://ai/v1/messages 200",
        ]
    assert messages == expected, done.stdout


# Where this product's own lines come from; any other logger is a library's.
OUR_LOGGERS = ("worker", "shared", "receiver", "scripts", "tests")


async def test_a_real_ai_turn_writes_no_info_line_from_a_library(
    redis: Redis,
    redis_target: RedisTarget,
    ai: MessagesApiStandIn,
    graph: GraphApiStandIn,
    tmp_path: Path,
) -> None:
    """Issue 21: the anthropic SDK's HTTP client (logger `httpx2`) wrote a line per Anthropic
    request at INFO, where the docs say a line per HTTP call shows only at DEBUG. A real
    `python -m worker` at LOG_LEVEL=INFO, as in production: the Claude brain through the real
    SDK to the Messages API stand-in, the reply through httpx to the Graph API stand-in. Every
    line at INFO or below is ours; a library's warnings would still show."""
    prefix = f"tl{uuid.uuid4().hex[:8]}"
    fleet = WorkerFleet(redis, redis_target.url, prefix, tmp_path, redis_target.cluster)
    try:
        await fleet.start(
            BRAIN="anthropic",
            ANTHROPIC_API_KEY=API_KEY,
            ANTHROPIC_BASE_URL=ai.url,
            WHATSAPP_ACCESS_TOKEN=TOKEN,
            WHATSAPP_API_BASE_URL=graph.url,
            DEBOUNCE_WINDOW_S="0.05",
            MAX_WAIT_S="0.05",
        )
        await push_message(redis, prefix, PERSON, "wamid.logs.ai", "hola")

        async def replied() -> bool:
            return bool(graph.sent_texts(PERSON))

        await wait_for(replied, "the AI's reply sent to the Graph API stand-in")
    finally:
        fleet.close()
    lines = [orjson.loads(raw) for raw in fleet.logs[0].read_text().splitlines()]
    assert ai.requests and any(line["msg"].startswith("ai usage") for line in lines), lines
    chatter = [
        line
        for line in lines
        if line["level"] in ("DEBUG", "INFO") and line["logger"].split(".")[0] not in OUR_LOGGERS
    ]
    assert chatter == []
