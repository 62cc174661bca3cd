"""The library's live page in a real headless Chromium (issue 27): the books in flight with their progress and
their latest sections, the finished ones, the servers' rate; a foreign Host is refused. Needs chromium and
playwright (see feed_browser.py)."""

from __future__ import annotations

import json

import aiohttp
import anyio
import pytest
from feed_browser import ARTIFACTS, open_browser, wait_js

from orchestrator import Settings, agenerate_library
from orchestrator.sim.launch import SimFleet
from orchestrator.views.library_feed import LibraryFeed
from orchestrator.views.library_progress import LibraryState

pytestmark = pytest.mark.anyio


async def test_a_library_on_the_simulator_in_chromium(tmp_path):
    ARTIFACTS.mkdir(exist_ok=True)
    file = tmp_path / "lib.jsonl"
    file.write_text("\n".join(json.dumps({"id": f"book-{i}", "prompt": f"A handbook of topic {i}", "parts": 1,
                                          "chapters": 2, "sections": 3}) for i in range(6)) + "\n")
    state = LibraryState()
    settings = Settings(cap=4, words=80, max_tokens=120, formats=("md",), stream_sections="auto")
    with SimFleet(cards=2, time_scale=1.5) as fleet:
        async with LibraryFeed(state) as feed, open_browser() as b:
            page = b.page
            await page.goto(feed.url)
            mid: dict[str, object] = {}
            done = anyio.Event()

            async def watch_mid_run() -> None:
                await wait_js(page, "() => document.querySelectorAll('#books .book .recent li').length >= 1"
                                    " && /^[0-9,]+$/.test(document.getElementById('rate').textContent)", within=90)
                mid["finished_yet"] = done.is_set()
                mid["books"] = await page.locator("#books .book").count()
                mid["sections"] = await page.locator("#books .book .recent li").all_text_contents()
                await page.screenshot(path=str(ARTIFACTS / "library-feed-midrun.png"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_mid_run)
                result = await agenerate_library(file, fleet.urls, settings, tmp_path / "out", state,
                                                 books_in_flight=2)
                done.set()
            assert result.complete
            assert mid["finished_yet"] is False and 1 <= mid["books"] <= 2  # type: ignore[operator]
            titles = {r["section"] for r in __import__("pyarrow.parquet", fromlist=["x"]).read_table(
                tmp_path / "out" / "sections.parquet").to_pylist()}
            assert set(mid["sections"]) <= titles  # type: ignore[arg-type]
            await wait_js(page, "() => document.body.dataset.finished === 'yes'", within=10)
            assert await page.text_content("#done") == "6" and await page.text_content("#total") == "6"
            assert await page.locator("#finished li").count() == 6
            assert not b.errors, b.errors
            async with aiohttp.ClientSession() as s, s.get(feed.url + "status",
                                                           headers={"Host": "evil.example"}) as r:
                assert r.status == 403
