"""A real browser on the ops page: the receiver served by uvicorn on a free port, in the test's
event loop, and Debian's chromium driven by Playwright (never a browser Playwright downloads:
`scripts/test` installs the `chromium` package where it can). A missing chromium fails the test,
saying so."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import uvicorn
from playwright.async_api import Browser, Page, async_playwright

from receiver.app import create_app
from scripts.dev.redis_server import free_port
from shared.settings import Settings

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
PHONE = {"width": 390, "height": 844}  # a phone's viewport in CSS pixels


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[str]:
    """The receiver app of `settings` behind a real HTTP server; its base URL."""
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started:
                break
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        assert server.started, "uvicorn did not start within 10 s"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


def require_chromium() -> None:
    """Fail (never skip) when Debian's chromium is not installed, saying how to get it."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's chromium. Run scripts/test "
            "(it installs it) or `apt-get install -y chromium`; never `playwright install`."
        )


def make_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    require_chromium()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()


SCREENSHOTS = "OPS_SCREENSHOTS"  # a folder to keep every browser test's screenshots in


async def shot(page: Page, folder: Path, name: str) -> Path:
    """A full-page screenshot under the test's tmp dir (or, with OPS_SCREENSHOTS set, in that
    folder, one subfolder per test: `OPS_SCREENSHOTS=/tmp/shots scripts/test tests/ops -k
    browser` leaves them where a person can open them); its path (for assertion messages)."""
    kept = os.environ.get(SCREENSHOTS)
    if kept:
        folder = Path(kept) / folder.parent.name.rstrip("0123456789")
    path = make_folder(folder) / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


async def fits_the_width(page: Page) -> bool:
    """No horizontal scrolling: the page is usable on a phone without zooming out."""
    return bool(
        await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    )
