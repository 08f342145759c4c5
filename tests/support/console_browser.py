"""Real headless Chromium for the console tests: Debian's ``chromium``, driven by Playwright.

``scripts/bootstrap`` installs the browser (``apt-get install chromium``); Playwright drives
it through ``executable_path``, so no browser of Playwright's own is ever downloaded.
Screenshots go to ``test-artifacts/console/<page>.png`` under the repository root.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from playwright.async_api import Browser, Page, async_playwright

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
VIEWPORT = {"width": 1280, "height": 900}


def _require_chromium() -> None:
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: run scripts/bootstrap (it installs it)")


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    _require_chromium()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield browser
        finally:
            await browser.close()


async def screenshot(page: Page, name: str) -> Path:
    """Save the whole page as ``test-artifacts/console/<name>.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path
