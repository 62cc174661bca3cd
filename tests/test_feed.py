"""The live feed: SSE protocol and back-pressure over real sockets, and the page in a real headless Chromium.

The browser tests need Debian's chromium and the playwright package; they fail (never skip) without them:
    apt-get update && apt-get install -y chromium        # as root
    .venv/bin/pip install playwright                     # never `playwright install`: it downloads a browser
``HANDBOOK_CHROMIUM`` names another chromium executable. Screenshots go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Self

import aiohttp
import anyio
import anyio.lowlevel
import orjson
import pytest
from feed_synth import HOSTILE, synthetic_forecast, synthetic_job

from orchestrator.core.events import Delta, JobFinished, JobStarted, MetricsSample, NodeFinished, NodeStarted
from orchestrator.core.reply import Reply
from orchestrator.core.resources import bundled_templates
from orchestrator.views.feed import Feed
from orchestrator.views.feedstate import FeedState

pytestmark = pytest.mark.anyio

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
                " && /^[0-9,]+$/.test(document.getElementById('rate').textContent)"
                " && document.getElementById('rate').textContent !== '0'",
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
                hostile_path="1.1.2", retry_path="2.1.1", forecast_s=60.0, pdf_pages=9,
            )
            job_done.set()

        assert mid["finished_yet"] is False, "the mid-run checks must happen while the job runs"
        assert mid["phase"] == "writing"
        assert mid["fleet"] == 2
        assert int(str(mid["rate"]).replace(",", "")) > 0
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


# -- protocol and back-pressure, no browser -----------------------------------------------------------------------


async def read_messages(resp: aiohttp.ClientResponse):
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n\n" in buf:
            frame, buf = buf.split(b"\n\n", 1)
            for line in frame.split(b"\n"):
                if line.startswith(b"data: "):
                    yield orjson.loads(line[6:])


def reply(text: str) -> Reply:
    return Reply(text, "stop", 1, len(text), "http://a:1/v1", 0.0, 0.0, 0.0)


async def test_deltas_are_coalesced_per_section():
    async with (
        Feed(port=0, flush_interval=0.05) as feed,
        aiohttp.ClientSession() as http,
        http.get(feed.url + "events") as resp,
    ):
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        messages = read_messages(resp)
        first = await anext(messages)
        assert first["snapshot"] is True and first["ops"] == [] and first["final"] is None
        feed(NodeStarted("1.1.1", "section", "One", "http://a:1/v1", 1, 1.0))
        feed(NodeStarted("1.1.2", "section", "Two", "http://a:1/v1", 1, 1.0))
        for i in range(1000):  # no await in between: all of it must arrive as one op per section
            feed(Delta("1.1.1", f"{i} ", 1.0))
            feed(Delta("1.1.2", "x", 1.0))
        feed(NodeFinished("1.1.1", "section", "One", reply("..."), 2.0))
        feed(MetricsSample(2.0, 500.0, 1234.0, {}))
        msg = await anext(messages)
        ops = {op["p"]: op for op in msg["ops"]}
        assert set(ops) == {"1.1.1", "1.1.2"}
        assert ops["1.1.1"]["x"] == "".join(f"{i} " for i in range(1000))
        assert ops["1.1.1"]["h"] == "One" and ops["1.1.1"]["s"] == "done"
        assert ops["1.1.2"]["x"] == "x" * 1000 and "s" not in ops["1.1.2"]
        assert msg["status"]["rate"] == 1234.0
        feed(JobFinished({"sections": 2}, True, 3.0))
        while "final" not in (msg := await anext(messages)):
            pass
        assert msg["final"] == {"complete": True, "stats": {"sections": 2}, "pdf": None}


async def test_a_stalled_browser_neither_slows_the_job_nor_grows_memory():
    limit = 256 * 1024
    async with Feed(port=0, client_bytes=limit, flush_interval=0.01) as feed:
        # A "browser" that asks for the stream and never reads a byte of it.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", feed.port))
        sock.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{feed.port}\r\n\r\n".encode())
        with anyio.fail_after(5):
            while feed.clients < 1:  # noqa: ASYNC110 - the connection is a raw socket: only the count tells
                await anyio.sleep(0.01)
        stalled = next(iter(feed._news.clients))
        piece = "lorem ipsum dolor sit amet " * 4  # 108 bytes, a typical chunk
        sent = 0
        worst = 0.0
        for n in range(1500):
            path = f"{n // 96 + 1}.{n // 16 % 6 + 1}.{n % 16 + 1}"
            feed(NodeStarted(path, "section", f"Section {n}", "http://a:1/v1", 1, 0.0))
            t = time.perf_counter()
            for _ in range(200):
                feed(Delta(path, piece, 0.0))
            worst = max(worst, time.perf_counter() - t)
            sent += 200 * len(piece)
            feed(NodeFinished(path, "section", f"Section {n}", reply(""), 0.0))
            if n % 20 == 0:
                await anyio.lowlevel.checkpoint()  # let the handler write what it can (and get stuck)
        assert sent > 30_000_000
        # The stalled client's backlog stays under its cap; the rest was dropped, not queued.
        assert stalled.peak_bytes <= limit + len(piece)
        assert stalled.nbytes <= limit
        assert stalled.dropped_bytes > sent // 2
        # 200 deltas never took long, whatever the browser did (generous bound: a shared, noisy machine).
        assert worst < 0.5
        # A healthy browser still gets the end of the job promptly.
        async with aiohttp.ClientSession() as http, http.get(feed.url + "events") as resp:
            messages = read_messages(resp)
            await anext(messages)
            feed(JobFinished({"sections": 1500}, True, 1.0))
            with anyio.fail_after(5):
                while "final" not in (msg := await anext(messages)):
                    pass
            assert msg["final"]["stats"] == {"sections": 1500}
        t = time.monotonic()
    # Leaving the context shuts the server down even with the stalled connection still open.
    assert time.monotonic() - t < 5
    sock.close()


async def test_the_status_carries_the_forecast_once_one_came():
    async with (
        Feed(port=0, flush_interval=0.01) as feed,
        aiohttp.ClientSession() as http,
        http.get(feed.url + "events") as resp,
    ):
        messages = read_messages(resp)
        assert (await anext(messages))["status"]["forecast"] is None
        backends = ("http://a:1/v1",)
        feed(JobStarted("p", backends, {}, time.monotonic()))
        feed(synthetic_forecast(90.0, 16, 200, backends))
        while (msg := await anext(messages)).get("status", {}).get("forecast") is None:
            pass
        f = msg["status"]["forecast"]
        assert (f["forecast_s"], f["pages"], f["sections"], f["tokens"]) == (90.0, 12, 16, 4160)
        assert f["basis"] == "forecast" and f["basis_text"] == "by the forecast" and 89 < f["left_s"] <= 90
        assert f["took_s"] is None and f["over_s"] == 0


def test_the_final_state_says_when_the_pdf_was_ready():
    news = FeedState(recent=4)
    assert news.final() is None
    news.deliver(JobFinished({"sections": 16, "pdf_pages": 9, **PDF}, True, 3.0))
    final = news.final()
    assert final is not None and final["stats"]["pdf_ready_s"] == 12.34
    assert final["pdf"] == {"ready_s": 12.34, "after_write_s": 0.4, "pages": 9}
    # No PDF (not asked for, or typesetting failed): the final state says so, and the page shows nothing of one.
    for stats in ({"sections": 16, "pdf_ready_s": None, "typeset_after_write_s": None, "pdf_pages": None}, {}):
        news = FeedState(recent=4)
        news.deliver(JobFinished(stats, False, 3.0))
        assert news.final() == {"complete": False, "stats": stats, "pdf": None}


async def test_linger_times_out_and_close_ends_it():
    async with Feed(port=0, linger=0.2) as feed:
        t = time.monotonic()
        with anyio.fail_after(5):
            await feed.linger()
        assert 0.15 < time.monotonic() - t < 3
        with anyio.fail_after(5):
            await feed.linger(0)  # no lingering at all
    async with Feed(port=0) as feed:
        with anyio.move_on_after(0.2) as scope:  # linger=None waits until cancelled (Ctrl-C)...
            await feed.linger()
        assert scope.cancelled_caught
        threading.Timer(0.1, lambda: feed._loop.call_soon_threadsafe(feed.close)).start()
        with anyio.fail_after(5):
            await feed.wait_closed()  # ...or until close()


async def test_events_are_delivered_on_the_loop_thread_and_from_another_thread_handed_to_it():
    # Feed's contract: the feed's state is only ever touched on the event loop it was started on. An event sent
    # there is folded in at once; one sent from another thread is handed over to the loop and folded in there.
    # Recorded where FeedState.deliver runs, not just what the final state is.
    async with Feed(port=0) as feed:
        loop_thread = (threading.get_ident(), threading.current_thread().name)
        delivered: list[tuple[tuple[int, str], object]] = []
        deliver = feed._news.deliver

        def recording(e):
            delivered.append(((threading.get_ident(), threading.current_thread().name), e))
            deliver(e)

        feed._news.deliver = recording  # the instance attribute shadows the method; Feed looks it up per event

        on_loop = MetricsSample(1.0, 10.0, 7.0, {})
        feed(on_loop)
        assert delivered == [(loop_thread, on_loop)], "an event sent on the loop is delivered at once, there"
        assert feed.state.rate == 7.0

        sent = [MetricsSample(2.0 + k, 10.0, 40.0 + k, {}) for k in range(5)]
        senders: list[tuple[int, str]] = []

        def send():
            senders.append((threading.get_ident(), threading.current_thread().name))
            for e in sent:
                feed(e)

        th = threading.Thread(target=send, name="handbook-test-sender")
        th.start()
        th.join()  # the loop is blocked here: a hand-over cannot have run yet, a delivery on the sender can
        assert senders and senders[0] != loop_thread
        assert delivered == [(loop_thread, on_loop)], "an event from another thread was delivered on that thread"
        with anyio.fail_after(5):
            while len(delivered) < 1 + len(sent):  # noqa: ASYNC110 - the hand-over to the loop is what is tested
                await anyio.sleep(0.01)
        assert delivered[1:] == [(loop_thread, e) for e in sent], "delivered on the loop, in the order sent"
        assert feed.state.rate == 44.0


async def test_page_loads_nothing_from_the_network_and_forbids_inline_handlers(tmp_path):
    template = (bundled_templates() / "feed.html.j2").read_text()
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", template)
    assert "@import" not in template and "url(" not in template
    async with Feed(port=0) as feed, aiohttp.ClientSession() as http:
        async with http.get(feed.url) as resp:
            html = await resp.text()
            csp = resp.headers["Content-Security-Policy"]
        nonce = re.search(r'<script nonce="([^"]+)"', html).group(1)
        assert f"script-src 'nonce-{nonce}'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        async with http.get(feed.url + "status") as resp:
            body = await resp.json()
            assert body["final"] is None and body["status"]["sections_done"] == 0
            assert body["status"]["forecast"] is None
    # --templates DIR overrides the page.
    (tmp_path / "feed.html.j2").write_text(template.replace("<body", "<!-- custom marker --><body"))
    async with (
        Feed(port=0, templates=str(tmp_path)) as feed,
        aiohttp.ClientSession() as http,
        http.get(feed.url) as resp,
    ):
        assert "custom marker" in await resp.text()


async def test_a_foreign_host_header_is_refused():
    # DNS rebinding: evil.example resolves to 127.0.0.1, so its page would reach the feed with its own Host.
    async with Feed(port=0) as feed, aiohttp.ClientSession() as http:
        port = feed.port
        for path in ("", "events", "status"):
            for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", ""):
                async with http.get(feed.url + path, headers={"Host": host}) as resp:
                    assert resp.status == 403, (path, host)
                    body = await resp.read()
                    assert len(body) < 100 and b"<script" not in body
                    assert not resp.headers.get("Content-Type", "").startswith("text/event-stream")
        assert feed.clients == 0  # the refused stream never became a client
        # the names of this machine's loopback, with this port or none, are served
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}", "127.0.0.1"):
            async with http.get(feed.url, headers={"Host": host}) as resp:
                assert resp.status == 200, host
                assert "<script nonce=" in await resp.text()
        async with http.get(feed.url + "events", headers={"Host": f"localhost:{port}"}) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            assert (await anext(read_messages(resp)))["snapshot"] is True
        async with http.get(feed.url + "status") as resp:  # what a client sends by itself
            assert resp.status == 200


async def test_a_busy_port_is_a_configuration_error():
    from orchestrator.core.errors import ConfigError

    async with Feed(port=0) as first:
        with pytest.raises(ConfigError, match=f"cannot serve the live feed on 127.0.0.1:{first.port}"):
            async with Feed(port=first.port):
                pass


async def test_a_reconnecting_browser_gets_a_fresh_snapshot():
    async with Feed(port=0) as feed, aiohttp.ClientSession() as http:
        feed(NodeStarted("1.1.1", "section", "One", "http://a:1/v1", 1, 1.0))
        feed(Delta("1.1.1", "hello ", 1.1))
        feed(Delta("1.1.1", "world", 1.2))
        feed(NodeStarted("2", "part", "Part two", "http://a:1/v1", 1, 1.0))
        feed(Delta("2", '{"titles": [', 1.1))  # planning JSON is not shown as text
        for _ in range(2):
            async with http.get(feed.url + "events") as resp:
                first = await anext(read_messages(resp))
                assert first["snapshot"] is True
                ops = {op["p"]: op for op in first["ops"]}
                assert ops["1.1.1"]["x"] == "hello world" and ops["1.1.1"]["h"] == "One"
                assert ops["2"]["x"] == "" and ops["2"]["k"] == "part"
        await asyncio.sleep(0)


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
                await wait_js(
                    page,
                    "() => document.querySelectorAll('#feed .entry:not(.plan) h3').length >= 3"
                    " && /^[0-9,]+$/.test(document.getElementById('rate').textContent)"
                    " && document.getElementById('rate').textContent !== '0'",
                    within=120,
                )
                mid["finished_yet"] = job_done.is_set()
                mid["rate"] = await page.text_content("#rate")
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
            assert int(str(mid["rate"]).replace(",", "")) > 0
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
