"""The live browser feed: one page on 127.0.0.1 that merges every stream into one scrolling feed.

    async with Feed(port=0, linger=None) as feed:
        print("live feed:", feed.url)
        result = await agenerate(..., on_event=feed)     # feed.wants_deltas is True
        await feed.linger()                              # page stays up: Ctrl-C, close(), or `linger` seconds

``/`` serves ``templates/feed.html.j2`` (inline script and style, nothing from the network; a Content-Security-Policy
with a per-response nonce forbids anything else, inline event handlers included). ``/events`` is a Server-Sent
Events stream of JSON messages:

``{"snapshot": true, "status": {...}, "ops": [...], "history": [[t, rate], ...], "final": {...} | null}``
    first message of every connection (and reconnection): the header's state and the most recent sections.
``{"status": {...} | absent, "ops": [...], "final": {...} | absent}``
    what changed since the last message. ``status`` is :meth:`JobState.snapshot`; its rate is the servers'
    (``MetricsSample.rate_tok_s``), never timed here. An op is one node's news, coalesced:
    ``{"p": path, "k": kind, "h": title, "a": attempt, "r": reset?, "x": text, "s": "done"|"retry"|"failed",
    "e": error, "g": gap?}`` (``g``: text of this node was dropped for this client, see below).

DNS rebinding: a page on another site can point its own host name at 127.0.0.1 and then read this server as if
same-origin. Every request must therefore name this server in its Host header (127.0.0.1, localhost or [::1],
with this port or none); any other Host gets 403.

Back-pressure: the event callback never awaits and never blocks. Each client owns a small dict of pending ops keyed
by node path; a Delta appends to its node's op, so a slow browser gets fewer, larger messages. A client's pending
bytes are capped (``client_bytes``): past the cap the oldest pending ops are dropped (and marked as gaps), so a
stalled browser costs at most the cap plus the socket's write buffer, and the job never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import threading
from collections import OrderedDict
from typing import Any, Self

import anyio
import jinja2
import orjson
from aiohttp import hdrs, web

from .errors import ConfigError
from .events import Delta, JobFinished, NodeFailed, NodeFinished, NodeStarted
from .progress import JobState
from .resources import template_dirs

__all__ = ["Feed"]

OP_OVERHEAD = 160  # bytes charged per pending op, so that many tiny ops also count against the cap
ERROR_CHARS = 300


class _Op:
    __slots__ = ("attempt", "chunks", "error", "gap", "kind", "nbytes", "path", "reset", "status", "title")

    def __init__(self, path: str) -> None:
        self.path = path
        self.kind: str | None = None
        self.title: str | None = None
        self.attempt: int | None = None
        self.reset = False
        self.chunks: list[str] = []
        self.nbytes = 0
        self.status: str | None = None
        self.error: str | None = None
        self.gap = False

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"p": self.path}
        if self.kind is not None:
            d["k"] = self.kind
        if self.title is not None:
            d["h"] = self.title
        if self.attempt is not None:
            d["a"] = self.attempt
        if self.reset:
            d["r"] = True
        if self.chunks:
            d["x"] = "".join(self.chunks)
        if self.status is not None:
            d["s"] = self.status
        if self.error is not None:
            d["e"] = self.error
        if self.gap:
            d["g"] = True
        return d


class _Client:
    """One browser connection: its pending ops (coalesced, bounded) and a wake-up signal."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending: dict[str, _Op] = {}
        self.nbytes = 0
        self.gaps: set[str] = set()  # paths whose pending text was dropped; the next op for them says so
        self.dropped_ops = 0
        self.dropped_bytes = 0
        self.status_dirty = True
        self.final_pending = False
        self.wake = asyncio.Event()
        self.closed = False
        self.sent_messages = 0
        self.peak_bytes = 0

    def op(self, path: str) -> _Op:
        op = self.pending.get(path)
        if op is None:
            op = self.pending[path] = _Op(path)
            self.nbytes += OP_OVERHEAD
            if path in self.gaps:
                op.gap = True
                self.gaps.discard(path)
            if self.nbytes > self.limit:
                self._shed()
        return op

    def add_text(self, path: str, text: str) -> None:
        op = self.op(path)
        op.chunks.append(text)
        n = len(text)
        op.nbytes += n
        self.nbytes += n
        self.peak_bytes = max(self.peak_bytes, self.nbytes)  # before shedding: at most the cap plus one delta
        if self.nbytes > self.limit:
            self._shed()

    def _shed(self) -> None:
        """Drop the oldest pending ops until half the cap is free; the newest op keeps its tail at least."""
        target = self.limit // 2
        while self.nbytes > target and len(self.pending) > 1:
            path, op = next(iter(self.pending.items()))
            del self.pending[path]
            self.nbytes -= op.nbytes + OP_OVERHEAD
            self.dropped_ops += 1
            self.dropped_bytes += op.nbytes
            if op.status is None and len(self.gaps) < 8192:
                self.gaps.add(path)  # its text is incomplete on the page: mark the gap when more comes
        if self.nbytes > self.limit and self.pending:
            # One huge op alone: keep its tail.
            op = next(iter(self.pending.values()))
            text = "".join(op.chunks)
            keep = text[-target:]
            self.dropped_bytes += len(text) - len(keep)
            self.nbytes -= op.nbytes - len(keep)
            op.chunks = [keep]
            op.nbytes = len(keep)
            op.gap = True

    def take(self) -> list[dict[str, Any]]:
        ops = [op.to_json() for op in self.pending.values()]
        self.pending = {}
        self.nbytes = 0
        return ops


