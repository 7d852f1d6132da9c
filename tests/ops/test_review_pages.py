"""The review list and an item's page as a person reads them: how long the customer has waited
(since their first message, not since the item was parked), who they are (the contact's name
beside the number, the tenant by what it is), times in the tenant's time zone, and a Chatwoot
conversation without WhatsApp's 24-hour window or `*bold*` hints."""

from __future__ import annotations

import html
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from receiver.ops import present
from shared.keys import Keys
from shared.ops import audit
from shared.settings import Settings
from tests.ops.support import PERSON, TENANT, ops_settings, park, sign_in
from tests.receiver.support import running

KEYS = Keys()
ZONE = "America/Argentina/Buenos_Aires"  # UTC-3, no daylight saving time
CHATWOOT = "cw-1-3"


@pytest.fixture
async def ops(settings: Settings, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    async with running(ops_settings(settings, timezone=ZONE)) as client:
        await sign_in(client)
        yield client


async def rewrite_messages(
    redis: Redis, tenant: str, item_id: str, *, received_ms: int, name: str = ""
) -> None:
    """Give the parked item's messages the times and name a real webhook would have given."""
    k = KEYS.tenant(tenant)
    item = orjson.loads(await redis.hget(k.review, item_id))
    for i, message in enumerate(item["messages"]):
        message["received_ms"] = received_ms + i * 60_000
        message["ts"] = (received_ms + i * 60_000) // 1000
        if name:
            message["name"] = name
    await redis.hset(k.review, item_id, orjson.dumps(item))


def local(ms: int) -> str:
    """`ms` as the page writes it for a tenant in ZONE (three hours behind UTC)."""
    at = datetime.fromtimestamp(ms / 1000 - 3 * 3600, UTC).strftime("%Y-%m-%d %H:%M")
    return f"{at} ({ZONE})"


# ----------------------------------------------------------------- the pure helpers


def test_tenants_are_named_by_what_they_are() -> None:
    assert present.tenant_label("cw-1-3") == "Chatwoot inbox 3 (account 1)"
    assert present.tenant_label("106500000000001") == "WhatsApp 106500000000001"
    assert present.tenant_label("cw-x") == "WhatsApp cw-x"  # not a Chatwoot id: shown as is
    assert present.is_chatwoot("cw-1-3") and not present.is_chatwoot("106500000000001")


def test_the_wait_starts_at_the_first_message_and_bad_times_are_skipped() -> None:
    item = {
        "messages": [
            {"received_ms": 5_000, "ts": 4},
            {"ts": 3},  # no received_ms: the provider's time
            {"received_ms": "junk"},
            "not a message",
        ]
    }
    assert present.first_message_ms(item) == 3_000
    assert present.first_message_ms({"messages": []}) == 0
    assert present.first_message_ms({}) == 0
    assert present.contact_name({"messages": [{"name": "Ana"}, {"name": " "}, {}]}) == "Ana"
    assert present.contact_name({"messages": None}) == ""
    assert present.local_time(0, ZONE) == "?"
    assert present.local_time(1_764_421_200_000, "Not/AZone").endswith("(Not/AZone)")


# ----------------------------------------------------------------- the review list


async def test_the_list_shows_how_long_the_customer_waited_and_their_name(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["hola", "sigo esperando"])
    two_hours_ago = int(time.time() * 1000) - 2 * 3600 * 1000
    await rewrite_messages(redis, TENANT, item, received_ms=two_hours_ago, name="María <b>")
    page = await ops.get("/ops/")
    assert page.status_code == 200
    text = page.text
    assert "<th>Waiting" in text and "<th>Age</th>" not in text
    # Two hours since the first message, though it was parked a moment ago.
    assert ">2h00m<" in text or ">1h59m<" in text, text
    assert "since " + html.escape(local(two_hours_ago)) in text
    assert "parked " in text and " ago" in text
    # The contact's name beside the number, escaped; the tenant by what it is.
    assert "<strong>María &lt;b&gt;</strong>" in text and PERSON in text
    assert f"WhatsApp {TENANT}" in text


async def test_an_item_without_message_times_says_so(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["hola"])
    k = KEYS.tenant(TENANT)
    found = orjson.loads(await redis.hget(k.review, item))
    for message in found["messages"]:
        message.pop("received_ms", None)
        message.pop("ts", None)
    await redis.hset(k.review, item, orjson.dumps(found))
    page = await ops.get("/ops/")
    assert page.status_code == 200
    assert 'data-label="Waiting" class="waited">?<br>' in page.text
    assert (await ops.get(f"/ops/item?tenant={TENANT}&id={item}")).status_code == 200


async def test_a_chatwoot_tenant_reads_as_its_inbox_and_account(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await park(redis, settings, ["hola"], tenant=CHATWOOT, person="42")
    page = await ops.get("/ops/")
    assert "Chatwoot inbox 3 (account 1)" in page.text
    chips = await ops.get("/ops/?reason=max_attempts")
    assert "of Chatwoot inbox 3 (account 1)" not in chips.text  # no tenant filter: every tenant
    filtered = await ops.get(f"/ops/?reason=max_attempts&tenant={CHATWOOT}")
    assert "Requeue every max_attempts item of Chatwoot inbox 3 (account 1)" in filtered.text


# ----------------------------------------------------------------- the item and conversation


async def test_the_item_page_shows_times_in_the_tenants_zone(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["hola"])
    at = int(time.time() * 1000) - 3600 * 1000
    await rewrite_messages(redis, TENANT, item, received_ms=at, name="María")
    page = await ops.get(f"/ops/item?tenant={TENANT}&id={item}")
    assert page.status_code == 200
    assert "Waiting since</dt><dd>" + html.escape(local(at)) in page.text
    assert "UTC" not in page.text
    assert "María" in page.text and f"WhatsApp {TENANT}" in page.text
    conversation = await ops.get(f"/ops/conversation?tenant={TENANT}&person={PERSON}")
    assert conversation.status_code == 200
    assert html.escape(local(at)) in conversation.text
    # A WhatsApp conversation keeps its window and formatting hints.
    assert "24-hour window" in conversation.text and "*bold*" in conversation.text


async def test_a_chatwoot_conversation_shows_no_whatsapp_window_nor_bold_hints(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    item = await park(redis, settings, ["hola"], tenant=CHATWOOT, person="42")
    for page in (
        await ops.get(f"/ops/conversation?tenant={CHATWOOT}&person=42"),
        await ops.get(f"/ops/item?tenant={CHATWOOT}&id={item}"),
    ):
        assert page.status_code == 200
        assert "24-hour" not in page.text and "*bold*" not in page.text
        assert "Chatwoot inbox 3 (account 1)" in page.text
        assert "UTC" not in page.text


# ----------------------------------------------------------------- the audit, paged and filtered


async def record_entries(redis: Redis, n: int, *, at_ms: int, **fields: str) -> None:
    for i in range(n):
        await audit.record(
            redis,
            KEYS,
            who=fields.get("who", "Ana"),
            action=fields.get("action", "requeue"),
            detail=f"{fields.get('tag', 'e')}{i}",
            retention_s=10**9,
            now_ms=at_ms + i,
        )


def details(text: str) -> list[str]:
    return re.findall(r'data-label="Detail" class="text">([^<]*)<', text)


async def test_the_audit_pages_through_every_entry_once_even_when_times_tie(
    ops: httpx.AsyncClient, redis: Redis
) -> None:
    now = int(time.time() * 1000)
    await record_entries(redis, 130, at_ms=now - 1_000_000)
    # A bulk chunk: 150 entries at one time (the scores tie across a page boundary).
    wanted = [{"who": "Bea", "action": "drop", "detail": f"bulk{i}"} for i in range(150)]
    await audit.record_many(redis, KEYS, wanted, retention_s=10**9, now_ms=now - 500_000)
    seen: list[str] = []
    url = "/ops/audit"
    pages = 0
    while url:
        page = await ops.get(url)
        assert page.status_code == 200, page.text
        pages += 1
        shown = details(page.text)
        assert len(shown) <= 100
        seen += shown
        found = re.search(r'href="(/ops/audit\?[^"]*before=[^"]*)">older entries', page.text)
        url = html.unescape(found.group(1)) if found else ""
    assert pages == 3
    signin = [d for d in seen if not d.startswith(("bulk", "e"))]  # the test's own sign-in
    assert len(seen) == 280 + len(signin) and len(set(seen)) == len(seen), "each entry once"
    # Tied entries come in the order Redis keeps them (by member): all of them, once.
    assert set(seen[len(signin) : len(signin) + 150]) == {f"bulk{i}" for i in range(150)}
    assert seen[-130:] == [f"e{i}" for i in reversed(range(130))], "newest first"
    assert "No older entries." in page.text


async def test_the_audit_filters_by_who_and_by_action(ops: httpx.AsyncClient, redis: Redis) -> None:
    now = int(time.time() * 1000)
    await record_entries(redis, 3, at_ms=now - 10_000, who="Bea", action="drop", tag="bd")
    await record_entries(redis, 2, at_ms=now - 9_000, who="Bea", action="requeue", tag="br")
    await record_entries(redis, 4, at_ms=now - 8_000, who="Ciro", action="drop", tag="cd")
    by_bea = details((await ops.get("/ops/audit?who=Bea")).text)
    assert sorted(by_bea) == ["bd0", "bd1", "bd2", "br0", "br1"]
    drops = details((await ops.get("/ops/audit?action=drop")).text)
    assert sorted(drops) == ["bd0", "bd1", "bd2", "cd0", "cd1", "cd2", "cd3"]
    both = await ops.get("/ops/audit?who=Bea&action=drop")
    assert sorted(details(both.text)) == ["bd0", "bd1", "bd2"]
    assert 'value="Bea"' in both.text and "clear the filters" in both.text
    assert details((await ops.get("/ops/audit?who=Nobody")).text) == []
    # Each name and action in the table links to the log filtered by it.
    assert 'href="/ops/audit?who=Ciro"' in (await ops.get("/ops/audit")).text


async def test_the_audit_refuses_a_bad_cursor_and_reads_a_bounded_number_of_entries(
    ops: httpx.AsyncClient, redis: Redis
) -> None:
    for bad in ("x", "12", "1.2.3", "-1.0", "1." + "9" * 50):
        answer = await ops.get("/ops/audit", params={"before": bad})
        assert answer.status_code == 400 and "bad audit cursor" in answer.text, bad
    now = int(time.time() * 1000)
    await record_entries(redis, 50, at_ms=now - 100_000, who="Bea")
    await record_entries(redis, 1, at_ms=now - 200_000, who="Ciro")
    # Looking through at most 20 entries a page: Ciro's is beyond, reached by the cursor.
    first = await audit.page(redis, KEYS, who="Ciro", scan=20, chunk=7)
    assert first.entries == [] and first.read == 20 and first.older
    pages = [first]
    while pages[-1].older and not pages[-1].entries:
        pages.append(await audit.page(redis, KEYS, who="Ciro", before=pages[-1].older, scan=20))
    assert [e.who for e in pages[-1].entries] == ["Ciro"]


# ----------------------------------------------------------------- the overview


async def test_the_overview_counts_the_fleets_review_items_by_reason(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    page = await ops.get("/ops/conversations")
    assert re.search(r"<dt>In review</dt>\s*<dd[^>]*>nothing</dd>", page.text), page.text
    await park(redis, settings, ["a"], reason="max_attempts")
    await park(redis, settings, ["b"], person="5491155550002", reason="too_old")
    await park(redis, settings, ["c"], tenant=CHATWOOT, person="42", reason="max_attempts")
    # The list indexes any item the index does not hold yet; then the overview reads the
    # kept counts only.
    assert (await ops.get("/ops/")).status_code == 200
    page = await ops.get("/ops/conversations")
    assert 'href="/ops/?reason=max_attempts">max_attempts: 2</a>' in page.text
    assert 'href="/ops/?reason=too_old">too_old: 1</a>' in page.text
    live = await ops.get("/ops/conversations?part=live")
    assert "max_attempts: 2" in live.text


# ----------------------------------------------------------------- live


async def test_the_review_list_offers_its_live_table_and_only_its_own_script(
    ops: httpx.AsyncClient, redis: Redis, settings: Settings
) -> None:
    await park(redis, settings, ["hola"])
    page = await ops.get("/ops/?reason=max_attempts")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "script-src 'unsafe" not in csp
    assert '<script src="/ops/live.js" defer></script>' in page.text
    assert page.text.count("<script") == 1, "no inline script"
    found = re.search(r'data-live="([^"]+)"', page.text)
    assert found
    live_url = html.unescape(found.group(1))
    assert "reason=max_attempts" in live_url and "part=live" in live_url
    before = await ops.get(live_url)
    assert before.status_code == 200 and "<html" not in before.text
    assert (
        "<script" not in before.text
        and "script-src" not in before.headers["content-security-policy"]
    )
    assert before.text.count("<tr>") == 2  # the header and one item
    # A new item shows in the live part without reloading the page (no script: a reload).
    await park(redis, settings, ["otra vez"], person="5491155550009")
    after = await ops.get(live_url)
    assert after.text.count("<tr>") == 3 and "5491155550009" in after.text
    # Signed out, the live part is refused like the page.
    ops.cookies.clear()
    refused = await ops.get(live_url)
    assert refused.status_code == 303 and "/ops/signin" in refused.headers["location"]
