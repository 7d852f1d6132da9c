"""One account per operator (`OPS_USERS`), against the real receiver app and a real Redis: the
audit names the account that acted, a name cannot be borrowed, sessions are listed and can be
ended, and each bad input (a wrong password, a malformed `OPS_USERS`, a colleague's session)
gets a clear answer and changes nothing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx
import pytest
from redis.asyncio import Redis
from starlette.applications import Starlette

from receiver.app import create_app
from receiver.ops.auth import LiveSession, Sessions, SessionStore, session_secret
from shared.keys import Keys
from shared.ops import audit
from shared.ops.accounts import (
    AccountsError,
    new_token,
    parse_accounts,
    password_credential,
    verify_credential,
)
from shared.settings import ConfigError, Settings
from tests.ops.support import OPS_TOKEN, PERSON, TENANT, csrf_of, park

KEYS = Keys()
ANA_PASSWORD = "correct horse battery staple"
ANA = f"Ana:{password_credential(ANA_PASSWORD)}"
LUIS_TOKEN, LUIS_CREDENTIAL = new_token()
LUIS = f"Luis:{LUIS_CREDENTIAL}"
USERS = f"{ANA}, {LUIS}"

Clients = Callable[[str], AbstractAsyncContextManager[httpx.AsyncClient]]


@asynccontextmanager
async def ops_app(settings: Settings) -> AsyncIterator[Clients]:
    """One receiver app; each call of what it yields is a client (a browser) from an address."""
    app: Starlette = create_app(settings)

    @asynccontextmanager
    async def client(address: str) -> AsyncIterator[httpx.AsyncClient]:
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as c:
            yield c

    async with app.router.lifespan_context(app):
        yield client


async def signin(client: httpx.AsyncClient, name: str, secret: str) -> httpx.Response:
    return await client.post("/ops/signin", data={"name": name, "token": secret})


async def pause(client: httpx.AsyncClient, csrf: str) -> httpx.Response:
    data = {"csrf": csrf, "tenant": TENANT, "person": PERSON, "seconds": "3600", "why": "x"}
    return await client.post("/ops/conversation/pause", data=data)


# ----------------------------------------------------------------- OPS_USERS itself


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("Ana", "entry 1 is not `name:credential`"),
        (":sha256$" + "0" * 64, "entry 1 is not `name:credential`"),
        ("Ana:hunter2", "a credential starts with `scrypt$`"),
        ("Ana:sha256$abc", "64 hex digits"),
        ("Ana:scrypt$16384$8$1$c2FsdA$aGFzaA", "a salt of 16 bytes"),
        ("Ana:scrypt$1000$8$1$" + "A" * 22 + "$" + "A" * 43, "power of two"),
        ("Ana:scrypt$16384$8$1$" + "!" * 22 + "$" + "A" * 43, "url-safe base64"),
        (f"{ANA},ana:{LUIS_CREDENTIAL}", "listed twice"),
    ],
)
def test_a_malformed_ops_users_stops_the_process_naming_the_variable(
    settings: Settings, value: str, says: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        settings.with_overrides(ops_users=value)
    assert str(raised.value).startswith("OPS_USERS: ") and says in str(raised.value)
    assert ANA_PASSWORD not in str(raised.value) and LUIS_TOKEN not in str(raised.value)


def test_credentials_check_their_own_secret_only() -> None:
    accounts = parse_accounts(USERS + ",")
    assert [a.name for a in accounts.values()] == ["Ana", "Luis"]
    assert accounts["ana"].verify(ANA_PASSWORD) and accounts["ana"].slow
    assert not accounts["ana"].verify(ANA_PASSWORD + " ") and not accounts["ana"].verify("")
    assert accounts["luis"].verify(LUIS_TOKEN) and not accounts["luis"].slow
    assert not accounts["luis"].verify(ANA_PASSWORD)
    assert password_credential("x" * 12) != password_credential("x" * 12), "a fresh salt each"
    assert not verify_credential("plain$secret", "secret")
    with pytest.raises(AccountsError):
        parse_accounts("Ana:sha256$" + "g" * 64)


def test_the_cli_makes_an_entry_that_signs_in_and_refuses_a_short_password() -> None:
    made = subprocess.run(
        [sys.executable, "-m", "shared.ops.accounts", "password", "Eva Gómez", "--stdin"],
        input="a long enough password\n",
        capture_output=True,
        text=True,
        check=True,
    )
    entry = made.stdout.strip()
    assert entry.startswith("Eva Gómez:scrypt$")
    assert parse_accounts(entry)["eva gómez"].verify("a long enough password")
    short = subprocess.run(
        [sys.executable, "-m", "shared.ops.accounts", "password", "Eva", "--stdin"],
        input="short\n",
        capture_output=True,
        text=True,
    )
    assert short.returncode == 2 and "at least 12 characters" in short.stderr and not short.stdout
    token = subprocess.run(
        [sys.executable, "-m", "shared.ops.accounts", "token", "Bo"],
        capture_output=True,
        text=True,
        check=True,
    )
    secret = token.stderr.rsplit(" ", 1)[-1].strip()
    assert parse_accounts(token.stdout.strip())["bo"].verify(secret)


# ----------------------------------------------------------------- signing in with an account


async def test_accounts_alone_open_the_page_and_the_audit_names_the_account(
    settings: Settings, redis: Redis
) -> None:
    await park(redis, settings, ["hola"])  # a conversation to act on
    async with ops_app(settings.with_overrides(ops_users=USERS)) as client:
        async with client("203.0.113.1") as ana, client("203.0.113.2") as luis:
            page = await ana.get("/ops/signin")
            assert "Password or token" in page.text and "Ops token" not in page.text
            # The name is the account's as configured, whatever case it is typed in.
            assert (await signin(ana, "ana", ANA_PASSWORD)).status_code == 303
            assert (await signin(luis, "LUIS", LUIS_TOKEN)).status_code == 303
            assert (await pause(ana, await csrf_of(ana))).status_code == 303
            assert (await pause(luis, await csrf_of(luis))).status_code == 303
            page = await ana.get("/ops/")
            assert "signed in as Ana" in page.text
    entries = await audit.entries(redis, KEYS)
    assert sorted(e.who for e in entries if e.action == "pause") == ["Ana", "Luis"]


async def test_a_wrong_password_or_a_borrowed_name_gets_401_and_no_session(
    settings: Settings, redis: Redis
) -> None:
    both = settings.with_overrides(ops_users=USERS, ops_token=OPS_TOKEN)
    async with ops_app(both) as client, client("203.0.113.9") as mallory:
        cases = [
            ("Ana", ANA_PASSWORD.upper()),  # wrong password
            ("Ana", LUIS_TOKEN),  # a colleague's token
            ("Ana", OPS_TOKEN),  # the admin's token cannot act under an account's name
            ("Nobody", ANA_PASSWORD),  # not an account, not the token
        ]
        for name, secret in cases:
            answer = await signin(mallory, name, secret)
            assert answer.status_code == 401, (name, answer.text)
            assert "Wrong name or password." in answer.text and "set-cookie" not in answer.headers
        assert (await mallory.get("/ops/")).status_code == 303
        # The token still opens the page under a name that is no account's (the admin's).
        assert (await signin(mallory, "Root", OPS_TOKEN)).status_code == 303
        assert "signed in as Root" in (await mallory.get("/ops/")).text
    assert await audit.entries(redis, KEYS) == []


async def test_failed_account_sign_ins_back_off_per_name(settings: Settings, redis: Redis) -> None:
    limited = settings.with_overrides(
        ops_users=USERS, ops_signin_free_attempts=3, ops_signin_backoff_s=60
    )
    async with ops_app(limited) as client:
        codes = []
        for n in range(5):  # each from another address: the name's counter refuses them
            async with client(f"198.51.100.{n}") as guesser:
                codes.append((await signin(guesser, "Ana", f"guess {n}")).status_code)
        assert codes == [401, 401, 401, 429, 429]
        async with client("198.51.100.99") as ana:
            refused = await signin(ana, "Ana", ANA_PASSWORD)
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
            assert (await signin(ana, "Luis", LUIS_TOKEN)).status_code == 303, "others may"


# ----------------------------------------------------------------- sessions


async def test_sessions_are_listed_and_ended_by_their_owner_or_the_admin(
    settings: Settings, redis: Redis
) -> None:
    both = settings.with_overrides(ops_users=USERS, ops_token=OPS_TOKEN)
    async with ops_app(both) as client:
        async with (
            client("203.0.113.1") as laptop,
            client("203.0.113.2") as phone,
            client("203.0.113.3") as luis,
            client("203.0.113.4") as admin,
        ):
            for browser, name, secret in [
                (laptop, "Ana", ANA_PASSWORD),
                (phone, "Ana", ANA_PASSWORD),
                (luis, "Luis", LUIS_TOKEN),
                (admin, "Root", OPS_TOKEN),
            ]:
                assert (await signin(browser, name, secret)).status_code == 303
            listed = await phone.get("/ops/sessions")
            assert listed.status_code == 200
            for shown in ("203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4", "Root"):
                assert shown in listed.text
            sessions = {s.address: s for s in await _live(both, redis)}
            assert len(sessions) == 4

            # Ana ends her laptop's session from her phone; the laptop is signed out at once.
            csrf = await csrf_of(phone)
            ended = await phone.post(
                "/ops/sessions/end", data={"csrf": csrf, "sid": sessions["203.0.113.1"].sid}
            )
            assert ended.status_code == 303 and ended.headers["location"].endswith("done=ended")
            assert (await laptop.get("/ops/")).status_code == 303
            assert (await pause(laptop, "any")).status_code == 403

            # Ana may not end Luis's session: 409, nothing changed.
            refused = await phone.post(
                "/ops/sessions/end", data={"csrf": csrf, "sid": sessions["203.0.113.3"].sid}
            )
            assert refused.status_code == 409 and "only its own sessions" in refused.text
            assert (await luis.get("/ops/")).status_code == 200
            gone = await phone.post("/ops/sessions/end", data={"csrf": csrf, "sid": "nope"})
            assert gone.status_code == 404

            # The admin ends Luis's.
            ended = await admin.post(
                "/ops/sessions/end",
                data={"csrf": await csrf_of(admin), "sid": sessions["203.0.113.3"].sid},
            )
            assert ended.status_code == 303
            assert (await luis.get("/ops/")).status_code == 303
    who = [(e.who, e.action, e.detail) for e in await audit.entries(redis, KEYS)]
    assert ("Ana", "end_session", "Ana's session from 203.0.113.1") in who
    assert ("Root", "end_session", "Luis's session from 203.0.113.3") in who


async def test_a_new_password_ends_the_accounts_sessions(settings: Settings, redis: Redis) -> None:
    before = settings.with_overrides(ops_users=USERS)
    async with ops_app(before) as client, client("203.0.113.1") as ana:
        assert (await signin(ana, "Ana", ANA_PASSWORD)).status_code == 303
        cookies = dict(ana.cookies)
    changed = f"Ana:{password_credential('a brand new password')}, {LUIS}"
    async with ops_app(settings.with_overrides(ops_users=changed)) as client:
        async with client("203.0.113.1") as ana:
            ana.cookies.update(cookies)
            assert (await ana.get("/ops/")).status_code == 303, "signed out by the change"
            assert (await signin(ana, "Ana", ANA_PASSWORD)).status_code == 401


async def _live(settings: Settings, redis: Redis) -> list[LiveSession]:
    secret = session_secret(settings.ops_token, settings.ops_users)
    store = SessionStore(Sessions(secret, settings.ops_session_s), KEYS, lambda: redis)
    return await store.live()
