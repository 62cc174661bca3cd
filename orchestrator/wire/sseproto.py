"""The hot path's own HTTP/1.1 client: one streamed POST per request, its response parsed in the event loop's read
callback (``asyncio.Protocol.data_received``), its events fed to ``SseParser`` there.

Why not aiohttp for this: aiohttp wakes the awaiting coroutine for every chunk the socket delivers (a task step,
a future, the StreamReader's buffer), which is most of the CPU a chunk costs at 1,536 streams. Here a chunk costs
the loop's read callback, httptools' C parser (chunked transfer encoding, Content-Length, keep-alive: llhttp, the
parser Node.js and uvicorn use, so nothing of HTTP is parsed by hand) and the SSE parse; the coroutine wakes once,
at ``[DONE]``, at the end of the body, or on an error. Connections are kept alive and reused per backend.

It serves only plain ``http://`` URLs without a query, on asyncio, with httptools installed (``usable``). A response
whose head cannot be parsed (a 101 Switching Protocols too) fails its request as aiohttp fails it
(ClientResponseError: the request was sent, so it is never sent again) and retires the pool: the client sends later
requests through aiohttp. Errors are raised as aiohttp's own (ServerDisconnectedError, ClientPayloadError,
ClientResponseError) or ``ConnectError`` (hotpath.py, with ``Response``), so the client words them as it does for
aiohttp; what the SSE parser raises (``MalformedStream`` for the server's data, anything else for ours) reaches the
request as it was raised.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anyio
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .hotpath import ConnectError, Response
from .hotpath import event_loop_options as event_loop_options
from .sse import SseParser, StreamState, Watch
from .whole import WholeParser

try:
    import httptools
except ImportError:  # pragma: no cover - a dependency; without it requests go through aiohttp
    httptools = None  # type: ignore[assignment]

STALE_WINDOW_S = 1.0  # a kept-alive connection closed this soon after the write, with no answer: sent again once
KEEPALIVE_S = 4.0  # an idle connection older than this is not reused: uvicorn (vLLM) closes them after 5 s


def usable(url: str) -> bool:
    u = urlsplit(url)
    return httptools is not None and u.scheme == "http" and not u.query and not u.fragment and bool(u.hostname)


class _Conn(asyncio.BufferedProtocol):
    """One keep-alive connection; between requests it waits in its pool.

    A BufferedProtocol: asyncio's plain Protocol reads each chunk into a fresh 256 KiB bytes object, which glibc
    maps and unmaps for every read (most of the system time a chunk costs there); the socket is read into the
    pool's one buffer instead (the transport hands the bytes over at once, so the connections can share it)."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        assert httptools is not None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.busy = False
        self.idle_since = 0.0
        self.sent_at = 0.0  # when the last request was written
        self._start(None, None, None)

    def _start(self, st: StreamState | None, watch: Watch | None, on_delta: Callable[[str], str | None] | None) -> None:
        self.st, self.watch, self.on_delta = st, watch, on_delta
        self.waiter: asyncio.Future[Any] | None = None
        self.sse: SseParser | WholeParser | None = None
        self.status = 0
        self.head_done = False
        self.complete = False
        self.received = False
        self.framed = False  # chunked or Content-Length: else the body runs until the server closes
        self.body = b""
        self.retry_after: str | None = None
        self.error: BaseException | None = None

    def request(self, data: bytes, st: StreamState, watch: Watch,
                on_delta: Callable[[str], str | None] | None) -> asyncio.Future[Any]:
        self._start(st, watch, on_delta)
        self.busy = True
        self.sent_at = time.monotonic()
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.pool.buffer

    def buffer_updated(self, nbytes: int) -> None:
        if not self.busy:  # bytes nobody asked for: this connection cannot carry another request
            self._abort()
            return
        self.received = True
        self.watch.last = time.monotonic()  # type: ignore[union-attr]
        try:
            self.parser.feed_data(self.pool.buffer[:nbytes])
        except Exception as e:
            if not self.busy:  # bytes after a finished response, in its read: only this connection is unusable
                self._abort()
                return
            # httptools' exceptions derive from Exception only: they become aiohttp errors here.
            self._failed(self.error or self._parse_error(e))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.forget(self)
        if not self.busy or self.complete:
            return
        if self.head_done and not self.framed:  # a body that runs until the server closes: this is its end
            self._ended()
        elif not self.received:
            self._failed(aiohttp.ServerDisconnectedError())
        else:
            self._failed(aiohttp.ClientPayloadError("Response payload is not completed"))

    # -- httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        # Only chunked coding or a length frame the body (llhttp's rule too): any other Transfer-Encoding runs until
        # the server closes, which aiohttp accepts.
        if n == b"content-length" or (n == b"transfer-encoding" and value.rstrip().lower().endswith(b"chunked")):
            self.framed = True
        elif n == b"retry-after":
            self.retry_after = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        if not self.busy:  # a second response to one request: raised, so the connection is dropped
            raise ValueError("a response nobody asked for")
        self.status = self.parser.get_status_code()
        if self.status < 200:  # an interim 1xx answer: the real head follows
            self.framed = False
            return
        self.head_done = True
        if self.status == 200:
            assert self.st is not None and self.watch is not None
            reader = WholeParser if self.watch.whole else SseParser  # an unstreamed request: wire/whole.py
            self.sse = reader(self.st, self.watch, self.on_delta)

    def on_body(self, body: bytes) -> None:
        sse = self.sse
        if sse is not None:
            try:
                if sse.feed(body) and self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(Response(200, True))
            except Exception as e:
                # MalformedStream (the server's fault) or anything else (on_delta, our own code: not the server's,
                # and it propagates as it is). httptools re-raises it wrapped; buffer_updated hands on this one.
                self.error = e
                raise
        elif len(self.body) < 500:
            self.body += body[:500 - len(self.body)]

    def on_message_complete(self) -> None:
        if not self.head_done:
            return
        self._ended()
        w = self.waiter
        # A cancelled waiter: its task may not have run its cleanup yet, and a pooled connection could be another
        # request's by then, so it is closed rather than released.
        if self.parser.should_keep_alive() and not self.lost and not (w is not None and w.cancelled()):
            self._start(None, None, None)  # an idle connection keeps nothing of its last request alive
            self.busy = False
            self.pool.release(self)
        else:
            self._abort()

    # --

    def _ended(self) -> None:
        self.complete = True
        w = self.waiter
        if w is None or w.done():
            return
        try:
            if self.sse is not None:
                response = Response(200, self.sse.close())
            else:
                response = Response(self.status, body=self.body, retry_after=self.retry_after)
        except Exception as e:
            if not w.done():
                w.set_exception(e)
            return
        # Closing the parser hands its last content to on_delta, which may have stopped the request
        # (BackendClient.chat's stop_when cancels the waiting task): then nobody waits for the result.
        if not w.done():
            w.set_result(response)

    def _parse_error(self, e: Exception) -> Exception:
        """What the parser raised (other than an error of ours it carried, ``self.error``), as aiohttp's: in the
        body a cut stream (what aiohttp says when a body ends short), in the head a ClientResponseError (what
        aiohttp raises for a head it cannot parse). Not only HttpParserError: a 101 head makes httptools raise
        HttpParserUpgrade, which is no HttpParserError. An unreadable head also retires the pool, so that later
        requests for this backend go through aiohttp."""
        why = str(e) if isinstance(e, httptools.HttpParserError) else ""
        if not why:
            why = f"HTTP {self.status}: {type(e).__name__}" if self.status else type(e).__name__
        if self.head_done:
            return aiohttp.ClientPayloadError(f"Response payload is not completed: {why}")
        self.pool.retire()
        return aiohttp.ClientResponseError(self.pool.request_info, (), status=400, message=why)

    def _failed(self, e: BaseException) -> None:
        self.complete = True
        self._abort()
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(e)

    def _abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.abort()


