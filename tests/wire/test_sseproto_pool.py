"""The hot path's own connections (orchestrator/sseproto.py's Pool) under races and odd answers: connections made
at once while addresses fail, a cancelled or timed-out connect, an unreadable head (a 101 too), bytes after a
response, idle connections that expire. Run on asyncio's loop and on uvloop, as test_sse_differential.py."""

from __future__ import annotations

import asyncio
import random
import socket

import aiohttp
import anyio
import pytest
from test_sse_differential import HEAD, LOOPS, Server, _Sink, chunked, delta, ev, events

from orchestrator.core.config import Backend
from orchestrator.wire import sseproto
from orchestrator.wire.client import BackendClient
from orchestrator.wire.sse import StreamState, Watch
from orchestrator.wire.sseproto import ConnectError, Pool, Response, _Conn

BODY = ev(delta("x", "stop")) + b"data: [DONE]\n\n"
RESP = HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY


def free_port() -> int:
    """A port nothing listens on: connecting to it is refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def fake_lookup(ports: list[int], calls: list[int], fail: bool = False):
    """loop.getaddrinfo answering 127.0.0.1 on ``ports`` (in that order), slowly enough that callers overlap."""

    async def getaddrinfo(host, port, **kw):
        calls.append(1)
        await asyncio.sleep(0.005)
        if fail:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p)) for p in ports]

    return getaddrinfo


async def post(pool: Pool) -> Response:
    return await pool.post(b"{}", StreamState(), Watch(anyio.CancelScope(), 0.0), None)


@pytest.mark.parametrize("loop", LOOPS)
def test_connections_made_at_once_past_a_dead_address_all_succeed_and_none_leaks(loop):
    """The host's first address refuses; 200 requests connect at once. Each must fall through to the live one
    (however others reorder the addresses meanwhile), the host is looked up once, and every socket made is the
    pool's (closed with it)."""
    n = 200
    open_now = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_now[0] += 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)  # the body, b"{}"
                writer.write(RESP)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            open_now[0] -= 1
            writer.close()

    async def go():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        async with server:
            live = server.sockets[0].getsockname()[1]
            calls: list[int] = []
            asyncio.get_running_loop().getaddrinfo = fake_lookup([free_port(), live], calls)  # type: ignore[method-assign]
            pool = Pool(f"http://example.invalid:{live}/v1", {}, 5.0)
            rng = random.Random(3)

            async def one() -> str:
                await asyncio.sleep(rng.random() * 0.05)
                try:
                    return "ok" if (await post(pool)).done else "not done"
                except Exception as e:
                    return type(e).__name__

            try:
                got = await asyncio.gather(*[one() for _ in range(n)])
                with anyio.move_on_after(3):  # the server may accept a connection a little after the client made it
                    while open_now[0] != len(pool._all):  # noqa: ASYNC110 (the server has no event to wait on)
                        await anyio.sleep(0.01)
                return got, calls, open_now[0], len(pool._all)
            finally:
                pool.close()

    got, calls, accepted, owned = anyio.run(go, backend_options=loop)
    assert got == ["ok"] * n
    assert len(calls) == 1  # one lookup for all of them
    assert accepted == owned  # no connection the pool does not know (and so would never close)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_failed_lookup_is_shared_and_fails_cleanly(loop):
    async def go():
        calls: list[int] = []
        asyncio.get_running_loop().getaddrinfo = fake_lookup([], calls, fail=True)  # type: ignore[method-assign]
        pool = Pool("http://example.invalid:80/v1", {}, 5.0)
        got = await asyncio.gather(*[post(pool) for _ in range(20)], return_exceptions=True)
        again = await asyncio.gather(post(pool), return_exceptions=True)  # a later connection looks up again
        pool.close()
        return got + again, calls

    got, calls = anyio.run(go, backend_options=loop)
    assert all(isinstance(e, ConnectError) and isinstance(e.os_error, socket.gaierror) for e in got)
    assert len(calls) == 2


