"""The library's live page: a book list with progress, and the sections of the books in flight.

    async with LibraryFeed(state, port=0) as feed:
        print("library feed:", feed.url)
        await agenerate_library(..., on_event=state)

``/`` serves ``templates/library.html.j2`` (inline script and style, a per-response nonce in the CSP, as the book's
feed: ``views/feed.py``); ``/status`` is :meth:`LibraryState.snapshot` as JSON, which the page reads every second
(a library runs for hours: a poll a second is all it needs, and a stalled browser holds nothing of the run's). The
rate is the servers' counted rate (the library's sampler), never timed in the browser. Requests must name this
server in their Host header (DNS rebinding), as the book's feed requires.
"""

from __future__ import annotations

import secrets
from typing import Any, Self

import jinja2
import orjson
from aiohttp import hdrs, web

from ..core.errors import ConfigError
from ..core.resources import template_dirs
from .feed import _allowed_hosts
from .library_progress import LibraryState

__all__ = ["LibraryFeed"]


class LibraryFeed:
    """The library page's web server on ``host``:``port`` (0: a free one), reading ``state``."""

    def __init__(self, state: LibraryState, port: int = 0, host: str = "127.0.0.1", templates: str | None = None):
        self.state = state
        self.port = int(port)
        self.host = host
        self.templates = templates
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._hosts: frozenset[str] = frozenset()

    async def __aenter__(self) -> Self:
        env = jinja2.Environment(loader=jinja2.FileSystemLoader([str(d) for d in template_dirs(self.templates)]),
                                 autoescape=True, undefined=jinja2.StrictUndefined)
        self._template = env.get_template("library.html.j2")
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._page)
        app.router.add_get("/status", self._status)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as e:
            await self._runner.cleanup()
            raise ConfigError(f"cannot serve the library feed on {self.host}:{self.port}: {e.strerror or e}") \
                from None
        self.port = int(self._runner.addresses[0][1])
        self.url = f"http://{self.host}:{self.port}/"
        self._hosts = _allowed_hosts(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get(hdrs.HOST, "").strip().lower() not in self._hosts:
            return web.Response(status=403, text="forbidden: unexpected Host header\n")
        return await handler(request)

    async def _page(self, request: web.Request) -> web.Response:
        nonce = secrets.token_urlsafe(16)
        csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; connect-src 'self'; "
               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
        return web.Response(text=self._template.render(nonce=nonce), content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": csp, "Cache-Control": "no-store",
                                     "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    async def _status(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.state.snapshot()), content_type="application/json",
                            headers={"Cache-Control": "no-store"})
