"""The ops inbox in Debian's chromium, on a desktop and on a phone (390x844): the overview, a
tenant's conversations with a paused person who wrote again marked, search, a conversation as a
thread with an image fetched through the product, and a reply by hand from the thread.
Screenshots of each step are saved under the test's tmp dir (the path is in every assertion
message); set OPS_SCREENSHOTS to a folder to keep them there instead."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from playwright.async_api import expect
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn
from shared.keys import Keys
from shared.ops import takeover
from shared.settings import Settings
from tests.ops.browser import PHONE, chromium, fits_the_width, served, shot
from tests.ops.support import OPS_TOKEN, PERSON, TENANT, ops_settings, park
from tests.ops.test_inbox import ZONE, answered, intake, store_message
from tests.support.helpers import TOKEN

pytestmark = pytest.mark.slow
KEYS = Keys()
HOSTILE = "<script>document.title='owned'</script> ¿hay stock?"
DESKTOP = {"width": 1280, "height": 900}
WAITING = "5491166660022"


def png(width: int, height: int) -> bytes:
    """A real PNG of a solid colour: the browser decodes it, so its size proves it arrived."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\x20\x80\xc0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def folder(tmp_path: Path) -> Path:
    return tmp_path / "screenshots"  # shot() keeps them in OPS_SCREENSHOTS when it is set


@pytest.mark.parametrize("size", ["desktop", "phone"])
async def test_overview_conversations_search_and_a_thread_with_an_image(
    redis: Redis, settings: Settings, graph: GraphApiStandIn, tmp_path: Path, size: str
) -> None:
    shots, viewport = folder(tmp_path), PHONE if size == "phone" else DESKTOP
    graph.media.add("media-photo", png(120, 80), "image/png")
    await park(redis, settings, ["no anda el pago"], person="5491177770033")
    await answered(redis, settings, WAITING, "quiero hablar con alguien", "Ya te atienden.")
    await answered(redis, settings, PERSON, HOSTILE, "Sí, quedan 3.", name="Rosa Páez")
    await takeover.pause(redis, KEYS, TENANT, WAITING, by="Ana", why="lo atiendo", seconds=600)
    await store_message(redis, WAITING, "¿siguen ahí?", name="Mariana López")
    await intake(redis, settings)
    image = {"type": "image", "image": {"id": "media-photo", "mime_type": "image/png"}}
    await store_message(redis, PERSON, "esta", type="image", raw=image, name="Rosa Páez")
    await intake(redis, settings)
    sending = settings.with_overrides(
        sender="whatsapp", whatsapp_access_token=TOKEN, whatsapp_api_base_url=graph.url
    )
    async with served(ops_settings(sending, timezone=ZONE)) as url, chromium() as browser:
        page = await browser.new_page(viewport=viewport)
        await page.goto(f"{url}/ops/signin")
        await page.fill("#token", OPS_TOKEN)
        await page.fill("#name", "Ana")
        await page.click("button[type=submit]")
        await page.get_by_role("link", name="Conversations").click()
        where = await shot(page, shots, f"{size}-1-overview")
        await expect(page.locator("section.overview")).to_contain_text("Workers alive")
        assert await fits_the_width(page), f"wider than the screen: {where}"

        await page.get_by_role("link", name=TENANT).click()
        where = await shot(page, shots, f"{size}-2-conversations")
        rows = page.locator("table.conversations tbody tr")
        await expect(rows).to_have_count(3)
        await expect(rows.nth(0)).to_contain_text("Rosa Páez")  # the image came last
        paused = rows.filter(has_text="Mariana López")
        await expect(paused).to_contain_text("paused, 1 waiting")
        await expect(rows.filter(has_text="5491177770033")).to_contain_text("review: max_attempts")
        assert await fits_the_width(page), f"wider than the screen: {where}"

        await page.fill("#q", "mariana")
        await page.get_by_role("button", name="Search").click()
        where = await shot(page, shots, f"{size}-3-search")
        await expect(rows).to_have_count(1)
        await expect(page.get_by_role("status")).to_contain_text("among the newest 3")

        await page.get_by_role("link", name="All conversations").click()
        await page.get_by_role("link", name="Rosa Páez").click()
        photo = page.locator("li.bubble.customer img")
        await expect(photo).to_have_count(1)
        await expect(photo).to_have_js_property("naturalWidth", 120)  # fetched and decoded
        where = await shot(page, shots, f"{size}-4-thread")
        await expect(page.locator("li.bubble.customer").first).to_contain_text(HOSTILE)
        assert await page.title() != "owned", f"customer text ran as a script: {where}"
        await expect(page.locator("li.bubble.bot")).to_contain_text("Sí, quedan 3.")
        # In time order: the message, the bot's reply, then the image sent after it.
        kinds = await page.locator("ol.thread li.bubble").evaluate_all(
            "items => items.map(i => i.className)"
        )
        assert kinds == ["bubble customer", "bubble bot", "bubble customer"], where
        await expect(page.locator("li.bubble.customer").last).to_contain_text("waiting")
        assert await fits_the_width(page), f"wider than the screen: {where}"

        await page.fill("#text", "Te escribo yo, Ana.")
        await page.get_by_role("button", name="Send reply").click()
        where = await shot(page, shots, f"{size}-5-replied")
        await expect(page.get_by_role("status")).to_contain_text("Sent")
        mine = page.locator("li.bubble.business")
        await expect(mine).to_contain_text("Te escribo yo, Ana.")
        await expect(mine).to_contain_text("Ana")
        await expect(page.locator("p.state")).to_contain_text("bot paused")
        # The image, answered by hand, is in the memory now: still shown, from what it kept.
        await expect(photo).to_have_js_property("naturalWidth", 120)
        assert await fits_the_width(page), f"wider than the screen: {where}"
    (sent,) = graph.sent_texts(PERSON)
    assert sent.body == "Te escribo yo, Ana."


