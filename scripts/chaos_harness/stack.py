"""The system under test as real processes: Redis (AOF), both stand-ins, a receiver, workers.

    stack = Stack(run_dir, worker_env={"LEASE_S": "1.5"}, workers=3)
    await stack.start()
    ...                         # stack.receiver_url, stack.kill_worker(pid), stack.redis_restart()
    await stack.close()

Every process is a child of this one, started as the Procfile and the dev stack start them
(`uvicorn receiver.app:create_app --factory`, `python -m worker`,
`python -m scripts.standins.graph_api`, ...), with its output in `run_dir/<name>.log`. The
workers run the real `anthropic` brain and the real `whatsapp` sender, pointed at the stand-ins
through `ANTHROPIC_BASE_URL` and `WHATSAPP_API_BASE_URL`. The Graph API stand-in posts signed
status webhooks back to the receiver, as Meta does. With `chatwoot=True` the Chatwoot API
stand-in runs too (`python -m scripts.standins.chatwoot_api`), posting its customers' messages
to the receiver as an account webhook does (once, whatever the answer), and the workers answer
Chatwoot conversations through it (`CHATWOOT_BASE_URL`, `CHATWOOT_API_ACCESS_TOKEN`), which also
turns their catch-up on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from receiver.http_protocol import UVICORN_HTTP
from scripts.dev.redis_server import RedisServer, free_port
from shared.fleet.wake import listening_workers
from shared.keys import Keys

REPO = Path(__file__).resolve().parents[2]
PREFIX = "chaos"
APP_SECRET = "chaos-app-secret"
GRAPH_TOKEN = "chaos-graph-token"
AI_KEY = "chaos-ai-key"
AI_MODEL = "claude-chaos-model"
CHATWOOT_TOKEN = "chaos-chatwoot-token"
CHATWOOT_SECRET = "chaos-chatwoot-secret"
CHATWOOT_TENANT = "cw-1-3"  # account 1, the stand-in's inbox 3

# What the product reads from the environment: a developer's own values must not leak in.
_OWN_PREFIXES = ("WHATSAPP_", "ANTHROPIC_", "CHATWOOT_", "REDIS_")
_OWN_NAMES = frozenset(
    "KEY_PREFIX PORT AI_MODEL AI_MAX_TOKENS AI_TIMEOUT_S SYSTEM_PROMPT MEMORY_TURNS MEMORY_TTL_S "
    "BRAIN SENDER TENANTS_FILE DEBOUNCE_WINDOW_S MAX_WAIT_S LEASE_S LEASE_RENEW_S MAX_ATTEMPTS "
    "RETRY_BASE_S REVIEW_AFTER_S WORKER_CONCURRENCY POLL_INTERVAL_S SHUTDOWN_GRACE_S "
    "DEDUPE_TTL_S MAX_BODY_BYTES LOG_LEVEL LOG_FORMAT AI_OUTAGE_PAUSE_S "
    "AI_OUTAGE_MAX_PAUSE_S HUMAN_PAUSE_S".split()
)


def clean_environ() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in _OWN_NAMES and not k.startswith(_OWN_PREFIXES)
    }


class Child:
    """One child process with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive:
            self.process.send_signal(sig)

    def wait(self, timeout_s: float = 10.0) -> None:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def decoded(value: object) -> str:
    """A Redis answer as text (the harness's client answers bytes; redis-py's types are wider)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Stack:
    def __init__(
        self,
        run_dir: Path,
        *,
        workers: int = 3,
        worker_env: dict[str, str] | None = None,
        receiver_env: dict[str, str] | None = None,
        status_delays: tuple[float, ...] = (0.05,),
        chatwoot: bool = False,
    ) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.worker_count = workers
        self.worker_env = worker_env or {}
        self.receiver_env = receiver_env or {}
        self.status_delays = status_delays
        self.keys = Keys(PREFIX)
        self.redis_server = RedisServer(directory=run_dir / "redis", appendonly=True)
        self.graph_port, self.ai_port, self.receiver_port = free_port(), free_port(), free_port()
        self.chatwoot = chatwoot
        self.chatwoot_port = free_port() if chatwoot else 0
        self.workers: list[Child] = []
        self.others: list[Child] = []
        self._redis: Redis | None = None
        self._http = httpx.AsyncClient(timeout=10.0)

    @property
    def redis(self) -> Redis:
        """The harness's own client (bytes answers), from `start()` on."""
        if self._redis is None:
            raise RuntimeError("the stack is not started")
        return self._redis

    # --- addresses ------------------------------------------------------------------------
    @property
    def graph_url(self) -> str:
        return f"http://127.0.0.1:{self.graph_port}"

    @property
    def ai_url(self) -> str:
        return f"http://127.0.0.1:{self.ai_port}"

    @property
    def receiver_url(self) -> str:
        return f"http://127.0.0.1:{self.receiver_port}/webhooks/whatsapp"

    @property
    def chatwoot_url(self) -> str:
        return f"http://127.0.0.1:{self.chatwoot_port}"

    # --- environment ----------------------------------------------------------------------
    def product_env(self) -> dict[str, str]:
        """What the receiver and the workers share (the Settings contract names)."""
        return {
            **clean_environ(),
            "REDIS_URL": self.redis_server.url,
            "KEY_PREFIX": PREFIX,
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "WHATSAPP_VERIFY_TOKEN": "chaos-verify",
            "LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **({"CHATWOOT_WEBHOOK_SECRET": CHATWOOT_SECRET} if self.chatwoot else {}),
        }

    def env_for_workers(self) -> dict[str, str]:
        return {
            **self.product_env(),
            "BRAIN": "anthropic",
            "ANTHROPIC_API_KEY": AI_KEY,
            "ANTHROPIC_BASE_URL": self.ai_url,
            "AI_MODEL": AI_MODEL,
            "AI_TIMEOUT_S": "20",
            "WHATSAPP_ACCESS_TOKEN": GRAPH_TOKEN,
            "WHATSAPP_API_BASE_URL": self.graph_url,
            "SENDER": "whatsapp",
            "SHUTDOWN_GRACE_S": "1",
            **(
                {
                    "CHATWOOT_BASE_URL": self.chatwoot_url,
                    "CHATWOOT_API_ACCESS_TOKEN": CHATWOOT_TOKEN,
                }
                if self.chatwoot
                else {}
            ),
            **self.worker_env,
        }

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self.redis_server.start)
        # The harness's own client rides out the Redis restarts it causes.
        self._redis = Redis.from_url(
            self.redis_server.url,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10),
            retry_on_error=[RedisConnectionError],
        )
        base = clean_environ() | {"PYTHONUNBUFFERED": "1"}
        py = sys.executable
        graph_env = base | {"WHATSAPP_APP_SECRET": APP_SECRET, "WHATSAPP_ACCESS_TOKEN": GRAPH_TOKEN}
        graph_argv = [py, "-m", "scripts.standins.graph_api", "--port", str(self.graph_port)]
        graph_argv += ["--webhook-url", self.receiver_url, "--log-level", "warning"]
        for delay in self.status_delays:
            graph_argv += ["--status-delay", str(delay)]
        self.others.append(self._child("graph", graph_argv, graph_env))
        ai_argv = [py, "-m", "scripts.standins.messages_api", "--port", str(self.ai_port)]
        self.others.append(
            self._child(
                "ai", [*ai_argv, "--log-level", "warning"], base | {"ANTHROPIC_API_KEY": AI_KEY}
            )
        )
        if self.chatwoot:
            chatwoot_argv = [py, "-m", "scripts.standins.chatwoot_api"]
            chatwoot_argv += ["--port", str(self.chatwoot_port), "--token", CHATWOOT_TOKEN]
            chatwoot_argv += ["--webhook-url", self.receiver_url.replace("whatsapp", "chatwoot")]
            chatwoot_argv += ["--secret", CHATWOOT_SECRET, "--log-level", "warning"]
            self.others.append(self._child("chatwoot", chatwoot_argv, base))
        receiver_argv = [py, "-m", "uvicorn", "receiver.app:create_app", "--factory"]
        receiver_argv += ["--port", str(self.receiver_port)]
        receiver_argv += ["--loop", "uvloop", "--http", UVICORN_HTTP, "--no-access-log"]
        receiver_env = self.product_env() | {"REDIS_TIMEOUT_S": "0.5"} | self.receiver_env
        self.others.append(self._child("receiver", receiver_argv, receiver_env))
        for _ in range(self.worker_count):
            self.spawn_worker()
        await self._wait_http(f"{self.graph_url}/_health", "graph stand-in")
        await self._wait_http(f"{self.ai_url}/_health", "messages stand-in")
        if self.chatwoot:
            await self._wait_http(f"{self.chatwoot_url}/_health", "chatwoot stand-in")
        await self._wait_http(
            self.receiver_url.replace("/webhooks/whatsapp", "/readyz"), "receiver"
        )
        await self.wait_workers_listening()

    def _child(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        return Child(name, argv, env, self.run_dir / f"{name}.log")

    def spawn_worker(self) -> Child:
        child = self._child(
            f"worker-{len(self.workers)}", [sys.executable, "-m", "worker"], self.env_for_workers()
        )
        self.workers.append(child)
        return child

    @property
    def live_workers(self) -> list[Child]:
        return [w for w in self.workers if w.alive]

    async def _wait_http(self, url: str, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_children()
            try:
                if (await self._http.get(url, timeout=1.0)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{what} did not come up within {timeout_s}s:\n{self.dump()}")

    async def wait_workers_listening(self, timeout_s: float = 30.0) -> None:
        """Until every live worker has its wake-up connection open (it is up and ready)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_children()
            if await listening_workers(self.redis, self.keys) >= len(self.live_workers):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"workers did not come up within {timeout_s}s:\n{self.dump()}")

    def _check_children(self) -> None:
        for child in self.others:
            if not child.alive:
                raise RuntimeError(f"{child.name} exited:\n{child.tail()}")

    async def stop_processes(self) -> None:
        """Kill every child (workers, receiver, stand-ins); Redis keeps running."""
        for child in self.workers + self.others:
            child.kill(signal.SIGKILL)
        for child in self.workers + self.others:
            await asyncio.to_thread(child.wait)

    async def close(self) -> None:
        await self.stop_processes()
        await self._http.aclose()
        if self._redis is not None:
            await self._redis.aclose()
        await asyncio.to_thread(self.redis_server.close)

    def dump(self, chars: int = 3000) -> str:
        return "\n".join(
            f"--- {c.name} (pid {c.pid})\n{c.tail(chars)}" for c in self.others + self.workers
        )

    # --- faults ---------------------------------------------------------------------------
    def kill_worker(self, pid: int) -> Child:
        """SIGKILL the worker with this pid and start a replacement; returns the new one."""
        for child in self.workers:
            if child.pid == pid:
                child.kill(signal.SIGKILL)
                child.wait()
        return self.spawn_worker()

    async def redis_restart(self, down_s: float) -> None:
        """Crash Redis (SIGKILL) and start it again from its AOF after `down_s`."""
        await asyncio.to_thread(self.redis_server.restart, True, down_s)

    async def redis_stop(self) -> None:
        """Stop Redis (SIGTERM: it writes its AOF and exits); `redis_start` brings it back."""
        await asyncio.to_thread(self.redis_server.stop)

    async def redis_start(self) -> None:
        await asyncio.to_thread(self.redis_server.start)

    async def redis_pause(self, seconds: float) -> None:
        """Stall every client's commands for `seconds` (CLIENT PAUSE ALL ends by itself)."""
        await self.redis.client_pause(int(seconds * 1000), all=True)

    async def redis_freeze(self, seconds: float) -> None:
        """Freeze Redis for `seconds` (SIGSTOP, then SIGCONT), as a stalled host would: it
        answers nothing and reads nothing meanwhile, its clock runs on, and it then runs the
        commands its clients sent meanwhile, those they gave up on included."""
        process = self.redis_server.process
        assert process is not None, "Redis is not running"
        os.kill(process.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(process.pid, signal.SIGCONT)

    # --- the stand-ins over HTTP ----------------------------------------------------------
    async def graph_control(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._control(self.graph_url, payload)

    async def ai_control(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._control(self.ai_url, payload)

    async def chatwoot_control(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._control(self.chatwoot_url, payload)

    async def chatwoot_state(self) -> dict[str, Any]:
        state: dict[str, Any] = (await self._http.get(f"{self.chatwoot_url}/_control")).json()
        return state

    async def chatwoot_records(self) -> dict[str, Any]:
        """The Chatwoot stand-in's `requests` and the `webhooks` it posted (with the answers)."""
        listing: dict[str, Any] = (
            await self._http.get(f"{self.chatwoot_url}/_requests", timeout=60.0)
        ).json()
        return listing

    async def _control(self, base: str, payload: dict[str, Any]) -> dict[str, Any]:
        response = await self._http.post(f"{base}/_control", json=payload)
        answer: dict[str, Any] = response.json()
        if response.status_code != 200 or not answer.get("ok"):
            raise RuntimeError(f"stand-in control {payload} refused: {answer}")
        return answer

    async def graph_state(self) -> dict[str, Any]:
        state: dict[str, Any] = (await self._http.get(f"{self.graph_url}/_control")).json()
        return state

    async def graph_records(self) -> list[dict[str, Any]]:
        data = (await self._http.get(f"{self.graph_url}/_requests", timeout=60.0)).json()
        records: list[dict[str, Any]] = data["requests"]
        return records

    async def ai_records(self) -> list[dict[str, Any]]:
        data = (await self._http.get(f"{self.ai_url}/_requests", timeout=60.0)).json()
        records: list[dict[str, Any]] = data["requests"]
        return records

    async def lock_holders(self, tenants: list[str]) -> dict[int, list[str]]:
        """pid -> people whose turn that worker holds right now (from the lock tokens, which
        start with the worker id `host:pid:hex`)."""
        holders: dict[int, list[str]] = {}
        for tenant in tenants:
            k = self.keys.tenant(tenant)
            people = [decoded(p) for p in await self.redis.zrange(k.running, 0, -1)]
            if not people:
                continue
            tokens = await self.redis.mget([k.lock(p) for p in people])
            for person, token in zip(people, tokens, strict=True):
                if token is None:
                    continue
                parts = decoded(token).split(":")
                if len(parts) >= 2 and parts[1].isdigit():
                    holders.setdefault(int(parts[1]), []).append(person)
        return holders