Addr = tuple[int, str, int]  # family, host, port


class Pool:
    """The connections to one backend, idle ones reused last-in first-out."""

    def __init__(self, url: str, headers: dict[str, str], connect_timeout: float):
        u = urlsplit(url)
        self.host = u.hostname or ""
        self.port = u.port or 80
        self.connect_timeout = connect_timeout
        head = f"POST {u.path.rstrip('/')}/chat/completions HTTP/1.1\r\nHost: {u.netloc}\r\nAccept: */*\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = head.encode("latin-1")
        target = URL(f"{url.rstrip('/')}/chat/completions")
        self.request_info = aiohttp.RequestInfo(target, "POST", CIMultiDictProxy(CIMultiDict()), target)
        self._addrs: list[Addr] = []  # the host's addresses, resolved once (see _connect)
        self._resolving: asyncio.Task[list[Addr]] | None = None  # the one lookup under way, shared by all waiters
        self.buffer = memoryview(bytearray(65536))
        self.retired = False
        self.stale_retries = 0  # requests sent again because their kept-alive connection was closed under them
        self._idle: deque[_Conn] = deque()  # the oldest first: taken from the right, expired ones swept from the left
        self._all: set[_Conn] = set()

    async def post(self, body: bytes, st: StreamState, watch: Watch,
                   on_delta: Callable[[str], str | None] | None) -> Response:
        """Send one chat request and read its response into ``st``. Cancelled (the watchdog, the job), the
        connection is closed. After [DONE] the connection reads the rest of the body on its own, and goes back to
        the pool at its end.

        A kept-alive connection that the server closes just as the request is written (its idle timeout and our
        reuse crossing) fails at once, before any byte of a response: the server closed a connection it held idle,
        so it never read the request, which is sent once more on a new connection. That is no fault of the
        server's and no failed attempt. A new connection that fails so, a kept-alive one that fails later than
        STALE_WINDOW_S after the write (the server may have been working on it: a crash mid-prefill is the
        server's fault, and sending the request again unasked would hide it), or any connection once a byte came
        back, fails the request as before."""
        data = self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        conn, reused = await self._acquire()
        try:
            return await self._send(conn, data, st, watch, on_delta)
        except aiohttp.ServerDisconnectedError:
            if not reused or conn.received or time.monotonic() - conn.sent_at > STALE_WINDOW_S:
                raise
        self.stale_retries += 1
        conn, _ = await self._acquire(fresh=True)
        return await self._send(conn, data, st, watch, on_delta)

    async def _send(self, conn: _Conn, data: bytes, st: StreamState, watch: Watch,
                    on_delta: Callable[[str], str | None] | None) -> Response:
        fut = conn.request(data, st, watch, on_delta)
        try:
            return await fut
        except BaseException:  # cancelled (or failed): nothing more is read from this connection ...
            if conn.waiter is fut:  # ... unless it is no longer ours (released when its response ended)
                conn._abort()
            raise

    async def _acquire(self, *, fresh: bool = False) -> tuple[_Conn, bool]:
        """A connection and whether it was kept alive from an earlier request; ``fresh``: a new one."""
        now = time.monotonic()
        while self._idle and not fresh:
            c = self._idle.pop()
            if not c.lost and now - c.idle_since < KEEPALIVE_S:
                return c, True
            c._abort()
        addrs: list[Addr] | None = None
        # Only a failure to connect forgets the addresses: cancelled from outside (the job, the watchdog), they may
        # well be fine.
        try:
            with anyio.fail_after(self.connect_timeout):  # TimeoutError: the client's "timed out connecting"
                addrs = await self._resolve()
                return await self._connect(addrs), False
        except OSError as e:  # TimeoutError too (an OSError): the next connection resolves the host again
            self._forget(addrs)
            if isinstance(e, TimeoutError):
                raise
            raise ConnectError(e) from None

    async def _resolve(self) -> list[Addr]:
        """The host's addresses, resolved once per pool, not per connection (asyncio would call getaddrinfo for
        each), and by one lookup when many connections wait for them (a waiter cancelled leaves it running)."""
        if self._addrs:
            return self._addrs
        task = self._resolving
        if task is None:
            task = self._resolving = asyncio.ensure_future(self._lookup())
            task.add_done_callback(self._resolved)
        return await asyncio.shield(task)

    async def _lookup(self) -> list[Addr]:
        infos = await asyncio.get_running_loop().getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        return [(family, str(addr[0]), int(addr[1])) for family, _, _, _, addr in infos]

    def _resolved(self, task: asyncio.Task[list[Addr]]) -> None:
        self._resolving = None
        # Asking for the exception also keeps asyncio from logging one that every waiter gave up on.
        if not task.cancelled() and task.exception() is None:
            self._addrs = task.result()

    async def _connect(self, addrs: list[Addr]) -> _Conn:
        """A new connection: ``addrs`` tried in order, as asyncio does. The list is this call's own (other
        connections may reorder or forget the pool's meanwhile); the address that answered goes first for later
        connections. OSError when none answered."""
        loop = asyncio.get_running_loop()
        err: OSError | None = None
        for addr in tuple(addrs):
            family, host, port = addr
            try:
                _, conn = await loop.create_connection(lambda: _Conn(self), host, port, family=family)
            except OSError as e:
                err = e
                continue
            self._all.add(conn)  # at once: close() must reach it whatever happens to this task next
            cur = self._addrs
            if cur and cur[0] != addr and addr in cur:
                self._addrs = [addr, *(a for a in cur if a != addr)]
            return conn
        raise err or OSError(f"{self.host} has no address")

    def _forget(self, addrs: list[Addr] | None) -> None:
        """No address of ``addrs`` answered: unless the pool's list changed meanwhile (resolved again, or another
        connection reordered it after one answered), the next connection resolves the host again."""
        if addrs is not None and self._addrs is addrs:
            self._addrs = []

    def release(self, c: _Conn) -> None:
        if self.retired:
            c._abort()
            return
        now = c.idle_since = time.monotonic()
        idle = self._idle
        # The oldest lie leftmost: expired ones close here too, not only when _acquire runs out of fresh ones.
        while idle and (idle[0].lost or now - idle[0].idle_since >= KEEPALIVE_S):
            idle.popleft()._abort()
        idle.append(c)

    def forget(self, c: _Conn) -> None:
        """``c`` closed: it is neither reused nor closed again."""
        self._all.discard(c)
        if not c.busy:
            try:
                self._idle.remove(c)
            except ValueError:
                pass

    def retire(self) -> None:
        """No more requests: idle connections close now, busy ones when their response ends."""
        self.retired = True
        for c in list(self._idle):  # a copy: forget() takes closed ones out of the list
            c._abort()
        self._idle.clear()

    def close(self) -> None:
        self.retire()
        if self._resolving is not None:
            self._resolving.cancel()
        for c in list(self._all):
            c._abort()
        self._all.clear()
