"""Accounts in Debian's chromium: Ana signs in on her laptop (desktop width) and her phone
with her own password, sees both sessions, ends the laptop's from the phone, and the laptop is
signed out at its next click. Screenshots of each step under the test's tmp dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, expect
from redis.asyncio import Redis

from shared.keys import Keys
from shared.ops import audit
from shared.ops.accounts import password_credential
from shared.settings import Settings
from tests.ops.browser import PHONE, chromium, fits_the_width, served, shot

pytestmark = pytest.mark.slow
DESKTOP = {"width": 1280, "height": 800}
PASSWORD = "a long password of Ana's"


async def sign_in(page: Page, url: str, name: str, password: str) -> None:
    await page.goto(f"{url}/ops/")
    assert "/ops/signin" in page.url, "no session: the sign-in page"
    await page.fill("#name", name)
    await page.fill("#token", password)
    await page.click("button[type=submit]")


async def test_an_account_sees_its_sessions_and_ends_one_from_another_device(
    redis: Redis, settings: Settings, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    users = settings.with_overrides(ops_users=f"Ana:{password_credential(PASSWORD)}")
    async with served(users) as url, chromium() as browser:
        laptop = await (await browser.new_context(viewport=DESKTOP)).new_page()
        phone = await (await browser.new_context(viewport=PHONE)).new_page()

        await sign_in(laptop, url, "ana", "not it")
        where = await shot(laptop, shots, "1-wrong-password")
        await expect(laptop.get_by_role("alert")).to_have_text("Wrong name or password.")
        await expect(laptop.locator("label[for=token]")).to_have_text("Password or token")
        await laptop.fill("#name", "ana")
        await laptop.fill("#token", PASSWORD)
        await laptop.click("button[type=submit]")
        await expect(laptop.locator("header .who")).to_have_text("signed in as Ana")

        await sign_in(phone, url, "Ana", PASSWORD)
        await phone.get_by_role("link", name="Sessions").click()
        where = await shot(phone, shots, "2-sessions-on-the-phone")
        rows = phone.locator("table tbody tr")
        await expect(rows).to_have_count(2)
        await expect(rows.nth(0)).to_contain_text("(this one)")
        assert await fits_the_width(phone), f"wider than a phone: {where}"

        await rows.nth(1).get_by_role("button", name="End").click()
        where = await shot(phone, shots, "3-laptop-ended")
        await expect(phone.get_by_role("status")).to_contain_text("Ended")
        await expect(phone.locator("table tbody tr")).to_have_count(1)

        await laptop.get_by_role("link", name="Audit").click()
        where = await shot(laptop, shots, "4-laptop-signed-out")
        assert "/ops/signin" in laptop.url, f"the ended session still works: {where}"
    entries = await audit.entries(redis, Keys())
    assert [(e.who, e.action) for e in entries] == [("Ana", "end_session")], where
