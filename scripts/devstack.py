"""The local dev stack behind `scripts/run`: Redis, the receiver, N workers and the demo.

Like foreman, it runs each process as a child with prefixed, line-buffered output
(`web.1 | ...`, `worker.1 | ...`), stops them all on Ctrl-C / SIGTERM (SIGTERM first, a kill
after a grace period, the embedded Redis last so it writes its AOF), and stops the whole stack
when one of them dies. Without `REDIS_URL` it starts an embedded Redis whose data persists
under `.devstack/redis`. Without `WHATSAPP_ACCESS_TOKEN` it also starts the local stand-in for
the provider, `scripts/graph_standin` (`graph.1`), and points the workers' WhatsApp sender at it
with a dev token: replies travel worker -> Graph API (stand-in) -> signed `sent`, `delivered`,
`read` status webhooks -> receiver -> worker, as in production (`--sender outbox`: the Redis
outbox instead, the old way). Without `CHATWOOT_API_ACCESS_TOKEN` (and `CHATWOOT_BASE_URL`) it
starts the Chatwoot API stand-in, `scripts/chatwoot_standin` (`chatwoot.1`), points the
workers' Chatwoot sender at it with a dev token and gives the receiver a dev Chatwoot webhook
secret: the stand-in posts each reply the bot creates back to the receiver as a signed
`message_created` (outgoing) webhook, as Chatwoot does, which the receiver must ignore.
Without `TRANSCRIBE_BASE_URL` it starts the speech-to-text stand-in,
`scripts/transcribe_standin` (`stt.1`), and points the workers' voice-note transcription at it
with a dev key.
Without real credentials it runs `scripts/simulate`, which sends signed webhook bursts (WhatsApp
and, with the Chatwoot stand-in, Chatwoot) and shows each burst turning into a single reply.

The receiver and the workers are the `Procfile`'s `web` and `worker` lines, run as
`sh -c 'exec <line>'` with `.venv/bin` first on PATH, so dev runs exactly what production runs
(`--workers N`: N copies of `worker`). honcho (the Python Foreman) was tried for this and not
kept: its children outlive it when it is SIGKILLed (each runs in a new session, nothing ties
it to honcho's life), and it SIGKILLs every process 5 s after a stop (a hard-coded KILL_WAIT),
inside the workers' 10 s shutdown grace.

Children run in their own process groups: a Ctrl-C in the terminal reaches only this process,
which forwards one SIGTERM. (A second signal makes uvicorn skip its graceful shutdown.) Each
child, the embedded Redis included, is started through scripts/dev/lifeline.py, which arms Linux's
PR_SET_PDEATHSIG and execs it: if this process is killed outright, the kernel sends every child
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from scripts.dev import lifeline
from scripts.dev.redis_server import RedisServer, free_port
from shared.settings import ConfigError, Settings

REPO = Path(__file__).resolve().parent.parent
PROCFILE = REPO / "Procfile"

DEFAULT_REDIS_PORT = 6390
DEFAULT_PORT = 8000
STOP_GRACE_S = 12.0
SAME_SIGNAL_S = 1.0
READY_TIMEOUT_S = 30.0
LINE_LIMIT_BYTES = 1024 * 1024

# Short timers so a burst is visibly grouped within seconds, and log lines for a person to read
# (production's default is JSON); a value the user set always wins.
DEV_DEFAULTS = {
    "LOG_FORMAT": "text",
    "WHATSAPP_APP_SECRET": "dev-secret",
    "WHATSAPP_VERIFY_TOKEN": "dev-verify",
    "METRICS_TOKEN": "dev-metrics",  # curl -H 'Authorization: Bearer dev-metrics' …/metrics
    "DEBOUNCE_WINDOW_S": "3",
    "MAX_WAIT_S": "10",
    "LEASE_S": "30",
    "LEASE_RENEW_S": "10",
}
COLOURS = ("36", "33", "32", "35", "34", "96", "93", "92", "95", "94")
# The date and time a LOG_FORMAT=text line starts with: the console's prefix has the time.
LOG_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
# The bearer token the workers send to the Graph API stand-in with (never a real one).
DEV_GRAPH_TOKEN = "dev-graph-token"
GRAPH_STANDIN = REPO / "scripts" / "graph_standin"
# With the Chatwoot stand-in: the API token it accepts, and the secret its webhooks (and the
# demo's) are signed with; dev values, shown in the banner.
DEV_CHATWOOT_TOKEN = "dev-chatwoot-token"
DEV_CHATWOOT_SECRET = "dev-chatwoot-secret"
CHATWOOT_STANDIN = REPO / "scripts" / "chatwoot_standin"
# The speech-to-text stand-in's bearer key (a dev value).
DEV_TRANSCRIBE_KEY = "dev-stt-key"
TRANSCRIBE_STANDIN = REPO / "scripts" / "transcribe_standin"
# Replies go to the stand-in (standin), to the Redis outbox (outbox), or wherever the user's own
# WHATSAPP_ACCESS_TOKEN / WHATSAPP_API_BASE_URL / SENDER say (env).
SENDERS = ("standin", "outbox")


@dataclass(frozen=True)
class Options:
    workers: int
    port: int
    demo: bool
    bursts: int | None
    exit_after_demo: bool
    data_dir: Path
    redis_port: int | None
    sender: str = "standin"
    chatwoot_standin: bool = False

    @property
    def graph_standin(self) -> bool:
        return self.sender == "standin"


def parse_options(argv: Sequence[str], environ: Mapping[str, str]) -> Options:
    parser = argparse.ArgumentParser(
        prog="scripts/run",
        description="Run Redis, the receiver, the workers and (without credentials) the demo.",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--port", type=int, help=f"receiver port (default $PORT or {DEFAULT_PORT})")
    demo = parser.add_mutually_exclusive_group()
    demo.add_argument("--demo", dest="demo", action="store_true", default=None, help="force it on")
    demo.add_argument("--no-demo", dest="demo", action="store_false", help="no demo traffic")
    parser.add_argument("--bursts", type=int, help="the demo sends N bursts, then stays quiet")
    parser.add_argument(
        "--exit-after-demo",
        action="store_true",
        help="with --bursts: stop once the replies arrived (or 60 s passed); "
        "exit 0 only if every burst got exactly one reply",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / ".devstack",
        help="where the embedded Redis keeps its data (default .devstack/)",
    )
    parser.add_argument(
        "--redis-port",
        type=int,
        help=f"port of the embedded Redis (default {DEFAULT_REDIS_PORT} if free, else any)",
    )
    parser.add_argument(
        "--sender",
        choices=SENDERS,
        help="where replies go: standin (the local Graph API stand-in, statuses come back; the "
        "default without WHATSAPP_ACCESS_TOKEN, WHATSAPP_API_BASE_URL or SENDER) or outbox "
        "(the Redis outbox list, no statuses)",
    )
    parser.add_argument(
        "--no-chatwoot",
        action="store_true",
        help="do not start the Chatwoot API stand-in (it starts without "
        "CHATWOOT_API_ACCESS_TOKEN and CHATWOOT_BASE_URL)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.bursts is not None and args.bursts < 1:
        parser.error("--bursts must be at least 1")
    if args.exit_after_demo and args.bursts is None:
        parser.error("--exit-after-demo needs --bursts N")
    if args.bursts is not None and args.demo is False:
        parser.error("--bursts is a demo option; drop --no-demo")
    wants_demo = args.demo
    if wants_demo is None:
        has_credentials = environ.get("WHATSAPP_ACCESS_TOKEN") or environ.get("ANTHROPIC_API_KEY")
        wants_demo = args.bursts is not None or not has_credentials
    users_sender = environ.get("SENDER", "")
    if args.sender == "standin":
        if environ.get("WHATSAPP_API_BASE_URL"):
            parser.error("--sender standin: unset WHATSAPP_API_BASE_URL (the stand-in's URL)")
        if users_sender not in ("", "whatsapp"):
            parser.error(f"--sender standin: SENDER={users_sender} is set; unset it")
    sender = args.sender
    if sender is None:
        own = environ.get("WHATSAPP_ACCESS_TOKEN") or environ.get("WHATSAPP_API_BASE_URL")
        sender = "env" if own or users_sender not in ("", "whatsapp") else "standin"
    port = args.port or int(environ.get("PORT") or DEFAULT_PORT)
    own_chatwoot = environ.get("CHATWOOT_API_ACCESS_TOKEN") or environ.get("CHATWOOT_BASE_URL")
    return Options(
        workers=args.workers,
        port=port,
        demo=wants_demo,
        bursts=args.bursts,
        exit_after_demo=args.exit_after_demo,
        data_dir=args.data_dir.resolve(),
        redis_port=args.redis_port,
        sender=sender,
        chatwoot_standin=not (own_chatwoot or args.no_chatwoot),
    )


def dev_environment(
    environ: Mapping[str, str],
    redis_url: str,
    port: int,
    graph_url: str | None = None,
    sender: str = "env",
    chatwoot_url: str | None = None,
    transcribe_url: str | None = None,
) -> dict[str, str]:
    """The children's environment: the user's, plus dev defaults for what the user left unset.

    With `graph_url` (the stand-in's) the workers get a dev token and that URL for the Graph API
    unless the user set them; `sender="outbox"` sends replies to the Redis outbox. With
    `chatwoot_url` (the Chatwoot stand-in's) the workers get a dev Chatwoot token and that URL,
    and the receiver a dev webhook secret (unless the user set a secret or a token). With
    `transcribe_url` (the speech-to-text stand-in's) the workers transcribe voice notes there."""
    env = dict(environ)
    for name, value in DEV_DEFAULTS.items():
        if not env.get(name):
            env[name] = value
    if graph_url is not None:
        # The stand-in reads the accepted token and the webhook secret from its environment
        # too, so neither appears on a command line.
        for name, value in (
            ("WHATSAPP_ACCESS_TOKEN", DEV_GRAPH_TOKEN),
            ("WHATSAPP_API_BASE_URL", graph_url),
            ("SENDER", "whatsapp"),
        ):
            if not env.get(name):
                env[name] = value
    elif sender == "outbox":
        env["SENDER"] = "outbox"
    if chatwoot_url is not None:
        for name, value in (
            ("CHATWOOT_API_ACCESS_TOKEN", DEV_CHATWOOT_TOKEN),
            ("CHATWOOT_BASE_URL", chatwoot_url),
        ):
            if not env.get(name):
                env[name] = value
        if not env.get("CHATWOOT_WEBHOOK_SECRET") and not env.get("CHATWOOT_WEBHOOK_TOKEN"):
            env["CHATWOOT_WEBHOOK_SECRET"] = DEV_CHATWOOT_SECRET
    if transcribe_url is not None and not env.get("TRANSCRIBE_BASE_URL"):
        env["TRANSCRIBE_BASE_URL"] = f"{transcribe_url}/v1"
        env["TRANSCRIBE_API_KEY"] = env.get("TRANSCRIBE_API_KEY") or DEV_TRANSCRIBE_KEY
    # Keep our defaults consistent with a longer window or a shorter lease the user chose
    # (a value that is not a number is left to Settings, which reports it by name).
    window, lease = _number(env["DEBOUNCE_WINDOW_S"]), _number(env["LEASE_S"])
    if not environ.get("MAX_WAIT_S") and window is not None:
        env["MAX_WAIT_S"] = f"{max(10.0, window):g}"
    if not environ.get("LEASE_RENEW_S") and lease is not None:
        env["LEASE_RENEW_S"] = f"{min(10.0, lease / 3):g}"
    env["REDIS_URL"] = redis_url
    env["PORT"] = str(port)
    env["PYTHONUNBUFFERED"] = "1"
    # The Procfile binds ${WEB_HOST:-0.0.0.0} (what a platform's router needs); a dev stack
    # listens on loopback only unless the user asks for more.
    env.setdefault("WEB_HOST", "127.0.0.1")
    # The Procfile says `uvicorn` and `python`: this environment's, whatever the user's PATH.
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH") or os.defpath])
    return env


class ProcfileError(ValueError):
    """A Procfile the dev stack cannot run; the message names the file and line."""


PROCFILE_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(\S.*)$")


def read_procfile(path: Path) -> dict[str, str]:
    """The `name: command` lines of a Procfile (blank lines and `#` comments skipped)."""
    commands: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        found = PROCFILE_LINE.match(line)
        if found is None:
            raise ProcfileError(f"{path}:{number}: not a 'name: command' line: {line!r}")
        commands[found.group(1)] = found.group(2).strip()
    for needed in ("web", "worker"):
        if needed not in commands:
            raise ProcfileError(f"{path}: no '{needed}:' line")
    return commands


def procfile_argv(command: str) -> list[str]:
    """How a Procfile line is run: by the shell (it expands ${PORT:-8000}), which `exec`s the
    command so the pid we supervise and signal is the command's own."""
    return ["/bin/sh", "-c", f"exec {command}"]


def _number(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Console:
    """Writes `HH:MM:SS name | line`, foreman style, with a colour per name on a terminal."""

    def __init__(self, names: Sequence[str]) -> None:
        self.width = max(len(n) for n in names)
        self.colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        self.colours = {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(names)}

    def line(self, name: str, text: str) -> None:
        text = LOG_TIMESTAMP.sub("", text, count=1)
        prefix = f"{time.strftime('%H:%M:%S')} {name.ljust(self.width)} |"
        if self.colour:
            prefix = f"\x1b[{self.colours.get(name, '0')}m{prefix}\x1b[0m"
        sys.stdout.write(f"{prefix} {text}\n")
        sys.stdout.flush()

    def say(self, text: str) -> None:
        self.line("devstack", text)


@dataclass
class Child:
    """One supervised process; `expected_exit` marks the demo, which may finish on its own."""

    name: str
    argv: list[str]
    expected_exit: bool = False
    process: asyncio.subprocess.Process | None = None
    watcher: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def signal(self, signum: int) -> None:
        if self.running:
            assert self.process is not None
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass


@dataclass(frozen=True)
class Exited:
    child: Child
    returncode: int


@dataclass(frozen=True)
class Ready:
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Stop:
    signum: int


Event = Exited | Ready | Stop


class DevStack:
    def __init__(self, options: Options, environ: Mapping[str, str]) -> None:
        self.options = options
        self.environ = environ
        self.redis: RedisServer | None = None
        self.lock: IO[str] | None = None
        self.children: list[Child] = []
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.stopping = False
        self.force = asyncio.Event()
        self.signalled_at: float | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.graph_port: int | None = None
        self.chatwoot_port: int | None = None
        self.transcribe_port: int | None = None
        names = ["devstack", "web.1", "graph.1", "chatwoot.1", "stt.1", "demo"]
        self.console = Console(names + [f"worker.{i + 1}" for i in range(options.workers)])

    # --- start ----------------------------------------------------------------------------
    async def run(self) -> int:
        self.install_signal_handlers()
        if not port_is_free(self.options.port):
            self.console.say(f"port {self.options.port} is in use: pass --port or set PORT")
            return 2
        try:
            redis_url = self.environ.get("REDIS_URL") or self.embedded_redis()
            if self.options.graph_standin:
                self.graph_port = free_port()
            if self.options.chatwoot_standin:
                self.chatwoot_port = free_port()
            if not self.environ.get("TRANSCRIBE_BASE_URL"):
                self.transcribe_port = free_port()
            env = dev_environment(
                self.environ,
                redis_url,
                self.options.port,
                self.graph_url,
                self.options.sender,
                self.chatwoot_url,
                self.transcribe_url,
            )
            settings = Settings.from_env(env)
            children = self.service_children()
            self.start_redis()
        except (ConfigError, ProcfileError, RuntimeError) as exc:
            self.console.say(f"cannot start: {exc}")
            return 2
        if not lifeline.supported():
            self.console.say("no PR_SET_PDEATHSIG: if this process is killed, stop its children")
        try:
            for child in children:
                await self.start(child, env)
            self.tasks.add(asyncio.create_task(self.wait_ready()))
            return await self.supervise(env, settings)
        finally:
            await self.stop_children()
            self.stop_redis()

    def embedded_redis(self) -> str:
        port = self.options.redis_port
        if port is None:
            port = DEFAULT_REDIS_PORT if port_is_free(DEFAULT_REDIS_PORT) else free_port()
        directory = self.options.data_dir / "redis"
        self.redis = RedisServer(
            port=port, directory=directory, appendonly=True, die_with_parent=True
        )
        return self.redis.url

    def start_redis(self) -> None:
        if self.redis is None:
            return
        self.lock_data_dir()
        self.redis.start()
        pid = self.redis.process.pid if self.redis.process else "?"
        self.console.say(
            f"embedded Redis on port {self.redis.port} (pid {pid}), data in {self.redis.directory}"
        )

    def lock_data_dir(self) -> None:
        """Two Redis servers appending to one AOF would corrupt it: one stack per data dir."""
        self.options.data_dir.mkdir(parents=True, exist_ok=True)
        self.lock = (self.options.data_dir / "devstack.lock").open("w")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                f"another devstack uses {self.options.data_dir}: stop it or pass --data-dir"
            ) from None

    def service_children(self) -> list[Child]:
        procfile = read_procfile(PROCFILE)
        workers = [
            Child(f"worker.{i + 1}", procfile_argv(procfile["worker"]))
            for i in range(self.options.workers)
        ]
        graph = []
        if self.graph_url is not None:
            # Token and app secret come from the environment (WHATSAPP_ACCESS_TOKEN and
            # WHATSAPP_APP_SECRET, the workers' and the receiver's): not on the command line.
            argv = [str(GRAPH_STANDIN), "--port", str(self.graph_port)]
            argv += ["--webhook-url", f"{self.receiver_url}/webhooks/whatsapp"]
            argv += ["--log-level", "warning"]  # no access log line per request (the demo polls)
            graph = [Child("graph.1", argv)]
        if self.chatwoot_url is not None:
            # It accepts CHATWOOT_API_ACCESS_TOKEN and signs its webhooks with
            # CHATWOOT_WEBHOOK_SECRET (or carries CHATWOOT_WEBHOOK_TOKEN), from the environment.
            argv = [str(CHATWOOT_STANDIN), "--port", str(self.chatwoot_port)]
            argv += ["--webhook-url", f"{self.receiver_url}/webhooks/chatwoot"]
            argv += ["--log-level", "warning"]
            graph.append(Child("chatwoot.1", argv))
        if self.transcribe_url is not None:  # it accepts TRANSCRIBE_API_KEY, from the environment
            argv = [str(TRANSCRIBE_STANDIN), "--port", str(self.transcribe_port)]
            graph.append(Child("stt.1", [*argv, "--log-level", "warning"]))
        return [*graph, Child("web.1", procfile_argv(procfile["web"])), *workers]

    def demo_child(self) -> Child:
        # The secret, REDIS_URL and KEY_PREFIX reach the demo through its environment, not its
        # command line, which any user of the machine can read.
        argv = [sys.executable, "-m", "scripts.simulate", "--url", self.receiver_url]
        if self.options.bursts is not None:
            argv += ["--bursts", str(self.options.bursts)]
        if self.graph_url is not None:
            argv += ["--graph-url", self.graph_url]
        if self.chatwoot_url is not None:
            argv += ["--chatwoot-url", self.chatwoot_url]
        return Child("demo", argv, expected_exit=self.options.bursts is not None)

    async def start(self, child: Child, env: Mapping[str, str]) -> None:
        child.process = await asyncio.create_subprocess_exec(
            *lifeline.command(child.argv),
            cwd=REPO,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            process_group=0,
            limit=LINE_LIMIT_BYTES,
        )
        self.children.append(child)
        self.console.say(f"started {child.name} (pid {child.process.pid})")
        child.watcher = asyncio.create_task(self.watch(child))

    async def watch(self, child: Child) -> None:
        assert child.process is not None and child.process.stdout is not None
        stream = child.process.stdout
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the limit: show what we have
                raw = await stream.read(LINE_LIMIT_BYTES)
            if not raw:
                break
            self.console.line(child.name, raw.decode(errors="replace").rstrip("\r\n"))
        returncode = await child.process.wait()
        await self.events.put(Exited(child, returncode))

    @property
    def receiver_url(self) -> str:
        return f"http://127.0.0.1:{self.options.port}"

    @property
    def graph_url(self) -> str | None:
        return None if self.graph_port is None else f"http://127.0.0.1:{self.graph_port}"

    @property
    def chatwoot_url(self) -> str | None:
        return None if self.chatwoot_port is None else f"http://127.0.0.1:{self.chatwoot_port}"

    @property
    def transcribe_url(self) -> str | None:
        port = self.transcribe_port
        return None if port is None else f"http://127.0.0.1:{port}"

    async def wait_ready(self) -> None:
        """The receiver's /readyz answers 200 (and the stand-in's /_health, if it runs)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        detail = "no answer"
        checks = [f"{self.receiver_url}/readyz"]
        if self.graph_url is not None:
            checks.append(f"{self.graph_url}/_health")
        if self.chatwoot_url is not None:
            checks.append(f"{self.chatwoot_url}/_health")
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline and not self.stopping:
                try:
                    while checks:
                        response = await client.get(checks[0])
                        if response.status_code != 200:
                            detail = f"HTTP {response.status_code}: {response.text[:200]}"
                            break
                        checks.pop(0)
                    if not checks:
                        await self.events.put(Ready(True))
                        return
                except httpx.HTTPError as exc:
                    detail = type(exc).__name__
                await asyncio.sleep(0.2)
        await self.events.put(Ready(False, f"{checks[0]}: {detail}"))

    # --- supervise ------------------------------------------------------------------------
    async def supervise(self, env: Mapping[str, str], settings: Settings) -> int:
        while True:
            event = await self.events.get()
            if isinstance(event, Stop):
                self.console.say(f"{signal.Signals(event.signum).name} received, stopping")
                return 0
            if isinstance(event, Ready):
                if not event.ok:
                    self.console.say(
                        f"not ready after {READY_TIMEOUT_S:g}s ({event.detail}); stopping"
                    )
                    return 1
                self.print_banner(env, settings)
                if self.options.demo:
                    await self.start(self.demo_child(), env)
                continue
            outcome = self.on_exit(event)
            if outcome is not None:
                return outcome

    def on_exit(self, event: Exited) -> int | None:
        """What a child's exit means: None to keep running, else the stack's exit code."""
        child, code = event.child, event.returncode
        if child.expected_exit and code == 0:
            if self.options.exit_after_demo:
                self.console.say("demo finished: every burst got exactly one reply; stopping")
                return 0
            self.console.say("demo finished; the stack keeps running (Ctrl-C to stop)")
            return None
        if child.expected_exit:
            self.console.say(f"demo failed (exit {code}): see its lines above; stopping")
            return code or 1
        self.console.say(f"{child.name} exited unexpectedly (exit {code}); stopping the stack")
        return 1

    def print_banner(self, env: Mapping[str, str], settings: Settings) -> None:
        say = self.console.say
        pattern = f"'{settings.key_prefix}:*'"
        say(
            f"receiver  {self.receiver_url}  "
            "(POST /webhooks/whatsapp, POST /webhooks/chatwoot, GET /readyz)"
        )
        if self.redis is not None:
            say(f"redis     {self.redis.url}  (embedded, AOF on, data in {self.redis.directory})")
            say(
                f"inspect   REDIS_URL={self.redis.url} .venv/bin/python -m worker.inspect "
                "[TENANT [PERSON]]"
            )
            say(f"          redis-cli -p {self.redis.port} --scan --pattern {pattern}")
        else:
            say("redis     $REDIS_URL (yours)")
            say("inspect   .venv/bin/python -m worker.inspect [TENANT [PERSON]]")
            say(f'          redis-cli -u "$REDIS_URL" --scan --pattern {pattern}')
        say(
            f"workers   {self.options.workers}, debounce {settings.debounce_window_s:g}s, "
            f"max wait {settings.max_wait_s:g}s, brain {settings.brain}, "
            f"sender {settings.sender}"
        )
        if self.graph_url is not None:
            say(
                f"graph     {self.graph_url}  (Graph API stand-in: sent/delivered/read statuses "
                "back to the receiver; GET /_requests, POST /_control)"
            )
        elif settings.sender == "outbox":
            say("replies   to the Redis outbox lists, no delivery statuses (--sender outbox)")
        if self.chatwoot_url is not None:
            self.chatwoot_banner(env)
        if self.transcribe_url is not None:
            say(f"stt       {self.transcribe_url}/v1  (speech-to-text stand-in for voice notes)")
        if self.options.demo:
            chatwoot = " and to a Chatwoot inbox" if self.chatwoot_url is not None else ""
            say(
                "demo      on: scripts/simulate, signed bursts from a few people to three tenants"
                f"{chatwoot} (--no-demo: off)"
            )
        else:
            say("demo      off (--demo turns it on)")
        say("Ctrl-C to stop")

    def chatwoot_banner(self, env: Mapping[str, str]) -> None:
        """The Chatwoot stand-in's URL and the dev credentials (never a value the user set)."""
        say = self.console.say
        say(
            f"chatwoot  {self.chatwoot_url}  (Chatwoot API stand-in = CHATWOOT_BASE_URL; posts "
            "each reply back as a signed outgoing message_created, which the receiver ignores; "
            "GET /_requests, POST /_control)"
        )
        dev = [
            f"{name}={value}"
            for name, value in (
                ("CHATWOOT_API_ACCESS_TOKEN", DEV_CHATWOOT_TOKEN),
                ("CHATWOOT_WEBHOOK_SECRET", DEV_CHATWOOT_SECRET),
            )
            if not self.environ.get(name) and env.get(name) == value
        ]
        if dev:
            say(f"          dev {', '.join(dev)}")

    # --- stop -----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.on_signal, signum)

    def on_signal(self, signum: int) -> None:
        now = time.monotonic()
        if self.signalled_at is not None and now - self.signalled_at < SAME_SIGNAL_S:
            return  # one stop request delivered twice (`timeout` signals us and our group)
        first = self.signalled_at is None
        self.signalled_at = now
        if first and not self.stopping:
            self.events.put_nowait(Stop(signum))
            return
        self.console.say("second signal: killing the children now")
        self.force.set()

    async def stop_children(self) -> None:
        self.stopping = True
        alive = [c for c in self.children if c.running]
        if not alive:
            return
        self.console.say(f"stopping {', '.join(c.name for c in alive)} (SIGTERM)")
        for child in alive:
            child.signal(signal.SIGTERM)
        exited = asyncio.create_task(self.wait_exited(alive))
        forced = asyncio.create_task(self.force.wait())
        await asyncio.wait({exited, forced}, timeout=STOP_GRACE_S, return_when="FIRST_COMPLETED")
        forced.cancel()
        for child in alive:
            if child.running:
                why = "" if self.force.is_set() else f" after {STOP_GRACE_S:g}s"
                self.console.say(f"{child.name} still running{why}: killing it")
                child.signal(signal.SIGKILL)
        await exited
        # Let the watchers print the children's last lines (bounded: a grandchild may hold a pipe).
        watchers = [c.watcher for c in alive if c.watcher]
        if watchers:
            await asyncio.wait(watchers, timeout=2.0)

    @staticmethod
    async def wait_exited(children: Sequence[Child]) -> None:
        for child in children:
            if child.process is not None:
                await child.process.wait()

    def stop_redis(self) -> None:
        if self.redis is not None:
            self.console.say("stopping embedded Redis (SIGTERM, it writes its AOF)")
            self.redis.stop()
            self.redis = None


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(sys.argv[1:] if argv is None else argv, os.environ)
    return asyncio.run(DevStack(options, os.environ).run())


if __name__ == "__main__":
    sys.exit(main())
