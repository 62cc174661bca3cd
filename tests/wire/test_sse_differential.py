"""The hot path's own reader (orchestrator/sseproto.py) against aiohttp: the same response bytes, cut anywhere,
give the same StreamState (parts, finish, usage) and the same [DONE]. The socket tests run on asyncio's own loop and
on uvloop (what jobs run on where it is installed: event_loop_options)."""

from __future__ import annotations

import asyncio
import itertools
import random

import aiohttp
import anyio
import orjson
import pytest

from orchestrator.core.config import Backend
from orchestrator.wire.client import BackendClient
from orchestrator.wire.sse import StreamState, Watch, read_events
from orchestrator.wire.sseproto import Pool, Response, _Conn, event_loop_options

# asyncio's loop, and uvloop where it is installed (it is a dependency of jobs: a missing one is a failure here).
LOOPS = [pytest.param({}, id="asyncio"), pytest.param({"use_uvloop": True}, id="uvloop")]


def test_jobs_run_on_uvloop_here():
    assert event_loop_options() == {"use_uvloop": True}  # else the uvloop runs below test asyncio's loop twice


def ev(obj: dict, crlf: bool = False) -> bytes:
    nl = b"\r\n" if crlf else b"\n"
    return b"data: " + orjson.dumps(obj) + nl + nl


def delta(text: str, finish: str | None = None) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text},
                                                                        "finish_reason": finish}]}


USAGE = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}
ROLE = {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}


def events(crlf: bool = False) -> bytes:
    nl = b"\r\n" if crlf else b"\n"
    return (ev(ROLE, crlf) + b": ping" + nl + nl + ev(delta("Hel"), crlf) + b"event: message" + nl + b"id: 2" + nl
            + ev(delta("lo, \u00e9t\u00e9 \u2014 "), crlf) + ev(delta(" world", "stop"), crlf) + ev(USAGE, crlf)
            + b"data: [DONE]" + nl + nl)


MULTILINE = (b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"two\\nlines"},\ndata:"finish_reason":"length"}]}\n\n'
             + ev(USAGE) + b"data: [DONE]\n\n")
AFTER_DONE = ev(delta("kept", "stop")) + b"data: [DONE]\n\n" + ev(delta("ignored")) + ev(USAGE)
NO_DONE_NO_NEWLINE = ev(delta("a")) + b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


def chunked(body: bytes, sizes: list[int], ext: bool = False) -> bytes:
    out, i, k = b"", 0, 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        k += 1
        piece = body[i:i + n]
        i += n
        out += b"%x%s\r\n%s\r\n" % (len(piece), b";name=value;x" if ext and k % 2 else b"", piece)
    return HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + out + b"0\r\n\r\n"


def sized(body: bytes) -> bytes:
    return HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body


CASES = {
    "chunked-lf": chunked(events(), [10_000]),
    "chunked-odd-sizes-ext": chunked(events(), [1, 7, 3, 64, 13], ext=True),
    "chunked-crlf": chunked(events(crlf=True), [5, 200, 9]),
    "content-length": sized(events()),
    "content-length-crlf": sized(events(crlf=True)),
    "multiline-data": chunked(MULTILINE, [17, 4]),
    "events-after-done": chunked(AFTER_DONE, [30]),
    "no-done-last-line-unterminated": sized(NO_DONE_NO_NEWLINE),
}


def outcome(st: StreamState, deltas: list[str], done: bool) -> tuple:
    return (deltas, st.parts, st.finish, st.prompt_tokens, st.completion_tokens, done)


# -- a real socket server on 127.0.0.1: answers each request with the next scripted response, piece by piece


class Server:
    def __init__(self, responses: list[list[bytes]]):
        self.responses = responses
        self.connections = 0
        self.requests = 0  # requests read whole

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.responses:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                self.requests += 1
                for i, piece in enumerate(self.responses.pop(0)):
                    if i:
                        await asyncio.sleep(0.002)  # separate reads, as far as TCP allows
                    writer.write(piece)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()


def pieces(raw: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cuts), len(raw)]
    return [raw[a:b] for a, b in itertools.pairwise(edges) if b > a]


async def via_aiohttp(url: str) -> tuple:
    st, deltas = StreamState(), []
    watch = Watch(anyio.CancelScope(), 0.0)
    async with aiohttp.ClientSession() as s, s.post(url + "/chat/completions", data=b"{}") as r:
        done = await read_events(r.content, st, watch, deltas.append)
    return outcome(st, deltas, done)


async def via_pool(pool: Pool) -> tuple:
    st, deltas = StreamState(), []
    got = await pool.post(b"{}", st, Watch(anyio.CancelScope(), 0.0), deltas.append)
    assert isinstance(got, Response) and got.status == 200
    return outcome(st, deltas, got.done)


