"""The live feed's page in a real headless Chromium, fed by a synthetic job: what it shows while the job runs and
after it (titles, rate, forecast, final stats, when the PDF was ready), hostile text shown as text, nothing loaded
from the network; and a browser that arrives after the job. Needs chromium and playwright (see feed_browser.py)."""

from __future__ import annotations

import re

import anyio
import pytest
from feed_browser import ARTIFACTS, PAGE_TITLE, local_only, open_browser, wait_js, with_pdf
from feed_synth import HOSTILE, synthetic_job

from orchestrator.views.feed import Feed

pytestmark = pytest.mark.anyio


# -- the page in a real browser ---------------------------------------------------------------------------------


async def test_feed_in_chromium_during_and_after_a_synthetic_job():
    ARTIFACTS.mkdir(exist_ok=True)
    async with Feed(port=0, linger=0) as feed, open_browser() as b:
        page = b.page
        assert feed.url.startswith("http://127.0.0.1:")
        await page.goto(feed.url)
        await page.wait_for_selector("body[data-connected=yes]")
        assert feed.clients == 1
        mid: dict[str, object] = {}
        job_done = anyio.Event()

        async def watch_mid_run():
            # While the job runs: section titles stream in, and the server-counted rate is shown.
            await wait_js(
                page,
                "() => document.querySelectorAll('#feed .entry:not(.plan) h3').length >= 3"
                " && /^[0-9,]+(\\.[0-9])?$/.test(document.getElementById('rate').textContent)"
                " && !/^0(\\.0)?$/.test(document.getElementById('rate').textContent)",
            )
            mid["finished_yet"] = job_done.is_set()
            mid["titles"] = await page.locator("#feed .entry:not(.plan) h3").all_text_contents()
            mid["rate"] = await page.text_content("#rate")
            mid["phase"] = await page.text_content("#phase")
            mid["fleet"] = await page.locator("#fleet .be").count()
            mid["forecast_shown"] = await page.locator("#forecast-card").is_visible()
            mid["eta_label"] = await page.text_content("#eta-label")
            mid["eta"] = await page.text_content("#eta")
            mid["forecast"] = await page.text_content("#forecast-sub")
            await page.screenshot(path=str(ARTIFACTS / "feed-midrun.png"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_mid_run)
            stats = await synthetic_job(
                with_pdf(feed), parts=2, chapters=2, sections=4, cap=3, words=160, chunk_delay=0.03,
                hostile_path="1.1.2", retry_path="2.1.1", forecast_s=60.0, pdf_pages=9, unusable_path="1.2.3",
            )
            job_done.set()

        assert mid["finished_yet"] is False, "the mid-run checks must happen while the job runs"
        assert mid["phase"] == "writing"
        assert mid["fleet"] == 2
        assert float(str(mid["rate"]).replace(",", "")) > 0
        assert all(t for t in mid["titles"])  # type: ignore[union-attr]
        assert any("First Principles" in t or "in Practice" in t for t in mid["titles"])  # type: ignore[union-attr]
        # The job made a forecast: it is shown beside the live figures, with the time still to go.
        assert mid["forecast_shown"] is True and mid["eta_label"] == "forecast · ETA"
        assert re.fullmatch(r"[0-9]+s|[0-9]+m[0-9]{2}s", str(mid["eta"])), mid["eta"]
        assert mid["forecast"] == "forecast 1m00s · 10 A5 pages"

        # After the job: the final stats table, and the header says it finished.
        await page.wait_for_selector("body[data-finished=yes]")
        cell = page.locator('#stats tr[data-key="sections"] td').nth(1)
        assert await cell.text_content() == "16"
        tokens = page.locator('#stats tr[data-key="tokens_written"] td').nth(1)
        assert await tokens.text_content() == f"{stats['tokens_written']:,}"
        assert await page.locator('#stats tr[data-key="best_second_tok_s"]').count() == 1
        assert await page.text_content("#sections-done") == "16"
        assert await page.text_content("#phase") == "finished"
        assert (await page.text_content("#verdict")).startswith("Complete")
        # ...and at the end, how good the forecast was.
        assert await page.text_content("#eta-label") == "forecast · took"
        assert re.fullmatch(r"forecast 1m00s, took [0-9.]+s \(-[0-9]+%\)", await page.text_content("#eta-basis"))
        assert await page.text_content("#forecast-sub") == "10 A5 pages forecast, 9 typeset (-10%)"
        # ...and when the PDF was ready.
        assert await page.locator("#pdf-ready").is_visible()
        assert await page.text_content("#pdf-ready") == (
            "PDF ready 12.3 s after start, 0.4 s after the last section (9 A5 pages)")
        assert await page.locator('#stats tr[data-key="typeset_after_write_s"]').count() == 1
        # An answer our check refused (1.2.3's first) is counted apart from the backends' errors (the cut 2.1.1).
        assert "1 unusable answers" in await page.text_content("#inflight-total")
        unusable = page.locator('#stats tr[data-key="unusable_replies"] td').nth(1)
        assert await unusable.text_content() == "1"
        rows = " ".join(await page.locator("#stats td").all_text_contents())
        assert re.search(r"\d+ sections · [\d,]+ tok · \d+ err · 1 unusable", rows), rows

        # The hostile section is shown as text; nothing in it ran.
        hostile = page.locator("#feed .entry").filter(has=page.locator(".path", has_text=re.compile(r"^1\.1\.2$")))
        assert await hostile.count() == 1
        assert await hostile.locator(".text").text_content() == HOSTILE
        assert await page.locator("#feed img").count() == 0
        assert await page.title() == PAGE_TITLE
        assert await page.evaluate("document.title") == PAGE_TITLE

        # The retried section shows its second attempt's text only.
        retried = page.locator("#feed .entry").filter(has=page.locator(".path", has_text=re.compile(r"^2\.1\.1$")))
        assert "attempt 2" in (await retried.locator(".badge").text_content())

        await page.screenshot(path=str(ARTIFACTS / "feed.png"))
        assert local_only(b.requests, feed) == [], "the page loaded something from the network"
        assert b.errors == []


async def test_a_browser_that_arrives_late_sees_recent_sections_and_the_final_stats():
    async with Feed(port=0) as feed:
        await synthetic_job(feed, parts=1, chapters=2, sections=3, chunk_delay=0.001, hostile_path="1.2.3")
        async with open_browser() as b:
            page = b.page
            await page.goto(feed.url)
            await page.wait_for_selector("body[data-finished=yes]")
            assert await page.locator("#feed .entry:not(.plan)").count() == 6
            assert await page.text_content("#sections-done") == "6"
            # No forecast was made: the page says nothing about one.
            assert await page.locator("#forecast-card").is_hidden()
            assert "ETA" not in await page.inner_text("header")  # what is rendered, hidden parts aside
            assert await page.locator("#pdf-ready").is_hidden()  # no PDF in this job's stats: nothing said of one
            hostile = page.locator("#feed .entry").filter(has=page.locator(".path", has_text="1.2.3"))
            assert await hostile.locator(".text").text_content() == HOSTILE
            assert await page.locator("#feed img").count() == 0
            assert await page.title() == PAGE_TITLE
            assert b.errors == []

        async def close_soon():
            await anyio.sleep(0.2)
            feed.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(close_soon)
            with anyio.fail_after(5):
                await feed.linger()  # linger=None: until close() (or Ctrl-C)
