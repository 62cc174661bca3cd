"""The live feed without a browser, over real sockets: the SSE protocol (deltas coalesced per section, snapshots
for a reconnecting client, the forecast and the PDF in the status), back-pressure from a stalled client, lingering
and closing, delivery on the loop thread, and the page's safety (CSP, no network, loopback Host names only)."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time

import aiohttp
import anyio
import anyio.lowlevel
import orjson
import pytest
from feed_browser import PDF
from feed_synth import synthetic_forecast

from orchestrator.core.events import Delta, JobFinished, JobStarted, MetricsSample, NodeFinished, NodeStarted
from orchestrator.core.reply import Reply
from orchestrator.core.resources import bundled_templates
from orchestrator.views.feed import Feed
from orchestrator.views.feedstate import FeedState

pytestmark = pytest.mark.anyio

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
