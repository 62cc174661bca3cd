"""A real job against the simulator, watched in a real headless Chromium: a proxy in front of one simulated card
answers one section with hostile markup, which the page shows as text under its section's title while the
terminal progress reports the job. Needs chromium and playwright (see feed_browser.py)."""

from __future__ import annotations

import re
import time
from typing import Self

import aiohttp
import anyio
import orjson
import pytest
from feed_browser import ARTIFACTS, PAGE_TITLE, local_only, open_browser, wait_js
from feed_synth import HOSTILE

from orchestrator.views.feed import Feed

pytestmark = pytest.mark.anyio

# -- a real job against the simulator, watched in the browser ------------------------------------------------------


class HostileProxy:
    """A tiny OpenAI-compatible server in front of one simulated card: everything is passed through, except that
    the first section request (its prompt says "Write the section") is answered with hostile markup instead."""

    def __init__(self, upstream: str, text: str = HOSTILE):
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        self.text = text
        self.hijacked: str | None = None  # the section title whose answer was replaced
        self.url = ""

    async def __aenter__(self) -> Self:
        from aiohttp import web

        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc):
        await self._runner.cleanup()
        await self._session.close()

    async def _handle(self, request):
        from aiohttp import web

        body = await request.read()
        if request.method == "POST" and request.path.endswith("/chat/completions") and self.hijacked is None:
            req = orjson.loads(body)
            prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            m = re.search(r'Write the section "(.+?)"', prompt)
            if m and req.get("stream"):
                self.hijacked = m.group(1)
                return await self._hostile(request, req)
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body,
            headers={k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")},
        ) as up:
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def _hostile(self, request, req):
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        model = req.get("model", "sim")

        def chunk(delta, finish=None, usage=None):
            c = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if usage is None else []}
            if usage is not None:
                c["usage"] = usage
            return b"data: " + orjson.dumps(c) + b"\n\n"

        await resp.write(chunk({"role": "assistant", "content": ""}))
        for i in range(0, len(self.text), 8):
            await resp.write(chunk({"content": self.text[i: i + 8]}))
            await anyio.sleep(0.01)
        await resp.write(chunk({}, "stop"))
        if (req.get("stream_options") or {}).get("include_usage"):
            await resp.write(chunk({}, usage={"prompt_tokens": 30, "completion_tokens": 16, "total_tokens": 46}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def test_a_real_job_on_the_simulator_in_chromium(tmp_path):
    from io import StringIO

    from rich.console import Console

    from orchestrator import Settings, agenerate
    from orchestrator.sim.launch import SimFleet
    from orchestrator.views.progress import TerminalProgress

    ARTIFACTS.mkdir(exist_ok=True)
    log = StringIO()
    progress = TerminalProgress(Console(file=log, force_terminal=False, width=240), plain_interval=0.5)
    with SimFleet(cards=2, time_scale=1.5) as fleet:
        async with HostileProxy(fleet.urls[0]) as proxy, Feed(port=0, linger=0) as feed, open_browser() as b:
            page = b.page
            await page.goto(feed.url)
            await wait_js(page, "() => document.body.dataset.connected === 'yes'")
            mid: dict[str, object] = {}
            job_done = anyio.Event()

            async def watch_mid_run():
                # Both figures from one read of the page: it redraws several times a second, and each reader's
                # share is "–" whenever the servers report no stream running, so two reads could see two states.
                both = (
                    "() => { const r = document.getElementById('rate').textContent,"
                    " e = document.getElementById('per-reader').textContent;"
                    " return document.querySelectorAll('#feed .entry:not(.plan) h3').length >= 3"
                    " && /^[0-9,]+(\\.[0-9])?$/.test(r) && !/^0(\\.0)?$/.test(r) && /^[0-9.,]+$/.test(e)"
                    " ? [r, e] : null; }"
                )
                with anyio.fail_after(120):
                    while (shown := await page.evaluate(both)) is None:  # noqa: ASYNC110 - no event to await
                        await anyio.sleep(0.05)
                mid["finished_yet"] = job_done.is_set()
                mid["rate"], mid["per_reader"] = shown
                mid["titles"] = await page.locator("#feed .entry:not(.plan) h3").all_text_contents()
                await page.screenshot(path=str(ARTIFACTS / "feed-sim-midrun.png"))

            t0 = time.monotonic()
            with progress:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch_mid_run)
                    result = await agenerate(
                        "Write me a complete software engineering handbook",
                        backends=[proxy.url, fleet.urls[1]],
                        settings=Settings(parts=2, chapters=2, sections=4, words=120, max_tokens=200,
                                          formats=("md",), cap=8),
                        out=tmp_path / "out",
                        on_event=[feed, progress],
                        deltas=True,
                    )
                    job_done.set()
            job_s = time.monotonic() - t0

            assert result.complete and result.stats["sections"] == 16
            assert proxy.hijacked is not None
            assert mid["finished_yet"] is False, f"the job ({job_s:.1f} s) ended before the mid-run checks"
            assert float(str(mid["rate"]).replace(",", "")) > 0
            # each reader: the rate over the streams running, so never above the fleet's rate
            each = str(mid["per_reader"]).replace(",", "")
            assert re.fullmatch(r"[0-9.]+", each) and 0 < float(each) <= float(str(mid["rate"]).replace(",", ""))
            section_titles = {t for p in result.outline.parts for c in p.chapters for t in c.sections}
            assert set(mid["titles"]) <= section_titles  # type: ignore[arg-type]

            await wait_js(page, "() => document.body.dataset.finished === 'yes'")
            cell = page.locator('#stats tr[data-key="sections"] td').nth(1)
            assert await cell.text_content() == "16"
            tokens = page.locator('#stats tr[data-key="tokens_written"] td').nth(1)
            assert await tokens.text_content() == f"{result.stats['tokens_written']:,}"
            assert await page.text_content("#sections-done") == "16"
            # The hostile answer is on the page as text, under its section's title; nothing in it ran.
            hostile = page.locator("#feed .entry").filter(
                has=page.locator("h3", has_text=re.compile("^" + re.escape(proxy.hijacked) + "$"))
            )
            texts = await hostile.locator(".text").all_text_contents()
            assert HOSTILE in texts
            assert await page.locator("#feed img").count() == 0
            assert await page.title() == PAGE_TITLE
            await page.screenshot(path=str(ARTIFACTS / "feed-sim.png"))
            assert local_only(b.requests, feed) == []
            assert b.errors == []

    lines = log.getvalue().splitlines()
    assert any("sections 16/16 (100.0%)" in x for x in lines), log.getvalue()
    assert any(re.search(r"rate [0-9,]+ tok/s", x) for x in lines)
    assert lines[-1] == "job complete"