class _Sink:
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def feed_directly(raw: bytes, cuts: list[int]) -> tuple:
    """Our reader fed exactly these pieces (no socket in between: each piece is one read)."""

    async def go() -> tuple:
        pool = Pool("http://127.0.0.1:9/v1", {}, 1.0)
        conn = _Conn(pool)
        conn.connection_made(_Sink())  # type: ignore[arg-type]
        st, deltas = StreamState(), []
        fut = conn.request(b"", st, Watch(anyio.CancelScope(), 0.0), deltas.append)
        for piece in pieces(raw, cuts):
            n = len(piece)
            conn.get_buffer(n)[:n] = piece
            conn.buffer_updated(n)
        if not fut.done():
            conn.connection_lost(None)
        got = fut.result()
        return outcome(st, deltas, got.done)

    return asyncio.run(go())


def reference(raw: bytes) -> tuple:
    async def go() -> tuple:
        async with Server([[raw]]) as url:
            return await via_aiohttp(url)

    return anyio.run(go)


@pytest.mark.parametrize("name", list(CASES))
def test_every_split_gives_what_aiohttp_gives(name):
    raw = CASES[name]
    want = reference(raw)
    assert want[0] and want[2] in ("stop", "length")  # the case streams something (no vacuous comparison)
    for i in range(1, len(raw)):  # every byte offset
        assert feed_directly(raw, [i]) == want, (name, i)
    rng = random.Random(name)
    for _ in range(200):  # random multi-splits, down to single bytes
        cuts = rng.sample(range(1, len(raw)), rng.randint(2, min(40, len(raw) - 1)))
        assert feed_directly(raw, cuts) == want, (name, cuts)
    assert feed_directly(raw, list(range(1, len(raw)))) == want  # one byte per read


@pytest.mark.parametrize("loop", LOOPS)
def test_over_sockets_split_alike_for_both_and_kept_alive(loop):
    rng = random.Random(7)
    scripts = []
    for name, raw in CASES.items():
        for _ in range(3):
            scripts.append((name, pieces(raw, rng.sample(range(1, len(raw)), rng.randint(1, 6)))))

    async def go() -> None:
        for name, parts in scripts:
            async with Server([parts]) as url:
                want = await via_aiohttp(url)
            srv = Server([parts, parts])  # two responses on one connection
            async with srv as url:
                pool = Pool(url, {"Content-Type": "application/json"}, 5.0)
                try:
                    assert await via_pool(pool) == want, name
                    with anyio.fail_after(5):  # after [DONE] the connection reads the rest of its body first
                        while not pool._idle:  # noqa: ASYNC110 (the pool has no event to wait on)
                            await anyio.sleep(0.002)
                    assert await via_pool(pool) == want, name
                finally:
                    pool.close()
            assert srv.connections == 1, f"{name}: the second request did not reuse the connection"

    anyio.run(go, backend_options=loop)