class _Recent:
    """The last few nodes with their text, for a browser that connects (or reconnects) mid-run."""

    def __init__(self, size: int, text_limit: int) -> None:
        self.size = size
        self.text_limit = text_limit
        self.items: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def start(self, e: NodeStarted) -> None:
        self.items[e.path] = {"p": e.path, "k": e.kind, "h": e.title, "a": e.attempt, "x": [], "n": 0}
        self.items.move_to_end(e.path)
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def text(self, path: str, text: str) -> None:
        item = self.items.get(path)
        if item is not None and item["n"] < self.text_limit:
            item["x"].append(text)
            item["n"] += len(text)

    def status(self, path: str, status: str, error: str | None = None) -> None:
        item = self.items.get(path)
        if item is not None:
            item["s"] = status
            if error:
                item["e"] = error

    def ops(self) -> list[dict[str, Any]]:
        out = []
        for item in self.items.values():
            op = {k: v for k, v in item.items() if k not in ("x", "n")}
            op["x"] = "".join(item["x"])
            op["r"] = True
            out.append(op)
        return out


class Feed:
    """The live feed's web server and event consumer (see the module doc).

    ``port`` 0 picks a free port; ``linger`` is how long :meth:`linger` keeps the page up after the job (None:
    until Ctrl-C or :meth:`close`); ``templates`` overrides the folder holding ``feed.html.j2``.
    Must be entered inside an asyncio event loop (aiohttp); events must be delivered from that loop or, from
    another thread, are handed over to it.
    """

    wants_deltas = True

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
        self.state = JobState()
        self.url = ""
        self._recent = _Recent(recent, text_limit=16_384)
        self._clients: set[_Client] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._closed: asyncio.Event | None = None
        self._finished: asyncio.Event | None = None
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
        self._finished = asyncio.Event()
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
        for client in list(self._clients):
            client.closed = True
            client.wake.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(3):
            # Give handlers a moment to end by themselves; cancel the ones stuck writing to a stalled browser.
            with anyio.move_on_after(0.5):
                while self._handlers:
                    await asyncio.sleep(0.02)
            for task in list(self._handlers):
                task.cancel()
            await self._runner.cleanup()
        self._runner = None

    @property
    def clients(self) -> int:
        """Browsers connected to /events now."""
        return len(self._clients)

    # -- the consumer ---------------------------------------------------------------------------------------------

    def __call__(self, event: Any) -> None:
        if self._loop is not None and threading.get_ident() != self._thread:
            with contextlib.suppress(RuntimeError):  # loop closed: the feed is gone
                self._loop.call_soon_threadsafe(self._deliver, event)
            return
        self._deliver(event)

    def _deliver(self, e: Any) -> None:
        if isinstance(e, Delta):
            recent = self._recent.items.get(e.path)
            kind = recent["k"] if recent is not None else ("section" if e.path.count(".") == 2 else "plan")
            if kind != "section":
                return  # planning nodes stream JSON title lists: their heading is shown, not their raw text
            self._recent.text(e.path, e.text)
            for client in self._clients:
                client.add_text(e.path, e.text)
                client.wake.set()
            return
        for path in self.state.update(e):  # planning nodes that this event showed to be done
            self._recent.status(path, "done")
            for client in self._clients:
                client.op(path).status = "done"
        if isinstance(e, NodeStarted):
            self._recent.start(e)
            for client in self._clients:
                op = client.op(e.path)
                if op.attempt is not None and op.attempt != e.attempt:
                    client.nbytes -= op.nbytes
                    op.chunks, op.nbytes = [], 0
                op.kind, op.title, op.attempt, op.reset = e.kind, e.title, e.attempt, True
                op.status = op.error = None
        elif isinstance(e, NodeFinished):
            self._recent.status(e.path, "done")
            for client in self._clients:
                op = client.op(e.path)
                op.status, op.error = "done", None
        elif isinstance(e, NodeFailed):
            status = "failed" if e.final else "retry"
            error = e.error[:ERROR_CHARS]
            self._recent.status(e.path, status, error)
            for client in self._clients:
                op = client.op(e.path)
                op.status, op.error = status, error
        elif isinstance(e, JobFinished):
            for client in self._clients:
                client.final_pending = True
            assert self._finished is not None
            self._finished.set()
        for client in self._clients:
            client.status_dirty = True
            client.wake.set()

    # -- HTTP -----------------------------------------------------------------------------------------------------

    def _host_guard(self) -> Any:
        """Middleware: 403 for a request whose Host header does not name this server (see the module doc)."""

        @web.middleware
        async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.headers.get(hdrs.HOST, "").strip().lower() not in self._hosts:
                return web.Response(status=403, text="forbidden: unexpected Host header\n")
            return await handler(request)

        return guard

    def _status_payload(self) -> dict[str, Any]:
        with self.state.lock:
            return self.state.snapshot()

    def _final_payload(self) -> dict[str, Any] | None:
        with self.state.lock:
            if not self.state.finished:
                return None
            return {"complete": self.state.complete, "stats": self.state.stats or {}}

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
        body = {"status": self._status_payload(), "final": self._final_payload(), "clients": self.clients}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        client = _Client(self.client_bytes)
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await resp.prepare(request)
            first = {
                "snapshot": True,
                "status": self._status_payload(),
                "ops": self._recent.ops(),
                "history": list(self.state.rate_history),
                "final": self._final_payload(),
            }
            client.status_dirty = False
            self._clients.add(client)  # from here on, events reach this client's pending ops
            await resp.write(_sse(first))
            loop = asyncio.get_running_loop()
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
                    msg["status"] = self._status_payload()
                if client.final_pending:
                    client.final_pending = False
                    msg["final"] = self._final_payload()
                if msg:
                    await resp.write(_sse(msg))
                    client.sent_messages += 1
                # Let news pile up (and coalesce) for a moment: fewer, larger messages for every browser.
                t_next = loop.time() + self.flush_interval
                while not client.closed and loop.time() < t_next:
                    await asyncio.sleep(min(0.05, max(0.0, t_next - loop.time())))
        except ConnectionError:
            pass  # the browser went away
        finally:
            self._clients.discard(client)
            client.closed = True
            if task is not None:
                self._handlers.discard(task)
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
