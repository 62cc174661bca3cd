"""`handbook replay` in a real headless Chromium: a real job against simulated cards, watched live with --record's
Recorder beside the feed, then its recording replayed by the CLI at 4x; the replayed page shows the same sections,
the same final figures and the same server-counted rate as the live page did. Needs chromium and playwright (see
feed_browser.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import anyio
import pytest
from feed_browser import ARTIFACTS, local_only, open_browser, wait_js

from orchestrator.views.feed import Feed
from orchestrator.views.recording import RECORDING_FILE, Recorder

pytestmark = pytest.mark.anyio

FIGURES = ("sections", "tokens_written", "requests", "whole_job_s")


async def _shown(page) -> dict[str, object]:
    """What the finished page says: its titles, rate, sections done and final figures."""
    await wait_js(page, "() => document.body.dataset.finished === 'yes'", within=120)
    out: dict[str, object] = {
        "titles": sorted(await page.locator("#feed .entry:not(.plan) h3").all_text_contents()),
        "rate": await page.text_content("#rate"),
        "sections_done": await page.text_content("#sections-done"),
    }
    for key in FIGURES:
        cell = page.locator(f'#stats tr[data-key="{key}"] td').nth(1)
        out[key] = await cell.text_content() if await cell.count() else None
    return out


async def _replay_url(proc: subprocess.Popen) -> str:
    """The feed address the replay prints on stderr."""
    assert proc.stderr is not None
    with anyio.fail_after(60):
        while True:
            line = await anyio.to_thread.run_sync(proc.stderr.readline)
            if not line:
                pytest.fail(f"handbook replay ended without serving the feed (exit {proc.wait()})")
            m = re.search(r"live feed at (http://127\.0\.0\.1:\d+/)", line)
            if m:
                return m.group(1)


async def test_a_recorded_job_replayed_in_chromium_shows_what_the_live_page_showed(tmp_path):
    from orchestrator import Settings, agenerate
    from orchestrator.sim.launch import SimFleet

    ARTIFACTS.mkdir(exist_ok=True)
    out = tmp_path / "out"
    recorder = Recorder(out)
    with SimFleet(cards=2, time_scale=1.5) as fleet:
        async with Feed(port=0, linger=0) as feed, open_browser() as b:
            await b.page.goto(feed.url)
            await wait_js(b.page, "() => document.body.dataset.connected === 'yes'")
            result = await agenerate(
                "Write me a complete software engineering handbook", backends=fleet.urls,
                settings=Settings(parts=2, chapters=2, sections=3, words=100, max_tokens=160, formats=("md",), cap=6),
                out=out, on_event=[feed, recorder], deltas=True,
            )
            recorder.close()
            live = await _shown(b.page)
            assert b.errors == [] and local_only(b.requests, feed) == []
    assert result.complete and result.stats["sections"] == 12
    assert (out / RECORDING_FILE).is_file()
    assert re.fullmatch(r"[0-9,]+(\.[0-9])?", str(live["rate"])) and float(str(live["rate"]).replace(",", "")) > 0

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(  # noqa: ASYNC220 - Popen only starts it; its stderr is read off the loop
        [sys.executable, "-m", "orchestrator", "replay", str(out), "--speed", "4", "-q"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        url = await _replay_url(proc)
        async with open_browser() as b:
            await b.page.goto(url)
            await wait_js(b.page, "() => document.body.dataset.connected === 'yes'")
            replayed = await _shown(b.page)
            await b.page.screenshot(path=str(ARTIFACTS / "feed-replay.png"))
            assert b.errors == []
            assert [u for u in b.requests if not u.startswith(url)] == []
    finally:
        proc.send_signal(signal.SIGINT)  # the feed lingers until Ctrl-C
        code = proc.wait(timeout=30)
    assert code == 0
    assert replayed == live
    titles = {t for p in result.outline.parts for c in p.chapters for t in c.sections}
    assert set(replayed["titles"]) <= titles and replayed["titles"]  # type: ignore[arg-type]
    assert replayed["sections_done"] == "12"
    assert replayed["tokens_written"] == f"{result.stats['tokens_written']:,}"
