"""The review list, an item and the audit in Debian's chromium, on a desktop and on a phone
(390x844): how long each customer waited with their name and the tenant named by what it is,
times in the tenant's zone, the table updating without a reload, a Chatwoot item without
WhatsApp's window, the audit paged and filtered; and the list with scripts off. Screenshots
are saved under the test's tmp dir (set OPS_SCREENSHOTS to keep them elsewhere)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.async_api import Page, expect
from redis.asyncio import Redis

from shared.keys import Keys
from shared.ops import audit
from shared.settings import Settings
from tests.ops.browser import PHONE, chromium, fits_the_width, served, shot
from tests.ops.support import OPS_TOKEN, PERSON, TENANT, ops_settings, park
from tests.ops.test_review_pages import CHATWOOT, ZONE, local, rewrite_messages

pytestmark = pytest.mark.slow
KEYS = Keys()
DESKTOP = {"width": 1280, "height": 900}


def folder(tmp_path: Path) -> Path:
    return tmp_path / "screenshots"  # shot() keeps them in OPS_SCREENSHOTS when it is set


async def sign_in(page: Page, url: str) -> None:
    await page.goto(f"{url}/ops/signin")
    await page.fill("#token", OPS_TOKEN)
    await page.fill("#name", "Ana")
    await page.click("button[type=submit]")


@pytest.mark.parametrize("size", ["desktop", "phone"])
async def test_the_review_list_reads_as_people_and_updates_live(
    redis: Redis, settings: Settings, tmp_path: Path, size: str
) -> None:
    shots, viewport = folder(tmp_path), PHONE if size == "phone" else DESKTOP
    item = await park(redis, settings, ["hola", "¿hay alguien?"])
    two_hours_ago = int(time.time() * 1000) - 2 * 3600 * 1000
    await rewrite_messages(redis, TENANT, item, received_ms=two_hours_ago, name="Rosa Páez")
    cw_item = await park(redis, settings, ["hola"], tenant=CHATWOOT, person="42")
    async with served(ops_settings(settings, timezone=ZONE)) as url, chromium() as browser:
        page = await browser.new_page(viewport=viewport)
        await sign_in(page, url)
        await page.goto(f"{url}/ops/")
        rows = page.locator("table.items tbody tr")
        await expect(rows).to_have_count(2)
        where = await shot(page, shots, f"{size}-review-1-list")
        await expect(page.locator("table.items thead")).to_contain_text("Waiting")
        rosa = rows.filter(has_text="Rosa Páez")
        await expect(rosa).to_contain_text(PERSON)
        await expect(rosa).to_contain_text(f"WhatsApp {TENANT}")
        await expect(rosa.locator("td.waited strong")).to_have_text("2h00m")
        await expect(rosa).to_contain_text(f"since {local(two_hours_ago)}")
        await expect(rosa).to_contain_text("parked")
        # (Not found by "42": a time on the page may hold it, at minute 42.)
        chatwoot = rows.filter(has_text="Chatwoot inbox 3 (account 1)")
        await expect(chatwoot).to_have_count(1)
        await expect(chatwoot.locator("td").nth(1)).to_contain_text("42")
        assert await fits_the_width(page), f"wider than the screen: {where}"

        loaded_at = await page.evaluate("performance.timeOrigin")
        await park(redis, settings, ["sigo acá"], person="5491155550009")
        await expect(rows).to_have_count(3, timeout=10_000)
        await expect(page.locator("p.matched")).to_contain_text("3 match these filters")
        await expect(page.locator("#live-status")).to_contain_text("Live: up to date")
        where = await shot(page, shots, f"{size}-review-2-live")
        assert await page.evaluate("performance.timeOrigin") == loaded_at, f"reloaded: {where}"

        await page.goto(f"{url}/ops/item?tenant={CHATWOOT}&id={cw_item}")
        where = await shot(page, shots, f"{size}-review-3-chatwoot-item")
        await expect(page.locator("main, body").first).not_to_contain_text("24-hour")
        await expect(page.locator("body")).to_contain_text("Chatwoot inbox 3 (account 1)")
        assert await fits_the_width(page), f"wider than the screen: {where}"


@pytest.mark.parametrize("size", ["desktop", "phone"])
async def test_the_audit_pages_and_filters(
    redis: Redis, settings: Settings, tmp_path: Path, size: str
) -> None:
    shots, viewport = folder(tmp_path), PHONE if size == "phone" else DESKTOP
    now = int(time.time() * 1000)
    for i in range(120):
        who, action = ("Bea", "drop") if i % 2 else ("Ciro", "requeue")
        await audit.record(
            redis, KEYS, who=who, action=action, detail=f"d{i}", retention_s=10**9, now_ms=now + i
        )
    async with served(ops_settings(settings, timezone=ZONE)) as url, chromium() as browser:
        page = await browser.new_page(viewport=viewport)
        await sign_in(page, url)
        await page.goto(f"{url}/ops/audit")
        rows = page.locator("table.audit tbody tr")
        await expect(rows).to_have_count(100)
        await page.get_by_role("link", name="older entries →").click()
        total = await redis.zcard(KEYS.audit)  # and what signing in recorded, if anything
        await expect(rows).to_have_count(total - 100)
        await expect(page.locator("nav.pages")).to_contain_text("No older entries.")
        where = await shot(page, shots, f"{size}-audit-1-older")
        assert await fits_the_width(page), f"wider than the screen: {where}"
        await page.goto(f"{url}/ops/audit")
        await page.fill("#who", "Bea")
        await page.fill("#action", "drop")
        await page.get_by_role("button", name="Filter").click()
        await expect(rows).to_have_count(60)
        await expect(rows.filter(has_text="Ciro")).to_have_count(0)
        where = await shot(page, shots, f"{size}-audit-2-filtered")
        assert await fits_the_width(page), f"wider than the screen: {where}"


async def test_with_scripts_off_the_review_list_still_works(
    redis: Redis, settings: Settings, tmp_path: Path
) -> None:
    shots = folder(tmp_path)
    await park(redis, settings, ["hola"])
    async with served(ops_settings(settings)) as url, chromium() as browser:
        context = await browser.new_context(java_script_enabled=False, viewport=PHONE)
        page = await context.new_page()
        await sign_in(page, url)
        await page.goto(f"{url}/ops/")
        rows = page.locator("table.items tbody tr")
        await expect(rows).to_have_count(1)
        await expect(page.locator("#live-status")).to_be_hidden()
        await park(redis, settings, ["otra"], person="5491155550009")
        await page.reload()
        await expect(rows).to_have_count(2)
        await shot(page, shots, "phone-review-4-no-script")
        await context.close()
