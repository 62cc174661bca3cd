"""The live feed's page in a real headless Chromium: starting the browser (one page that records its requests,
console errors and page errors), waiting on the page's state, and the PDF figures a synthetic job's stats carry.

The browser tests need Debian's chromium and the playwright package; they fail (never skip) without them:
    apt-get update && apt-get install -y chromium        # as root
    .venv/bin/pip install playwright                     # never `playwright install`: it downloads a browser
``HANDBOOK_CHROMIUM`` names another chromium executable. Screenshots go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import anyio
import pytest

from orchestrator.core.events import JobFinished
from orchestrator.views.feed import Feed

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
PAGE_TITLE = "handbook · live feed"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
INSTALL_HINT = (
    "as root: `apt-get update && apt-get install -y chromium` (Debian's package, about 20 s), and "
    "`.venv/bin/pip install playwright`; never run `playwright install` (it downloads a browser, which fails here)"
)


def chromium_path() -> str:
    path = os.environ.get("HANDBOOK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).is_file():
        pytest.fail(f"Chromium is missing ({path}): the browser test needs it. Install it: {INSTALL_HINT}")
    return path


def async_playwright():
    try:
        from playwright.async_api import async_playwright as ap
    except ImportError:
        pytest.fail(f"the playwright package is missing: the browser test needs it. Install it: {INSTALL_HINT}")
    return ap()


class Browser:
    """One headless Chromium page that records every request, console error and page error."""

    def __init__(self, p, browser, page):
        self.p, self.browser, self.page = p, browser, page
        self.requests: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))


class open_browser:
    async def __aenter__(self) -> Browser:
        exe = chromium_path()
        self._pw = async_playwright()
        p = await self._pw.__aenter__()
        self._browser = await p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        page = await self._browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(20_000)
        return Browser(p, self._browser, page)

    async def __aexit__(self, *exc):
        try:
            await self._browser.close()
        finally:
            await self._pw.__aexit__(*exc)


async def wait_js(page, fn: str, within: float = 20.0) -> None:
    """Poll a JS function until it returns true. (page.wait_for_function evaluates strings with eval, which the
    page's Content-Security-Policy rightly forbids; page.evaluate calls a function without eval.)"""
    with anyio.fail_after(within):
        while not await page.evaluate(fn):  # noqa: ASYNC110 - the page's state has no event to await from here
            await anyio.sleep(0.05)


PDF = {"pdf_ready_s": 12.34, "typeset_after_write_s": 0.4, "typeset_cpu_s": {"during_write": 3.2, "after_write": 0.3}}


def with_pdf(emit):
    """``emit``, with a JobFinished's stats saying when book.pdf was on disk (as stats.json does for a PDF job)."""
    return lambda e: emit(JobFinished({**e.stats, **PDF}, e.complete, e.t) if isinstance(e, JobFinished) else e)


def local_only(requests: list[str], feed: Feed) -> list[str]:
    return [u for u in requests if not u.startswith(feed.url)]
