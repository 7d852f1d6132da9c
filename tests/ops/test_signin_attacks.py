"""Issue 21, finding 5: the ops page's sign-in under attack, against the real receiver app and
a real Redis. Each test reproduces what the security review did and says what it gets now:

- 300 wrong tokens at once: 5 are compared (401), the rest get 429 with `Retry-After`, and so
  does the right token until the wait is over (it was: 300 compared in 0.28 s);
- failures count per client address and per name, in Redis, across receiver processes;
- signing out revokes the session: the old cookie and CSRF token pause nobody (they did);
- malformed cookies (not ASCII, not base64, signed garbage, the old format) are "signed
  out": a redirect or a 403, never a 500 (a non-ASCII cookie gave a 500).

`OPS_TOKEN=a` is refused at start-up: tests/test_bad_settings.py, as a real process.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import orjson
import pytest
from redis.asyncio import Redis
from starlette.applications import Starlette

from receiver.app import create_app
from receiver.ops.auth import COOKIE, Session, Sessions
from shared.keys import Keys
from shared.ops import audit, takeover
from shared.settings import ConfigError, Settings
from tests.ops.support import OPS_TOKEN, PERSON, TENANT, csrf_of, ops_settings, park, sign_in

KEYS = Keys()


@asynccontextmanager
async def receiver(
    settings: Settings, address: str = "203.0.113.7"
) -> AsyncIterator[httpx.AsyncClient]:
    """One receiver process (its own app, its own lifespan) and a client calling it from
    `address`, as uvicorn would report the peer."""
    app: Starlette = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
            yield client


async def signin(client: httpx.AsyncClient, token: str, name: str = "Ana") -> httpx.Response:
    return await client.post("/ops/signin", data={"token": token, "name": name})


WRONG = "x" * 40


# ----------------------------------------------------------------- OPS_TOKEN's length


def test_a_short_ops_token_is_refused_naming_the_variable(settings: Settings) -> None:
    for short in ("a", "x" * 31):
        with pytest.raises(ConfigError, match=r"^OPS_TOKEN must be at least 32 characters"):
            settings.with_overrides(ops_token=short)
    assert settings.with_overrides(ops_token="x" * 32).ops_token == "x" * 32
    assert settings.with_overrides(ops_token="").ops_token == "", "unset: no ops page at all"
    with pytest.raises(ConfigError, match=r"^OPS_SIGNIN_BACKOFF_MAX_S \(5.0\) must be >="):
        settings.with_overrides(ops_signin_backoff_s=10.0, ops_signin_backoff_max_s=5.0)


# ----------------------------------------------------------------- back-off


async def test_300_wrong_tokens_at_once_meet_the_backoff_after_5(
    settings: Settings, redis: Redis
) -> None:
    slow = ops_settings(settings, ops_signin_backoff_s=30.0, ops_signin_backoff_max_s=60.0)
    async with receiver(slow) as ops:
        started = time.perf_counter()
        answers: list[httpx.Response] = []
        for _ in range(6):  # 50 at once: within the Redis pool (beyond it: 503, still no guess)
            answers += await asyncio.gather(*(signin(ops, WRONG) for _ in range(50)))
        took_s = time.perf_counter() - started
        statuses = [a.status_code for a in answers]
        assert statuses.count(401) == 5, "only the free attempts were compared"
        assert statuses.count(429) == 295
        refused = [a for a in answers if a.status_code == 429]
        assert all(1 <= int(a.headers["retry-after"]) <= 30 for a in refused)
        assert all("Too many failed sign-ins" in a.text for a in refused)
        assert all("set-cookie" not in a.headers for a in answers)
        # The right token now is not even compared: guessing on would learn nothing.
        right = await signin(ops, OPS_TOKEN)
        assert right.status_code == 429 and "set-cookie" not in right.headers
    failures = await redis.hget(KEYS.ops_signin_client("203.0.113.7"), "failures")
    assert failures == b"5", "refused attempts count nothing"
    print(f"300 wrong tokens, 50 at once: 5 compared, 295 refused (429) in {took_s:.2f} s")


async def test_the_wait_doubles_and_a_success_resets_it(settings: Settings, redis: Redis) -> None:
    fast = ops_settings(settings, ops_signin_backoff_s=0.2, ops_signin_backoff_max_s=0.4)
    counter = KEYS.ops_signin_client("203.0.113.7")
    async with receiver(fast) as ops:
        for _ in range(5):
            assert (await signin(ops, WRONG)).status_code == 401
        refused = await signin(ops, WRONG)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        await asyncio.sleep(0.25)
        assert (await signin(ops, WRONG)).status_code == 401, "the 0.2 s wait is over"
        waits_ms = int(await redis.hget(counter, "until_ms") or 0) - int(time.time() * 1000)
        assert 200 < waits_ms <= 400, "the second wait is twice the first"
        assert 0 < await redis.pttl(counter) <= 800, "forgotten after the wait + the cap"
        assert (await signin(ops, OPS_TOKEN)).status_code == 429
        await asyncio.sleep(0.45)
        assert (await signin(ops, OPS_TOKEN)).status_code == 303
        assert not await redis.exists(counter), "a success resets the client's failures"
        assert not await redis.exists(KEYS.ops_signin_name("ana"))
        for _ in range(5):
            assert (await signin(ops, WRONG)).status_code == 401, "five free attempts again"


@pytest.mark.cluster  # one script counts both: one hash tag, one slot
async def test_failures_count_per_client_and_per_name_across_processes(
    settings: Settings, redis: Redis
) -> None:
    slow = ops_settings(settings, ops_signin_backoff_s=30.0, ops_signin_backoff_max_s=60.0)
    # One name guessed from several addresses, through two receiver processes.
    async with receiver(slow, "198.51.100.1") as one, receiver(slow, "198.51.100.2") as two:
        for _ in range(3):
            assert (await signin(one, WRONG, "Ana")).status_code == 401
        for _ in range(2):
            assert (await signin(two, WRONG, "ana ")).status_code == 401  # the same account
    async with receiver(slow, "198.51.100.3") as three:
        assert (await signin(three, OPS_TOKEN, "ANA")).status_code == 429, "the name waits"
        assert (await signin(three, OPS_TOKEN, "Bob")).status_code == 303, "others do not"
    # One address guessing under a new name each time.
    async with receiver(slow, "198.51.100.4") as four:
        for i in range(5):
            assert (await signin(four, WRONG, f"guess {i}")).status_code == 401
        assert (await signin(four, WRONG, "guess 5")).status_code == 429, "the address waits"
        # The app reads no X-Forwarded-For of its own: only uvicorn decides who the peer is
        # (from the proxies FORWARDED_ALLOW_IPS trusts), so a header cannot name another.
        spoofed = await four.post(
            "/ops/signin",
            data={"token": OPS_TOKEN, "name": "Carla"},
            headers={"x-forwarded-for": "192.0.2.99"},
        )
        assert spoofed.status_code == 429
    async with receiver(slow, "198.51.100.5") as five:
        assert (await signin(five, OPS_TOKEN, "Carla")).status_code == 303


# ----------------------------------------------------------------- sign-out and expiry


@pytest.mark.cluster
async def test_signing_out_revokes_the_cookie_and_its_csrf_token_everywhere(
    settings: Settings, redis: Redis
) -> None:
    await park(redis, settings, ["hola"], reason="too_old")  # too_old does not pause
    async with receiver(ops_settings(settings)) as ops, receiver(ops_settings(settings)) as other:
        csrf = await sign_in(ops)
        cookie = ops.cookies[COOKIE]
        session = Sessions(OPS_TOKEN, 3600).decode(cookie)
        assert session is not None and await redis.exists(KEYS.ops_session(session.sid))
        other.cookies.set(COOKIE, cookie)
        assert (await other.get("/ops/")).status_code == 200, "one session, every process"
        answer = await ops.post("/ops/signout", data={"csrf": csrf})
        assert answer.status_code == 303 and answer.headers["location"] == "/ops/signin"
        assert not await redis.exists(KEYS.ops_session(session.sid))
        # What the review did: keep the old cookie and CSRF token after signing out.
        form = {"tenant": TENANT, "person": PERSON, "csrf": csrf, "seconds": "600"}
        for client in (ops, other):
            client.cookies.set(COOKIE, cookie)
            stale = await client.post("/ops/conversation/pause", data=form)
            assert stale.status_code == 403 and "sign in first" in stale.text
            assert (await client.get("/ops/")).status_code == 303
    assert await takeover.pause_state(redis, KEYS, TENANT, PERSON) is None, "nobody paused"
    assert await audit.entries(redis, KEYS) == []


async def test_a_session_ends_in_redis_when_its_lifetime_does(
    settings: Settings, redis: Redis
) -> None:
    async with receiver(ops_settings(settings, ops_session_s=1.5)) as ops:
        assert (await signin(ops, OPS_TOKEN)).status_code == 303
        cookie = ops.cookies[COOKIE]
        session = Sessions(OPS_TOKEN, 1.5).decode(cookie)
        assert session is not None
        assert 0 < await redis.pttl(KEYS.ops_session(session.sid)) <= 1500
        await asyncio.sleep(1.6)
        assert not await redis.exists(KEYS.ops_session(session.sid))
        ops.cookies.clear()
        answer = await ops.get("/ops/", headers={"cookie": f"{COOKIE}={cookie}"})
        assert answer.status_code == 303


async def test_signing_in_again_gives_a_new_session_and_csrf_token(
    settings: Settings, redis: Redis
) -> None:
    async with receiver(ops_settings(settings)) as ops:
        first = await sign_in(ops)
        old_cookie = ops.cookies[COOKIE]
        await ops.post("/ops/signout", data={"csrf": first})
        second = await sign_in(ops)
        assert second != first and ops.cookies[COOKIE] != old_cookie
        assert await csrf_of(ops) == second


# ----------------------------------------------------------------- malformed cookies


def signed(payload: bytes) -> str:
    """A cookie signed with the right key (as auth.py derives it) around any payload: what
    only someone holding OPS_TOKEN could make, to show the reading never trusts its shape."""
    key = hmac.new(OPS_TOKEN.encode(), b"wa-inbox ops session v1", hashlib.sha256).digest()
    body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    mac = hmac.new(key, body.encode(), hashlib.sha256).digest()
    return f"{body}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


MALFORMED: list[bytes] = [
    "é.é".encode(),  # non-ASCII: gave a 500 with a traceback
    b"\xff\xfe.\x80",  # not even UTF-8
    "wa.sig\u00e9".encode(),
    b"!!!!.????",  # not base64
    b"a.b.c",
    b".",
    b'"quoted.value"',
    b"x" * 8000 + b".y",
    signed(b"not json").encode(),
    signed(b'{"who": "Root"}').encode(),
    signed(orjson.dumps(["Ana", 9999999999, "csrf"])).encode(),  # the format before issue 21
    signed(orjson.dumps(["Ana", "soon", None, {}])).encode(),
    signed(orjson.dumps(["Ana", 9999999999, "csrf", "no-such-session"])).encode(),
]


async def test_malformed_cookies_are_signed_out_never_a_500(
    settings: Settings, redis: Redis
) -> None:
    async with receiver(ops_settings(settings)) as ops:
        for value in MALFORMED:
            header = [(b"cookie", COOKIE.encode() + b"=" + value)]
            page = await ops.get("/ops/", headers=header)
            assert page.status_code == 303, (value, page.text)
            assert page.headers["location"].startswith("/ops/signin")
            post = await ops.post("/ops/signout", data={"csrf": "x"}, headers=header)
            assert post.status_code == 403 and "sign in first" in post.text, value
        assert (await ops.get("/ops/signin")).status_code == 200


async def test_a_session_forged_with_the_old_token_is_not_one(
    settings: Settings, redis: Redis
) -> None:
    # The key in Redis alone is not enough either: the cookie must be signed with OPS_TOKEN.
    async with receiver(ops_settings(settings)) as ops:
        await sign_in(ops)
        session = Sessions(OPS_TOKEN, 3600).decode(ops.cookies[COOKIE])
        assert session is not None
        ops.cookies.clear()
        other = Sessions("y" * 40, 3600).encode(
            Session("Root", session.expires_s, session.csrf, session.sid)
        )
        answer = await ops.get("/ops/", headers={"cookie": f"{COOKIE}={other}"})
        assert answer.status_code == 303