def hanging_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listener with a full backlog: further connects hang (as in test_a_connect_timeout_is_worded_alike...)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fill = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(listener.getsockname())
        except BlockingIOError:
            pass
        fill.append(s)
    return listener, fill


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_connect_keeps_the_addresses_and_a_timed_out_one_forgets_them(loop):
    listener, fill = hanging_listener()
    port = listener.getsockname()[1]

    async def go():
        pool = Pool(f"http://127.0.0.1:{port}/v1", {}, 0.3)
        with anyio.move_on_after(0.1):  # the job or the watchdog gives up: nothing says the address is bad
            await post(pool)
        kept = list(pool._addrs)
        with pytest.raises(TimeoutError):
            await post(pool)
        forgotten = list(pool._addrs)
        pool.close()
        return kept, forgotten

    try:
        kept, forgotten = anyio.run(go, backend_options=loop)
    finally:
        for s in [*fill, listener]:
            s.close()
    assert kept and forgotten == []


@pytest.mark.parametrize("loop", LOOPS)
def test_an_unexpected_fault_of_the_pool_is_ours_and_propagates(loop, monkeypatch):
    """A bug in our own reader is no server's fault: it is not worded as a failed reply (which would be retried and
    count against a healthy backend) but raised, for the job to end as an internal error."""
    async def broken(self, addrs):
        raise IndexError("pop from empty list")

    monkeypatch.setattr(Pool, "_connect", broken)

    async def go():
        async with Server([[RESP]]) as url, BackendClient(Backend(url), "m") as c:
            return await c.chat(c.body([], max_tokens=8, temperature=0))

    with pytest.raises(IndexError, match="pop from empty list"):
        anyio.run(go, backend_options=loop)


UPGRADE = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(("head", "fast"), [pytest.param(b"HTTP/1.1 2OO OK\r\n\r\n", True, id="bad-status-ours"),
                                            pytest.param(b"HTTP/1.1 2OO OK\r\n\r\n", False, id="bad-status-aiohttp"),
                                            pytest.param(UPGRADE, True, id="switching-protocols-ours")])
def test_an_unreadable_head_fails_once_keeps_structured_output_and_later_requests_go_through_aiohttp(head, fast, loop):
    """Not a refusal of response_format (no re-send in text, structured output stays on), not sent again."""

    async def go():
        srv = Server([[head], [chunked(events(), [50])]])
        async with srv as url, BackendClient(Backend(url), "m") as c:
            if not fast:
                c._pool = None
            schema = {"type": "object"}
            first = await c.send(lambda: c.body([], max_tokens=8, temperature=0, schema=schema))
            sent_first, structured = srv.requests, c.structured
            second = await c.chat(c.body([], max_tokens=8, temperature=0))
            return first, sent_first, structured, second, c._pool, srv.requests

    first, sent_first, structured, second, pool, sent = anyio.run(go, backend_options=loop)
    assert len(first) == 1 and sent_first == 1 and structured  # one send, no silent re-send
    r = first[0]
    assert not r.ok and r.retryable and r.health and r.status is None
    assert r.error.startswith("connection error: unreadable response head: ")
    assert pool is None or pool.retired
    assert second.ok and second.text == "Hello, \u00e9t\u00e9 \u2014  world" and sent == 2


class _Recorder(_Sink):
    aborted = False

    def abort(self) -> None:
        self.aborted = True


def fed(pool: Pool, raw: bytes) -> tuple[_Conn, _Recorder, asyncio.Future]:
    conn = _Conn(pool)
    sink = _Recorder()
    conn.connection_made(sink)  # type: ignore[arg-type]
    fut = conn.request(b"", StreamState(), Watch(anyio.CancelScope(), 0.0), None)
    conn.get_buffer(len(raw))[:len(raw)] = raw
    conn.buffer_updated(len(raw))
    return conn, sink, fut


def test_a_second_response_in_the_same_read_drops_only_its_connection():
    async def go():
        pool = Pool("http://127.0.0.1:9/v1", {}, 1.0)
        conn, sink, fut = fed(pool, RESP + RESP)
        return pool, conn, sink, fut.result()

    pool, conn, sink, got = asyncio.run(go())
    assert got.status == 200 and got.done  # the request itself was answered
    assert sink.aborted and conn.lost and not pool.retired  # lost: never handed out again


