"""The ops page in Debian's chromium, as a person uses it on a phone: sign in, list the review
items, open one, requeue it, drop another, see the audit entries. Screenshots of each step
are saved under the test's tmp dir (the path is in every assertion message)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from playwright.async_api import expect
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn
from shared.keys import Keys
from shared.ops import audit
from shared.settings import Settings
from tests.ops.browser import PHONE, chromium, fits_the_width, served, shot
from tests.ops.support import OPS_TOKEN, PERSON, TENANT, ops_settings, park
from tests.support.helpers import TOKEN

pytestmark = pytest.mark.slow
HOSTILE = "<script>document.title='owned'</script> hola"


async def test_sign_in_list_open_requeue_drop_and_see_the_audit(
    redis: Redis, settings: Settings, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    first = await park(redis, settings, [HOSTILE, "¿me ayudan?"], reason="too_old")
    second = await park(redis, settings, ["otra"], person="5491155550002", reason="failed")
    async with served(ops_settings(settings)) as url, chromium() as browser:
        page = await browser.new_page(viewport=PHONE)
        await page.goto(f"{url}/ops/")
        assert "/ops/signin" in page.url, "no session: the sign-in page"
        await page.fill("#token", "wrong")
        await page.fill("#name", "Ana")
        await page.click("button[type=submit]")
        where = await shot(page, shots, "1-wrong-token")
        await expect(page.get_by_role("alert")).to_have_text("Wrong token.")
        await page.fill("#token", OPS_TOKEN)
        await page.fill("#name", "Ana")
        await page.click("button[type=submit]")
        await expect(page.locator("header .who")).to_have_text("signed in as Ana")
        where = await shot(page, shots, "2-review-list")
        assert await page.locator("table.items tbody tr").count() == 2, where
        assert await fits_the_width(page), f"wider than a phone: {where}"

        await page.get_by_role("link", name="too_old (1)").click()
        assert await page.locator("table.items tbody tr").count() == 1, where
        await page.get_by_role("link", name="open").click()
        where = await shot(page, shots, "3-item")
        await expect(page.locator("table.messages")).to_contain_text(HOSTILE)
        assert await page.title() != "owned", f"customer text ran as a script: {where}"
        assert await fits_the_width(page), f"wider than a phone: {where}"

        await page.get_by_role("button", name="Requeue to the AI").click()
        where = await shot(page, shots, "4-requeued")
        await expect(page.get_by_role("status")).to_contain_text("Requeued")
        await expect(page.locator("table.audit")).to_contain_text("requeue")
        await expect(page.locator("table.audit")).to_contain_text(f"item {first} (too_old)")
        assert f"/ops/conversation?tenant={TENANT}&person={PERSON}" in page.url, where
        await expect(page.locator("#state")).to_contain_text("Due")

        await page.goto(f"{url}/ops/")
        await page.get_by_role("link", name="open").click()
        await page.get_by_role("button", name="Drop").click()
        where = await shot(page, shots, "5-dropped")
        await expect(page.get_by_role("status")).to_contain_text("Dropped")

        await page.get_by_role("link", name="Audit").click()
        where = await shot(page, shots, "6-audit")
        rows = page.locator("table.audit tbody tr")
        await expect(rows).to_have_count(2)
        await expect(rows.nth(0)).to_contain_text("drop")
        await expect(rows.nth(0)).to_contain_text("Ana")
        await expect(rows.nth(1)).to_contain_text("requeue")
        assert await fits_the_width(page), f"wider than a phone: {where}"
    assert await redis.hlen(Keys().tenant(TENANT).review) == 0
    entries = await audit.entries(redis, Keys())
    assert [(e.who, e.action) for e in entries] == [("Ana", "drop"), ("Ana", "requeue")], where
    assert second in entries[0].detail, where


async def test_reply_by_hand_reaches_the_graph_api(
    redis: Redis, settings: Settings, graph: GraphApiStandIn, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    item = await park(redis, settings, ["¿a qué hora abren?"])
    sending = settings.with_overrides(
        sender="whatsapp", whatsapp_access_token=TOKEN, whatsapp_api_base_url=graph.url
    )
    async with served(ops_settings(sending)) as url, chromium() as browser:
        page = await browser.new_page(viewport=PHONE)
        await page.goto(f"{url}/ops/item?tenant={TENANT}&id={item}")
        await page.fill("#name", "Ana")
        await page.fill("#token", OPS_TOKEN)
        await page.click("button[type=submit]")
        where = await shot(page, shots, "1-item-after-sign-in")
        assert "/ops/item?" in page.url, f"signing in leads back to the item: {where}"
        await page.get_by_role("link", name=PERSON, exact=True).click()
        await page.fill("#text", "Abrimos a las 9, ¡lo esperamos!")
        where = await shot(page, shots, "2-reply-typed")
        assert await fits_the_width(page), f"wider than a phone: {where}"
        await page.get_by_role("button", name="Send reply").click()
        where = await shot(page, shots, "3-reply-sent")
        await expect(page.get_by_role("status")).to_contain_text("Sent")
        await expect(page.locator("table.memory")).to_contain_text("Abrimos a las 9")
        (sent,) = graph.sent_texts(PERSON)
        assert sent.body == "Abrimos a las 9, ¡lo esperamos!", where
        await expect(page.locator("table.sent")).to_contain_text(sent.wamid)
        await expect(page.locator("table.audit")).to_contain_text("reply")


async def test_pages_say_which_way_they_go_and_a_bulk_drop_shows_its_progress(
    redis: Redis, settings: Settings, tmp_path: Path
) -> None:
    """Issue 23: from a later page "newer page" led to older items; a bulk past what fit in
    one request answered 503 and hid what it did."""
    shots = tmp_path / "screenshots"
    k = Keys().tenant(TENANT)
    await redis.sadd(Keys().tenants, TENANT)
    n = 1_230
    await redis.hset(
        k.review,
        mapping={
            f"old{i:05}": orjson.dumps(
                {"id": f"old{i:05}", "person": f"p{i}", "reason": "too_old", "reviewed_ms": i + 1}
            )
            for i in range(n)
        },
    )
    parked = await park(redis, settings, ["hola"], reason="max_attempts")
    async with served(ops_settings(settings)) as url, chromium() as browser:
        page = await browser.new_page(viewport=PHONE)
        await page.goto(f"{url}/ops/signin")
        await page.fill("#token", OPS_TOKEN)
        await page.fill("#name", "Ana")
        await page.click("button[type=submit]")
        await page.get_by_role("link", name=f"too_old ({n})").click()
        where = await shot(page, shots, "1-first-page")
        await expect(page.locator("nav.pages")).to_contain_text(f"Items 1–50 of {n}, oldest first")
        await expect(page.get_by_role("link", name="← older items")).to_have_count(0)
        assert await fits_the_width(page), f"wider than a phone: {where}"
        await page.get_by_role("link", name="newer items →").click()
        await page.get_by_role("link", name="newer items →").click()
        where = await shot(page, shots, "2-third-page")
        await expect(page.locator("nav.pages")).to_contain_text(f"Items 101–150 of {n}")
        await expect(page.locator('table.items a[href$="id=old00100"]')).to_have_count(1)
        await page.get_by_role("link", name="← older items").click()
        where = await shot(page, shots, "3-older-page")
        await expect(page.locator("nav.pages")).to_contain_text(f"Items 51–100 of {n}")
        await expect(page.locator('table.items a[href$="id=old00050"]')).to_have_count(1)
        await expect(page.locator('table.items a[href$="id=old00100"]')).to_have_count(0)

        await page.get_by_role(
            "button", name=f"Drop every too_old item of every tenant ({n})"
        ).click()
        where = await shot(page, shots, "4-drop-refused-unconfirmed")
        await expect(page.get_by_role("main")).to_contain_text("tick the box")
        await page.go_back()
        await page.check("input[name=confirm]")
        await page.get_by_role(
            "button", name=f"Drop every too_old item of every tenant ({n})"
        ).click()
        where = await shot(page, shots, "5-bulk-progress")
        assert "/ops/bulk?job=" in page.url, where
        await expect(page.locator("progress")).to_have_attribute("max", str(n))
        await expect(page.locator("#bulk-state")).to_have_text("finished", timeout=30_000)
        where = await shot(page, shots, "6-bulk-finished")
        await expect(page.locator("#bulk-result")).to_contain_text(
            f"Dropped {n} of {n} item(s); 0 left on the list; 0 gone meanwhile"
        )
        await expect(page.locator("progress")).to_have_attribute("value", str(n))
        assert await fits_the_width(page), f"wider than a phone: {where}"
        await page.get_by_role("link", name="Back to the review list").click()
        where = await shot(page, shots, "7-list-after")
        await expect(page.locator("table.items tbody tr")).to_have_count(0)
        await page.get_by_role("link", name="all").first.click()
        await expect(page.locator("table.items tbody tr")).to_have_count(1)
    assert await redis.hkeys(k.review) == [parked.encode()], where
    entries = await audit.entries(redis, Keys(), limit=2000)
    assert sum(e.action == "drop" for e in entries) == n, where
    assert entries[0].action == "bulk drop" and f"dropped {n} of {n}" in entries[0].detail, where