@pytest.mark.parametrize("size", ["desktop", "phone"])
async def test_the_list_and_the_open_thread_update_without_a_reload(
    redis: Redis, settings: Settings, tmp_path: Path, size: str
) -> None:
    shots, viewport = folder(tmp_path), PHONE if size == "phone" else DESKTOP
    await answered(redis, settings, PERSON, "hola", "¡Hola! ¿En qué te ayudo?", name="Rosa")
    async with served(ops_settings(settings, timezone=ZONE)) as url, chromium() as browser:
        page = await browser.new_page(viewport=viewport)
        await page.goto(f"{url}/ops/signin")
        await page.fill("#token", OPS_TOKEN)
        await page.fill("#name", "Ana")
        await page.click("button[type=submit]")
        await page.goto(f"{url}/ops/conversations?tenant={TENANT}")
        rows = page.locator("table.conversations tbody tr")
        await expect(rows).to_have_count(1)
        loaded_at = await page.evaluate("performance.timeOrigin")
        await store_message(redis, WAITING, HOSTILE, name="Mariana López")
        await intake(redis, settings)
        # Within a few seconds, without a reload: the new conversation on top.
        await expect(rows).to_have_count(2, timeout=10_000)
        await expect(rows.nth(0)).to_contain_text("Mariana López")
        assert await page.title() != "owned"
        await expect(page.locator("#live-status")).to_contain_text("Live: up to date")
        where = await shot(page, shots, f"{size}-6-live-list")
        assert await page.evaluate("performance.timeOrigin") == loaded_at, f"reloaded: {where}"

        await page.get_by_role("link", name="Rosa").click()
        bubbles = page.locator("ol.thread li.bubble")
        await expect(bubbles).to_have_count(2)
        await page.fill("#text", "a half-written reply")
        await store_message(redis, PERSON, "¿siguen abiertos?", name="Rosa")
        await intake(redis, settings)
        await expect(bubbles).to_have_count(3, timeout=10_000)
        await expect(bubbles.nth(2)).to_contain_text("¿siguen abiertos?")
        await expect(bubbles.nth(2)).to_contain_text("waiting")
        await expect(page.locator("#text")).to_have_value("a half-written reply")
        await shot(page, shots, f"{size}-7-live-thread")


async def test_with_scripts_off_every_page_still_works(
    redis: Redis, settings: Settings, tmp_path: Path
) -> None:
    shots = folder(tmp_path)
    await answered(redis, settings, PERSON, "hola", "¡Hola!", name="Rosa")
    async with served(ops_settings(settings)) as url, chromium() as browser:
        context = await browser.new_context(java_script_enabled=False, viewport=PHONE)
        page = await context.new_page()
        await page.goto(f"{url}/ops/signin")
        await page.fill("#token", OPS_TOKEN)
        await page.fill("#name", "Ana")
        await page.click("button[type=submit]")
        await page.get_by_role("link", name="Conversations").click()
        await page.get_by_role("link", name=TENANT).click()
        await page.fill("#q", "rosa")
        await page.get_by_role("button", name="Search").click()
        await page.get_by_role("link", name="Rosa").click()
        await expect(page.locator("ol.thread li.bubble")).to_have_count(2)
        await expect(page.locator("#live-status")).to_be_hidden()
        await shot(page, shots, "phone-8-no-script-thread")
        await store_message(redis, PERSON, "otra", name="Rosa")
        await intake(redis, settings)
        await page.reload()
        await expect(page.locator("ol.thread li.bubble")).to_have_count(3)
        await context.close()