BAD_CHUNK = ev(delta("cut"))
ERRORS = {
    "500": [b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 38\r\n\r\n",
            b'{"error":{"message":"engine is dead"}}'],
    "429": [b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nTransfer-Encoding: chunked\r\n\r\n5;e=1\r\nslow \r\n",
            b"5\r\ndown!\r\n0\r\n\r\n"],
    "400": [b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 45\r\n\r\n"
            b'{"error":{"message":"response_format is bad"}', b"}"],
    "cut-chunked": [HEAD + b"Transfer-Encoding: chunked\r\n\r\n", b"%x\r\n%s\r\n" % (len(BAD_CHUNK), BAD_CHUNK)],
    "cut-content-length": [HEAD + b"Content-Length: 5000\r\n\r\n", BAD_CHUNK],
    "until-close": [HEAD + b"Connection: close\r\n\r\n", events()],  # a body that runs until the server closes
    # Not chunked, so no frame either: until the server closes (no [DONE], so only the close can end it).
    "until-close-not-chunked": [HEAD + b"Transfer-Encoding: identity\r\n\r\n", ev(delta("a")), ev(delta("b", "stop"))],
    # An invalid chunk size after a good chunk. It comes in the head's read: aiohttp leaves a parse error in a later
    # read of the body unreported (its read waits on until the watchdog's between-chunk timeout).
    "invalid-chunk": [HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\nzz\r\n" % (len(BAD_CHUNK), BAD_CHUNK)],
    "unreadable-head": [b"HTTP/1.1 2OO OK\r\n\r\n"],
}
# Where the two paths legitimately differ (the reply's class still agrees: ok, tokens, retryable, health). aiohttp
# fails the whole read that holds a parse error, its good chunk too (text ""), and reports it as the
# ClientResponseError of a bad head ("connection error: unreadable response head: ..."); ours keeps the text read
# before the bad chunk and says what happened, a stream cut short ("stream cut: Response payload is not completed").
WORDED_APART = {"invalid-chunk"}


def reply_class(r, text: bool = True) -> tuple:
    return (r.ok, r.text if text else None, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.retry_after, r.retryable,
            r.health)


def error_words(r) -> tuple:
    """The error's kind (the words before the first ":") and its status. After the ":" comes the library's own
    message, which differs by design: aiohttp names its exception and byte counts ("<ContentLengthError: 400,
    message='Not enough data ...'>"), ours llhttp's reason or nothing."""
    return (r.status, (r.error or "").split(":")[0])


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("name", list(ERRORS))
def test_error_replies_are_the_same_on_both_paths(name, loop):
    async def go() -> list:
        out = []
        for fast in (False, True):
            srv = Server([list(ERRORS[name])])
            async with srv as url, BackendClient(Backend(url), "m") as client:
                if not fast:
                    client._pool = None  # aiohttp's path
                else:
                    assert client._pool is not None
                r = await client.chat(client.body([], max_tokens=8, temperature=0))
            assert srv.requests == 1, (fast, srv.requests)  # sent once, never again
            out.append(r)
        return out

    slow, fast = anyio.run(go, backend_options=loop)
    assert slow.ok is name.startswith("until-close")  # every other case is a failure (no vacuous comparison)
    assert reply_class(slow, name not in WORDED_APART) == reply_class(fast, name not in WORDED_APART)
    if name in WORDED_APART:
        assert fast.error.startswith("stream cut: Response payload is not completed") and fast.status is None
        assert slow.error.startswith("connection error: unreadable response head: ") and slow.status is None
    else:
        assert error_words(slow) == error_words(fast)
        if slow.status is not None:  # an HTTP error: the server's own words, the same on both paths
            assert slow.error == fast.error


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_stream_closes_its_connection(loop):
    closed = anyio.Event()

    async def go():
        async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
            await reader.read()  # returns once the client closed its end
            closed.set()
            writer.close()

        server = await asyncio.start_server(hang, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        try:
            async with BackendClient(Backend(url), "m", first_token_timeout=0.2) as c:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(c.watchdog)
                    r = await c.chat(c.body([], max_tokens=8, temperature=0))
                    with anyio.fail_after(5):
                        await closed.wait()
                    tg.cancel_scope.cancel()
        finally:
            server.close()
        return r

    r = anyio.run(go, backend_options=loop)
    assert not r.ok and r.error == "timed out waiting for the first token"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_request_cancelled_as_its_response_ends_leaves_the_next_request_alone(loop):
    """A is cancelled while its last bytes are read, and B asks for a connection in the same loop turn: A's
    connection must not go to B (its waiter was cancelled), and A's cleanup must not close B's connection."""
    body = ev(delta("hi", "stop")) + b"data: [DONE]\n\n"
    resp = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def go():
        srv = Server([[resp], [resp]])
        async with srv as url:
            pool = Pool(url, {}, 5.0)
            b_may_start = asyncio.Event()
            out = {}

            async def a() -> None:
                me = asyncio.current_task()
                assert me is not None

                def on_delta(text: str) -> None:
                    b_may_start.set()
                    me.cancel()

                try:
                    out["A"] = await pool.post(b"{}", StreamState(), Watch(anyio.CancelScope(), 0.0), on_delta)
                except asyncio.CancelledError:
                    out["A"] = "cancelled"

            async def b() -> None:
                await b_may_start.wait()
                out["B"] = await pool.post(b"{}", StreamState(), Watch(anyio.CancelScope(), 0.0), None)

            try:
                with anyio.fail_after(5):
                    await asyncio.gather(a(), b())
                conn_a_idle = list(pool._idle)
            finally:
                pool.close()
        return out, srv, conn_a_idle

    out, srv, idle = anyio.run(go, backend_options=loop)
    assert out["A"] == "cancelled"
    assert isinstance(out["B"], Response) and out["B"].status == 200 and out["B"].done
    assert srv.requests == 2 and srv.connections == 2  # A's connection was closed, not handed to B
    assert all(c.st is None and c.sse is None and c.watch is None and c.on_delta is None for c in idle)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_connect_timeout_is_worded_alike_on_both_paths(loop):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fill = []  # a full backlog: further connects hang in SYN
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fill.append(s)

    async def go() -> list:
        out = []
        for fast in (False, True):
            async with BackendClient(Backend(f"http://127.0.0.1:{port}/v1"), "m", connect_timeout=0.3) as c:
                if not fast:
                    c._pool = None
                out.append(await c.chat(c.body([], max_tokens=8, temperature=0)))
        return out

    try:
        slow, fast = anyio.run(go, backend_options=loop)
    finally:
        for s in [*fill, listener]:
            s.close()
    assert slow.error == fast.error == "timed out connecting" and slow.health and fast.health
