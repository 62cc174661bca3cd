"""The live browser feed: one page on 127.0.0.1 that merges every stream into one scrolling feed.

    async with Feed(port=0, linger=None) as feed:
        print("live feed:", feed.url)
        result = await agenerate(..., on_event=feed, deltas=True)  # deltas: the text as it streams
        await feed.linger()                     # the page stays up: until Ctrl-C, close(), or `linger` seconds

``/`` serves ``templates/feed.html.j2`` (inline script and style, nothing from the network; a Content-Security-Policy
with a per-response nonce forbids anything else, inline event handlers included). ``/events`` is a Server-Sent
Events stream of JSON messages:

``{"snapshot": true, "status": {...}, "ops": [...], "history": [[t, rate], ...], "final": {...} | null}``
    first message of every connection (and reconnection): the header's state and the most recent sections.
``{"status": {...} | absent, "ops": [...], "final": {...} | absent}``
    what changed since the last message. ``status`` is ``JobState.snapshot()``; its rate is the servers'
    (``MetricsSample.rate_tok_s``), never timed here; its ``forecast`` is ``Eta.to_json()`` (``orchestrator.eta``)
    when the job made a forecast, else null (and the page shows nothing about one). An op is one node's news, coalesced:
    ``{"p": path, "k": kind, "h": title, "a": attempt, "r": reset?, "x": text, "s": "done"|"retry"|"failed",
    "e": error, "g": gap?}`` (``g``: text of this node was dropped for this client, see below).

DNS rebinding: a page on another site can point its own host name at 127.0.0.1 and then read this server as if
same-origin. Every request must therefore name this server in its Host header (127.0.0.1, localhost or [::1],
with this port or none); any other Host gets 403.

Back-pressure: the event callback never awaits and never blocks; each browser's pending news is coalesced and
capped at ``client_bytes`` (``orchestrator.feedstate``), so a stalled browser never slows the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import threading
from typing import Any, Self

import anyio
import jinja2
import orjson
from aiohttp import hdrs, web

from ..core.errors import ConfigError
from ..core.events import Event
from ..core.resources import template_dirs
from .feedstate import ClientQueue, FeedState
from .jobstate import JobState

__all__ = ["Feed"]


class Feed:
    """The live feed's web server and event consumer (see the module doc).

    ``port`` 0 picks a free port; ``linger`` is how long :meth:`linger` keeps the page up after the job (None:
    until Ctrl-C or :meth:`close`); ``templates`` overrides the folder holding ``feed.html.j2``.
    Must be entered inside an asyncio event loop (aiohttp); events must be delivered from that loop or, from
    another thread, are handed over to it. Pass ``deltas=True`` to the job as well: without
    :class:`~orchestrator.events.Delta` events the page shows each section's progress but not its text.
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        linger: float | None = None,
        templates: str | None = None,
        *,
        client_bytes: int = 1 << 20,
        flush_interval: float = 0.1,
        recent: int = 60,
        heartbeat: float = 15.0,
    ) -> None:
        self.host = host
        self.port = int(port)
        self.linger_s = linger
        self.templates = templates
        self.client_bytes = int(client_bytes)
        self.flush_interval = float(flush_interval)
        self.heartbeat = float(heartbeat)
        self.url = ""
        self._news = FeedState(recent)
        self._handlers: set[asyncio.Task[Any]] = set()
        self._no_handlers: asyncio.Event | None = None  # set while no /events handler runs
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._closed: asyncio.Event | None = None
        self._template: jinja2.Template | None = None
        self._hosts: frozenset[str] = frozenset()

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> Feed:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader([str(d) for d in template_dirs(self.templates)]),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self._template = env.get_template("feed.html.j2")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._closed = asyncio.Event()
        self._no_handlers = asyncio.Event()
        self._no_handlers.set()
        app = web.Application(middlewares=[self._host_guard()])
        app.router.add_get("/", self._page)
        app.router.add_get("/events", self._events)
        app.router.add_get("/status", self._status)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(f"cannot serve the live feed on {self.host}:{self.port}: {e.strerror or e}") from None
        addr = self._runner.addresses[0]
        self.port = int(addr[1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}/"
        self._hosts = _allowed_hosts(host, self.port)
        return self

    def close(self) -> None:
        """End :meth:`linger` and :meth:`wait_closed` now (the server itself stops when the context exits)."""
        if self._closed is not None:
            self._closed.set()

    async def wait_closed(self) -> None:
        """Wait until :meth:`close` is called or the feed is shut down."""
        assert self._closed is not None, "the feed is not started"
        await self._closed.wait()

    async def linger(self, seconds: float | Any | None = ...) -> None:
        """Keep the page up after the job: until :meth:`close`, Ctrl-C (cancellation), or ``seconds`` pass
        (default: the ``linger`` given to the constructor; None waits for ever)."""
        s = self.linger_s if seconds is ... else seconds
        if s is not None and (s <= 0 or math.isnan(s)):
            return
        with anyio.move_on_after(s if s is not None else math.inf):
            await self.wait_closed()

    async def aclose(self) -> None:
        if self._runner is None:
            return
        self.close()
        for client in list(self._news.clients):
            client.close()
        with anyio.CancelScope(shield=True), anyio.move_on_after(3):
            # Give handlers a moment to end by themselves; cancel the ones stuck writing to a stalled browser.
            with anyio.move_on_after(0.5):
                assert self._no_handlers is not None
                await self._no_handlers.wait()
            for task in list(self._handlers):
                task.cancel()
            await self._runner.cleanup()
        self._runner = None

    @property
    def clients(self) -> int:
        """Browsers connected to /events now."""
        return len(self._news.clients)

    @property
    def state(self) -> JobState:
        """The job as the feed has been told it so far."""
        return self._news.job

    # -- the consumer ---------------------------------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        if self._loop is not None and threading.get_ident() != self._thread:
            with contextlib.suppress(RuntimeError):  # loop closed: the feed is gone
                self._loop.call_soon_threadsafe(self._news.deliver, event)
            return
        self._news.deliver(event)

    # -- HTTP -----------------------------------------------------------------------------------------------------

    def _host_guard(self) -> Any:
        """Middleware: 403 for a request whose Host header does not name this server (see the module doc)."""

        @web.middleware
        async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.headers.get(hdrs.HOST, "").strip().lower() not in self._hosts:
                return web.Response(status=403, text="forbidden: unexpected Host header\n")
            return await handler(request)

        return guard

    async def _page(self, request: web.Request) -> web.Response:
        assert self._template is not None
        nonce = secrets.token_urlsafe(16)
        html = self._template.render(nonce=nonce)
        csp = (
            "default-src 'none'; "
            f"script-src 'nonce-{nonce}'; "
            "style-src 'unsafe-inline'; "
            "connect-src 'self'; "
            "img-src data:; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        )
        return web.Response(
            text=html,
            content_type="text/html",
            charset="utf-8",
            headers={
                "Content-Security-Policy": csp,
                "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
            },
        )

    async def _status(self, request: web.Request) -> web.Response:
        body = {"status": self._news.status(), "final": self._news.final(), "clients": self.clients}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            assert self._no_handlers is not None
            self._no_handlers.clear()
        client = ClientQueue(self.client_bytes)
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await resp.prepare(request)
            first = self._news.snapshot()
            client.status_dirty = False
            self._news.clients.add(client)  # from here on, events reach this client's pending ops
            await resp.write(_sse(first))
            while not client.closed and request.transport is not None and not request.transport.is_closing():
                try:
                    await asyncio.wait_for(client.wake.wait(), self.heartbeat)
                except TimeoutError:
                    await resp.write(b": ping\n\n")
                    continue
                client.wake.clear()
                if client.closed:
                    break
                msg: dict[str, Any] = {}
                ops = client.take()
                if ops:
                    msg["ops"] = ops
                if client.status_dirty:
                    client.status_dirty = False
                    msg["status"] = self._news.status()
                if client.final_pending:
                    client.final_pending = False
                    msg["final"] = self._news.final()
                if msg:
                    await resp.write(_sse(msg))
                    client.sent_messages += 1
                # Let news pile up (and coalesce) for a moment: fewer, larger messages for every browser.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.flush_interval):
                        await client.gone.wait()
        except ConnectionError:
            pass  # the browser went away
        finally:
            self._news.clients.discard(client)
            client.close()
            if task is not None:
                self._handlers.discard(task)
                if not self._handlers and self._no_handlers is not None:
                    self._no_handlers.set()
        return resp


def _allowed_hosts(host: str, port: int) -> frozenset[str]:
    """The Host values that name a feed served on ``host``:``port`` (lower case; with this port, or none)."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if host not in ("0.0.0.0", "[::]", ""):
        names.add(host.lower())  # a feed bound elsewhere on purpose answers to that address too
    return frozenset(names | {f"{n}:{port}" for n in names})


def _sse(msg: dict[str, Any]) -> bytes:
    # orjson never emits raw newlines, so one data: line carries the whole message.
    return b"data: " + orjson.dumps(msg) + b"\n\n"
