"""The ops page over HTTP, against the real receiver app and a real Redis: what each bad
input gets (no token configured 404, a wrong token 401, no session a redirect or 403, a
missing or forged CSRF token 403, unknown ids 404) and that none of them changes anything;
then the actions, each recorded in the audit log."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from receiver.ops.auth import COOKIE, Session, Sessions
from shared.keys import Keys
from shared.ops import audit
from shared.settings import Settings
from tests.ops.support import OPS_TOKEN, PERSON, TENANT, ops_settings, park, sign_in
from tests.receiver.support import dumps, post, running, text_message
from tests.receiver.support import payload as webhook_payload

KEYS = Keys()
K = KEYS.tenant(TENANT)
TENANT_2 = "106500000000002"


@pytest.fixture
async def ops(settings: Settings, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    async with running(ops_settings(settings)) as client:
        yield client


async def review_ids(redis: Redis, tenant: str = TENANT) -> set[str]:
    return {i.decode() for i in await redis.hkeys(KEYS.tenant(tenant).review)}


async def no_audit(redis: Redis) -> bool:
    return await audit.entries(redis, KEYS) == []


# ----------------------------------------------------------------- no token, no session


async def test_without_ops_token_the_routes_do_not_exist(settings: Settings, redis: Redis) -> None:
    assert not settings.ops_token
    async with running(settings) as client:
        for path in ("/ops", "/ops/", "/ops/signin", "/ops/item?tenant=x&id=y"):
            assert (await client.get(path)).status_code == 404, path
        answer = await client.post("/ops/signin", data={"token": "", "name": "x"})
        assert answer.status_code == 404
        assert (await client.get("/healthz")).status_code == 200


async def test_without_a_session_pages_redirect_and_posts_are_refused(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["hola"])
    for path in ("/ops/", f"/ops/item?tenant={TENANT}&id={item}", "/ops/audit"):
        answer = await ops.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/ops/signin?next=%2Fops%2F"), answer.headers
        assert item not in answer.text
    for path in ("/ops/item/requeue", "/ops/item/drop", "/ops/bulk-requeue", "/ops/signout"):
        data = {"tenant": TENANT, "id": item, "reason": "max_attempts", "csrf": "x"}
        answer = await ops.post(path, data=data)
        assert answer.status_code == 403 and "sign in first" in answer.text, path
    assert await review_ids(redis) == {item}, "nothing was changed"
    assert await no_audit(redis)


async def test_a_wrong_token_gets_401_and_no_cookie(ops: httpx.AsyncClient, redis: Redis) -> None:
    for token in ("", "wrong", OPS_TOKEN[:-1], OPS_TOKEN + "x"):
        answer = await ops.post("/ops/signin", data={"token": token, "name": "Mallory"})
        assert answer.status_code == 401 and "Wrong token." in answer.text, token
        assert "set-cookie" not in answer.headers
    assert not ops.cookies
    assert (await ops.get("/ops/")).status_code == 303
    assert await no_audit(redis)


async def test_signing_in_needs_a_name_and_a_form(ops: httpx.AsyncClient) -> None:
    for name in ("", "   ", "x" * 65, "bad\x00name"):
        answer = await ops.post("/ops/signin", data={"token": OPS_TOKEN, "name": name})
        assert answer.status_code == 400 and "Give your name" in answer.text, repr(name)
        assert "set-cookie" not in answer.headers
    answer = await ops.post("/ops/signin", content=orjson.dumps({"token": OPS_TOKEN}))
    assert answer.status_code == 400 and "expected a form" in answer.text
    big = {"token": OPS_TOKEN, "name": "Ana", "pad": "x" * 300_000}
    answer = await ops.post("/ops/signin", data=big)
    assert answer.status_code == 413 and "set-cookie" not in answer.headers


async def test_the_session_cookie_is_httponly_strict_scoped_and_secure_behind_https(
    ops: httpx.AsyncClient,
) -> None:
    data = {"token": OPS_TOKEN, "name": "Ana"}
    plain = await ops.post("/ops/signin", data=data)
    cookie = SimpleCookie(plain.headers["set-cookie"])[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "strict" and cookie["path"] == "/ops"
    assert 0 < int(cookie["max-age"]) <= 12 * 3600
    assert not cookie["secure"], "a plain-http dev server would never get the cookie back"
    behind_heroku = await ops.post("/ops/signin", data=data, headers={"x-forwarded-proto": "https"})
    assert SimpleCookie(behind_heroku.headers["set-cookie"])[COOKIE]["secure"]


async def test_forged_expired_or_other_token_cookies_are_not_a_session(
    ops: httpx.AsyncClient,
) -> None:
    await sign_in(ops)
    good = ops.cookies[COOKIE]
    ops.cookies.clear()
    now = time.time()
    mine = Sessions(OPS_TOKEN, 3600)
    session = mine.decode(good)
    assert session is not None
    payload, signature = good.split(".")
    root = Session("Root", int(now + 3600), session.csrf, session.sid)
    forged = [
        "",
        "garbage",
        f"{payload}.{signature[:-2]}xx",  # the payload kept, the signature not
        f"{mine.encode(root).split('.')[0]}.{signature}",
        Sessions("the-previous-token", 3600).encode(session),  # OPS_TOKEN rotated: signed out
        mine.encode(Session("Ana", int(now - 1), session.csrf, session.sid)),  # expired
        # Signed with the token, but never issued: no such session in Redis.
        mine.encode(Session("Ana", int(now + 3600), session.csrf, "never-issued")),
    ]
    for value in forged:
        answer = await ops.get("/ops/", headers={"cookie": f"{COOKIE}={value}"})
        assert answer.status_code == 303, value
    answer = await ops.get("/ops/", headers={"cookie": f"{COOKIE}={good}"})
    assert answer.status_code == 200, "the same cookie, unaltered, is a session"


async def test_next_after_signing_in_stays_on_the_ops_page(ops: httpx.AsyncClient) -> None:
    for target, expected in [
        ("/ops/audit", "/ops/audit"),
        ("//evil.example/ops/", "/ops/"),
        ("https://evil.example/", "/ops/"),
        ("/ops/\\evil", "/ops/"),
    ]:
        data = {"token": OPS_TOKEN, "name": "Ana", "next": target}
        answer = await ops.post("/ops/signin", data=data)
        assert answer.headers["location"] == expected, target


async def test_signing_out_ends_the_session(ops: httpx.AsyncClient) -> None:
    csrf = await sign_in(ops)
    answer = await ops.post("/ops/signout", data={"csrf": csrf})
    assert answer.status_code == 303 and answer.headers["location"] == "/ops/signin"
    assert (await ops.get("/ops/")).status_code == 303


# ----------------------------------------------------------------- CSRF


async def test_a_missing_or_forged_csrf_token_gets_403_and_changes_nothing(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["hola"])
    csrf = await sign_in(ops)
    async with running(ops_settings(settings)) as other:
        someone_elses = await sign_in(other, "Eve")
    assert someone_elses != csrf
    for path in ("/ops/item/requeue", "/ops/item/drop", "/ops/bulk-requeue"):
        for token in (None, "", "forged", csrf[:-1], someone_elses):
            data = {"tenant": TENANT, "id": item, "reason": "max_attempts"}
            if token is not None:
                data["csrf"] = token
            answer = await ops.post(path, data=data)
            assert answer.status_code == 403 and "CSRF token does not match" in answer.text
    assert await review_ids(redis) == {item}
    assert not await redis.exists(K.batch(PERSON))
    assert await no_audit(redis)
    assert (await ops.get("/ops/")).status_code == 200, "still signed in"


# ----------------------------------------------------------------- unknown ids


async def test_unknown_tenants_items_and_people_get_404_with_the_reason(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["hola"])
    csrf = await sign_in(ops)
    pages = {
        f"/ops/item?tenant=999&id={item}": "no tenant &#39;999&#39;: it has never received",
        f"/ops/item?tenant={TENANT}&id=nope": "no review item &#39;nope&#39; for tenant",
        "/ops/item?tenant=%7Bbad%7D&id=x": "cannot be used in a Redis key",
        f"/ops/conversation?tenant={TENANT}&person=15550000000": "nothing is known of person",
        "/ops/conversation?tenant=999&person=1": "no tenant &#39;999&#39;",
        f"/ops/conversation?tenant={TENANT}&person=a%7Bb": "cannot be used in a Redis key",
        "/ops/?tenant=999": "no tenant &#39;999&#39;",
    }
    for path, message in pages.items():
        answer = await ops.get(path)
        assert answer.status_code == 404 and message in answer.text, (path, answer.text)
    assert (await ops.get("/ops/?age=forever")).status_code == 400
    for path in ("/ops/item/requeue", "/ops/item/drop"):
        for tenant, item_id in ((TENANT, "nope"), ("999", item), ("", "")):
            data = {"tenant": tenant, "id": item_id, "csrf": csrf}
            answer = await ops.post(path, data=data)
            assert answer.status_code == 404, (path, tenant, item_id, answer.text)
    answer = await ops.post("/ops/bulk-requeue", data={"reason": "nope", "csrf": csrf})
    assert answer.status_code == 409 and "no review item with reason" in answer.text
    answer = await ops.post("/ops/bulk-requeue", data={"reason": "", "csrf": csrf})
    assert answer.status_code == 409 and "choose a reason" in answer.text
    assert await review_ids(redis) == {item}
    assert await no_audit(redis)


# ----------------------------------------------------------------- actions


async def test_requeue_and_drop_are_done_and_audited(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    first = await park(redis, settings, ["hola"])
    second = await park(redis, settings, ["otra"], person="5491155550002")
    csrf = await sign_in(ops, "Ana Ops")
    answer = await ops.post("/ops/item/requeue", data={"tenant": TENANT, "id": first, "csrf": csrf})
    assert answer.status_code == 303
    assert "done=requeued" in answer.headers["location"]
    assert await review_ids(redis) == {second}
    batch = await redis.hgetall(K.batch(PERSON))
    assert batch[b"id"].startswith(f"{first}-r".encode()) and batch[b"attempt"] == b"0"
    assert await redis.zscore(K.due, PERSON) is not None, "a fresh batch, due now"
    answer = await ops.post("/ops/item/drop", data={"tenant": TENANT, "id": second, "csrf": csrf})
    assert answer.status_code == 303 and await review_ids(redis) == set()
    entries = await audit.entries(redis, KEYS)
    assert [(e.who, e.action, e.person) for e in entries] == [
        ("Ana Ops", "drop", "5491155550002"),
        ("Ana Ops", "requeue", PERSON),
    ]
    page = await ops.get("/ops/audit")
    assert "Ana Ops" in page.text and f"item {second} (max_attempts)" in page.text


async def test_an_action_that_cannot_be_done_says_why_and_changes_nothing(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["hola"])
    # A batch in flight for the person: requeueing would break the person's order.
    await redis.hset(K.batch(PERSON), mapping={"id": "other", "attempt": 0, "size": 1})
    csrf = await sign_in(ops)
    answer = await ops.post("/ops/item/requeue", data={"tenant": TENANT, "id": item, "csrf": csrf})
    assert answer.status_code == 409
    assert "has a batch in flight; requeue again once it ended" in answer.text
    assert "nothing was changed" in answer.text
    assert item in await review_ids(redis)
    # The undelivered part Meta reports late has no messages to answer.
    empty = {"id": "u1", "person": PERSON, "reason": "window_closed", "messages": []}
    await redis.hset(K.review, "u1", orjson.dumps(empty))
    answer = await ops.post("/ops/item/requeue", data={"tenant": TENANT, "id": "u1", "csrf": csrf})
    assert answer.status_code == 409 and "has no messages to answer; drop it" in answer.text
    assert await review_ids(redis) == {item, "u1"}
    assert await no_audit(redis)


async def finished_job(ops: httpx.AsyncClient, location: str) -> str:
    """The job page once the job has finished (it runs in the background)."""
    assert location.startswith("/ops/bulk?job="), location
    deadline = time.monotonic() + 30
    while True:
        page = await ops.get(location)
        assert page.status_code == 200, page.text
        if 'id="bulk-state">finished' in page.text:
            assert 'http-equiv="refresh"' not in page.text, "a finished job stops reloading"
            return page.text
        assert time.monotonic() < deadline, page.text
        await asyncio.sleep(0.05)


@pytest.mark.cluster
async def test_bulk_requeue_by_reason_and_tenant_reports_what_it_left(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    a = await park(redis, settings, ["a"], person="5491100000001", reason="too_old")
    b = await park(redis, settings, ["b"], person="5491100000002", reason="too_old")
    other = await park(redis, settings, ["c"], person="5491100000003", reason="failed")
    elsewhere = await park(
        redis, settings, ["d"], tenant=TENANT_2, person="5491100000004", reason="too_old"
    )
    csrf = await sign_in(ops)
    page = await ops.get("/ops/?reason=too_old")
    assert "too_old (3)" in page.text and "failed (1)" in page.text
    assert f"{TENANT} (2)" in page.text and f"{TENANT_2} (1)" in page.text
    await redis.hset(KEYS.tenant(TENANT).batch("5491100000002"), "id", "in-flight")
    data = {"reason": "too_old", "tenant": TENANT, "csrf": csrf}
    answer = await ops.post("/ops/bulk-requeue", data=data)
    assert answer.status_code == 303, answer.text
    text = await finished_job(ops, answer.headers["location"])
    assert "Requeued 1 of 2 item(s); 1 left on the list; 0 gone meanwhile" in text
    assert f"{TENANT}/{b}: person 5491100000002 has a batch in flight" in text
    assert await review_ids(redis) == {b, other}
    assert await review_ids(redis, TENANT_2) == {elsewhere}
    details = [e.detail for e in await audit.entries(redis, KEYS)]
    assert details[1] == f"item {a} (too_old); bulk job {details[1].split()[5]} by reason too_old"
    assert details[0].endswith(
        "requeued 1 of 2 too_old item(s), 1 left on the list, 0 gone meanwhile"
    )
    assert details[2].endswith(f"2 too_old item(s) of tenant {TENANT}")
    await redis.delete(KEYS.tenant(TENANT).batch("5491100000002"))
    answer = await ops.post(
        "/ops/bulk", data={"action": "requeue", "reason": "too_old", "csrf": csrf}
    )
    text = await finished_job(ops, answer.headers["location"])
    assert "Requeued 2 of 2 item(s); 0 left on the list" in text
    assert await review_ids(redis) == {other} and await review_ids(redis, TENANT_2) == set()
    page = await ops.get("/ops/")
    assert "too_old (" not in page.text and "failed (1)" in page.text, "counts kept as they change"


async def test_a_bulk_of_any_size_finishes_in_chunks_and_the_audit_says_what_it_did(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """Issue 23: a bulk past what fits in one request answered 503 and hid what it did. Old
    items (written as the previous release did, without the index) are found too."""
    await redis.sadd(KEYS.tenants, TENANT)
    n = 1_050
    items = {
        f"old{i:05}": orjson.dumps(
            {"id": f"old{i:05}", "person": f"p{i}", "reason": "too_old", "reviewed_ms": i + 1}
        )
        for i in range(n)
    }
    await redis.hset(K.review, mapping=items)
    csrf = await sign_in(ops)
    form = {"action": "drop", "reason": "too_old", "csrf": csrf}
    answer = await ops.post("/ops/bulk", data=form)
    assert answer.status_code == 409 and "tick the box" in answer.text
    answer = await ops.post("/ops/bulk", data={**form, "confirm": "yes"})
    assert answer.status_code == 303
    text = await finished_job(ops, answer.headers["location"])
    assert f"Dropped {n} of {n} item(s); 0 left on the list" in text
    assert await redis.hlen(K.review) == 0 and await redis.zcard(K.review_ix) == 0
    assert await redis.hgetall(K.review_counts) == {}
    entries = await audit.entries(redis, KEYS, limit=5000)
    assert sum(e.action == "drop" for e in entries) == n
    assert entries[0].action == "bulk drop" and f"dropped {n} of {n}" in entries[0].detail


async def test_a_bulk_job_that_stopped_is_continued_where_it_was(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """A job whose process ended (no run lease) shows as stopped; Continue finishes it and
    never acts twice on an item."""
    first = await park(redis, settings, ["a"], person="5491100000001", reason="too_old")
    second = await park(redis, settings, ["b"], person="5491100000002", reason="too_old")
    csrf = await sign_in(ops)
    member = (await redis.zrange(K.review_ix, 0, 0))[0].decode()
    assert member.endswith(first)
    await redis.hset(
        KEYS.ops_bulk("j1"),
        mapping={
            "action": "requeue",
            "reason": "too_old",
            "tenant": "",
            "age": "",
            "who": "Ana",
            "started_ms": 1,
            "max_ms": int(time.time() * 1000) + 60_000,
            "tenants": orjson.dumps([TENANT]),
            "matched": 2,
            "done": 1,
            "refused": 0,
            "gone": 0,
            "refusals": "[]",
            "state": "running",
            "error": "",
            "updated_ms": 1,
            f"cursor:{TENANT}": member,
        },
    )
    page = await ops.get("/ops/bulk?job=j1")
    assert 'id="bulk-state">stopped' in page.text and "Continue from where it stopped" in page.text
    answer = await ops.post("/ops/bulk/continue", data={"job": "j1", "csrf": csrf})
    assert answer.status_code == 303
    text = await finished_job(ops, answer.headers["location"])
    assert "Requeued 2 of 2 item(s)" in text
    assert await review_ids(redis) == {first}, "the item before the cursor was not touched again"
    assert second not in await review_ids(redis)
    answer = await ops.post("/ops/bulk/continue", data={"job": "j1", "csrf": csrf})
    assert answer.status_code == 409 and "has finished" in answer.text
    assert (await ops.get("/ops/bulk?job=nope")).status_code == 404


# ----------------------------------------------------------------- pages


async def test_the_pages_filter_count_page_and_escape_customer_text(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    hostile = "<script>alert('x')</script><img src=x onerror=alert(1)>"
    item = await park(redis, settings, [hostile], error="<b>err</b>")
    await sign_in(ops)
    for path in (
        "/ops/",
        f"/ops/item?tenant={TENANT}&id={item}",
        f"/ops/conversation?tenant={TENANT}&person={PERSON}",
    ):
        page = await ops.get(path)
        assert page.status_code == 200, path
        assert "<script>" not in page.text and "<img src=x" not in page.text, path
        assert page.headers["cache-control"] == "no-store"
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert 'name="viewport"' in page.text
    page = await ops.get(f"/ops/item?tenant={TENANT}&id={item}")
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page.text
    assert "&lt;b&gt;err&lt;/b&gt;" in page.text
    assert (await ops.get("/ops/?age=1h")).text.count('href="/ops/item?') == 0, "too young"
    assert (await ops.get("/ops/?reason=too_old")).text.count('href="/ops/item?') == 0


async def test_an_item_shows_what_was_sent_and_not_as_text_and_errors_as_sentences(
    ops: httpx.AsyncClient, redis: Redis
) -> None:
    """Issue 23: a window_closed item never showed the reply that was not delivered, a
    delivery_unknown one showed it inside a Python dict, errors were raw."""
    await redis.sadd(KEYS.tenants, TENANT)
    message = {"id": "wamid.in", "type": "text", "text": "¿Tienen turno?"}
    closed = {
        "id": "w1",
        "person": PERSON,
        "reason": "window_closed",
        "messages": [message],
        "error": "131047: Re-engagement message",
        "reviewed_ms": 1,
        "reply": "Sí, el jueves.\n\nA las 10.",
        "parts_sent": {"0": "wamid.out0"},
        "parts_total": 2,
    }
    unknown = {
        "id": "u1",
        "person": PERSON,
        "reason": "delivery_unknown",
        "messages": [message],
        "error": "part 1 of 1: no answer",
        "reviewed_ms": 2,
        "delivery_unknown": {
            "what": "part",
            "part": 0,
            "parts_total": 1,
            "at_ms": 1764421200000,
            "error": "Graph API did not answer: ReadTimeout('')",
            "text": "Te espero el jueves",
        },
    }
    failed = {
        "id": "f1",
        "person": PERSON,
        "reason": "max_attempts",
        "messages": [message],
        "error": "RetryLater: HTTP 500, code None: <html><body>Internal</body></html>",
        "reviewed_ms": 3,
    }
    for item in (closed, unknown, failed):
        await redis.hset(K.review, str(item["id"]), orjson.dumps(item))
    await sign_in(ops)
    page = (await ops.get(f"/ops/item?tenant={TENANT}&id=w1")).text
    assert "¿Tienen turno?" in page
    assert "Sí, el jueves.\n\nA las 10." in page and "24-hour window closed" in page
    assert "part 1 of 2" in page and "WhatsApp refused it: error 131047" in page
    page = (await ops.get(f"/ops/item?tenant={TENANT}&id=u1")).text
    assert "Te espero el jueves" in page and "{&#39;what&#39;" not in page and "{'what'" not in page
    assert "WhatsApp did not answer (ReadTimeout) after the request was sent" in page
    page = (await ops.get(f"/ops/item?tenant={TENANT}&id=f1")).text
    assert (
        "WhatsApp answered 500 (server error) with an HTML page instead of an error message."
        in page
    )
    assert "<details><summary>the error as recorded</summary>" in page
    assert "&lt;html&gt;&lt;body&gt;Internal" in page, "the raw detail, escaped, one click away"
    listing = (await ops.get("/ops/")).text
    assert "WhatsApp answered 500 (server error)" in listing and "&lt;html&gt;" not in listing
    conversation = (await ops.get(f"/ops/conversation?tenant={TENANT}&person={PERSON}")).text
    assert "24-hour window closed" in conversation and "Te espero el jueves" in conversation


@pytest.mark.cluster
async def test_the_overview_pages_through_many_items(ops: httpx.AsyncClient, redis: Redis) -> None:
    """Pages hold 50 items, oldest first; "newer items" leads to newer ones and "older items"
    back (issue 23: from a later page, "newer page" led to older items)."""
    await redis.sadd(KEYS.tenants, TENANT, TENANT_2)
    for tenant, start in ((TENANT, 0), (TENANT_2, 1)):
        items = {
            f"i{n:03}": orjson.dumps(
                {"id": f"i{n:03}", "person": f"p{n}", "reason": "failed", "reviewed_ms": n}
            )
            for n in range(start, 120, 2)
        }
        await redis.hset(KEYS.tenant(tenant).review, mapping=items)
    await sign_in(ops)

    def shown(text: str) -> list[int]:
        return [int(i) for i in re.findall(r'href="/ops/item\?tenant=\d+&amp;id=i(\d+)"', text)]

    def link_of(text: str, label: str) -> str | None:
        found = re.search(rf'href="([^"]+)">{label}', text)
        return found.group(1).replace("&amp;", "&") if found else None

    first = (await ops.get("/ops/")).text
    assert shown(first) == list(range(50)) and "Items 1–50 of 120" in first
    assert link_of(first, "← older items") is None
    second = (await ops.get(link_of(first, "newer items →") or "")).text
    assert shown(second) == list(range(50, 100)) and "Items 51–100 of 120" in second
    last = (await ops.get(link_of(second, "newer items →") or "")).text
    assert shown(last) == list(range(100, 120)) and link_of(last, "newer items →") is None
    back = (await ops.get(link_of(last, "← older items") or "")).text
    assert shown(back) == list(range(50, 100)), "older items are older"
    assert "failed (120)" in back
    tenant_only = (await ops.get(f"/ops/?tenant={TENANT_2}")).text
    assert shown(tenant_only) == list(range(1, 101, 2))
    assert (await ops.get("/ops/?after=garbage")).status_code == 200, "a bad cursor: first page"


async def test_items_of_the_previous_release_are_indexed_and_its_deletions_forgotten(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    """The release before the index wrote and deleted items in the hash alone, during a
    rolling deploy too: the page indexes the ones it finds and drops the entries of the ones
    it deleted, and the counts follow."""
    parked = await park(redis, settings, ["nuevo"], reason="failed")
    old = {"id": "old1", "person": PERSON, "reason": "too_old", "reviewed_ms": 5}
    await redis.hset(K.review, "old1", orjson.dumps(old))
    await sign_in(ops)
    page = (await ops.get("/ops/")).text
    assert "too_old (1)" in page and "failed (1)" in page and "Items 1–2 of 2" in page
    assert await redis.hlen(K.review_ix_of) == 2
    conversation = (await ops.get(f"/ops/conversation?tenant={TENANT}&person={PERSON}")).text
    assert "old1" in conversation and parked in conversation
    await redis.hdel(K.review, "old1")  # deleted by a process of the previous release
    page = (await ops.get("/ops/")).text
    assert "Items 1–1 of" in page and "old1" not in page
    assert await redis.hlen(K.review_ix_of) == 1
    assert await redis.hgetall(K.review_counts) == {b"failed": b"1"}


async def test_the_webhook_path_still_works_with_the_ops_page_mounted(
    ops: httpx.AsyncClient, redis: Redis
) -> None:
    body = dumps(webhook_payload((TENANT, [text_message("wamid.ops1")], [])))
    answer = await post(ops, body)
    assert answer.status_code == 200 and answer.headers["x-stored"] == "1"
    assert (await ops.get("/ops/signin")).status_code == 200