def test_an_upgrade_head_fed_directly_fails_as_an_unreadable_head():
    async def go():
        pool = Pool("http://127.0.0.1:9/v1", {}, 1.0)
        _, sink, fut = fed(pool, UPGRADE + b"xx")
        return pool, sink, fut.exception()

    pool, sink, exc = asyncio.run(go())
    assert isinstance(exc, aiohttp.ClientResponseError) and "101" in exc.message
    assert sink.aborted and pool.retired


def test_expired_idle_connections_close_on_release_and_closed_ones_leave_the_idle_list():
    async def go():
        pool = Pool("http://127.0.0.1:9/v1", {}, 1.0)
        conns = [fed(pool, RESP)[:2] for _ in range(3)]  # each answered whole: back in the pool
        (old, old_sink), (mid, _), (new, _) = conns
        assert list(pool._idle) == [old, mid, new]
        old.idle_since -= sseproto.KEEPALIVE_S + 1  # the oldest has expired, the others not
        fresh, _, _ = fed(pool, RESP)
        after_release = list(pool._idle)
        mid.connection_lost(None)  # the server closed an idle one
        return after_release, list(pool._idle), old, old_sink, mid, new, fresh

    after_release, after_lost, _, old_sink, mid, new, fresh = asyncio.run(go())
    assert after_release == [mid, new, fresh] and old_sink.aborted
    assert after_lost == [new, fresh]


def _closing_server(close_on: int, seen: list[int]):
    """Answers requests on each connection, and closes the connection without a byte of answer when the
    ``close_on``-th request on it arrives (1: every new connection's first; 2: a kept-alive one's next)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                n += 1
                seen.append(n)
                if n == close_on:
                    return  # the idle timeout and our reuse crossing: closed under the request
                writer.write(RESP)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return serve


@pytest.mark.parametrize("loop", LOOPS)
def test_a_kept_alive_connection_closed_under_a_request_sends_it_again_once_without_blame(loop):
    seen: list[int] = []

    async def go():
        server = await asyncio.start_server(_closing_server(2, seen), "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            async with BackendClient(Backend(f"http://127.0.0.1:{port}/v1"), "m") as c:
                first = await c.chat(c.body([], max_tokens=8, temperature=0))
                second = await c.chat(c.body([], max_tokens=8, temperature=0))  # on the kept-alive connection
                assert c._pool is not None
                return first, second, c._pool.stale_retries

    first, second, retries = anyio.run(go, backend_options=loop)
    assert first.ok and second.ok, (first.error, second.error)
    assert not second.health and second.error is None  # no failed attempt, nothing counted against the server
    assert retries == 1
    assert seen == [1, 2, 1]  # the second request was sent twice: on the stale connection, then on a new one


@pytest.mark.parametrize("loop", LOOPS)
def test_a_new_connection_closed_under_a_request_fails_it_and_is_not_sent_again(loop):
    seen: list[int] = []

    async def go():
        server = await asyncio.start_server(_closing_server(1, seen), "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            async with BackendClient(Backend(f"http://127.0.0.1:{port}/v1"), "m") as c:
                reply = await c.chat(c.body([], max_tokens=8, temperature=0))
                assert c._pool is not None
                return reply, c._pool.stale_retries

    reply, retries = anyio.run(go, backend_options=loop)
    assert not reply.ok and reply.health and (reply.error or "").startswith("stream cut")
    assert retries == 0 and seen == [1]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_kept_alive_connection_closed_long_after_the_write_is_the_servers_fault(loop, monkeypatch):
    """Closed with no answer later than the stale window after the write: the server may have been working on the
    request (a crash mid-prefill), so it is a failed attempt, not sent again unasked."""
    monkeypatch.setattr(sseproto, "STALE_WINDOW_S", 0.2)
    seen: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                n += 1
                seen.append(n)
                if n == 2:
                    await asyncio.sleep(0.5)  # working on it, then gone
                    return
                writer.write(RESP)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def go():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            async with BackendClient(Backend(f"http://127.0.0.1:{port}/v1"), "m") as c:
                await c.chat(c.body([], max_tokens=8, temperature=0))
                reply = await c.chat(c.body([], max_tokens=8, temperature=0))
                assert c._pool is not None
                return reply, c._pool.stale_retries

    reply, retries = anyio.run(go, backend_options=loop)
    assert not reply.ok and reply.health and retries == 0 and seen == [1, 2]
