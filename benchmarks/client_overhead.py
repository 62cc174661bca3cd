"""Client CPU per streamed SSE chunk: our hot path vs the openai SDK vs raw aiohttp + orjson.

    .venv/bin/python benchmarks/client_overhead.py              # table: 256 and 1,536 concurrent streams
    .venv/bin/python benchmarks/client_overhead.py --json       # ... then {"us_per_chunk_256", "us_per_chunk_1536"}
    .venv/bin/python benchmarks/client_overhead.py --clients ours --streams 1536

A minimal, fast SSE server (raw asyncio protocol, vLLM-shaped chunks, HTTP/1.1 chunked) runs in its own process so
its CPU is not counted. It paces every stream like a batching engine does: one chunk per stream per step, written
to every socket in the same step, so a client read sees one SSE event at a time (as against a real server) rather
than a burst it could amortise. Each client runs in a fresh process; its CPU time (user + system, from
``resource.getrusage``) over the whole run (requests, headers, every chunk, usage, [DONE]) is divided by the
chunks it received. Target for ours: <= 10 us per chunk at 1,536 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import time

from orchestrator.core.osutil import free_port, raise_open_file_limit

CHUNKS_PER_REQUEST = 100  # ~ a 400-token section at stream interval 4
MODEL = "bench-model"
TOKENS = [" stream", "ing", " client", " cost", " per", " chunk", " is", " what", " we", " measure", ".", "\n\n",
          " The", " hot", " path", " reads", " SSE", " lines", " from", " many", " sockets", " at", " once", ","]


# --------------------------------------------------------------------------------------------------------------
# The server (its own process).


def _chunk(rid: bytes, piece: str, finish: str | None) -> bytes:
    import orjson

    fr = b"null" if finish is None else b'"' + finish.encode() + b'"'
    return (b'data: {"id":"' + rid + b'","object":"chat.completion.chunk","created":1700000000,"model":"'
            + MODEL.encode() + b'","choices":[{"index":0,"delta":{"content":' + orjson.dumps(piece)
            + b'},"logprobs":null,"finish_reason":' + fr + b"}]}\n\n")


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Conn(asyncio.Protocol):
    def __init__(self, server: _Server):
        self.server = server
        self.buf = b""
        self.tr: asyncio.Transport | None = None

    def connection_made(self, transport):
        self.tr = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(self.buf) < end + 4 + length:
                return
            path = head.split(" ", 2)[1]
            self.buf = self.buf[end + 4 + length:]
            if path.endswith("/models"):
                body = b'{"object":"list","data":[{"id":"' + MODEL.encode() + b'","object":"model"}]}'
                self.tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                              % (len(body), body))
                continue
            self.tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                          b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
            self.server.add(self)

    def connection_lost(self, exc):
        self.tr = None


class _Server:
    """Steps every ``interval`` seconds; each step writes one chunk to every open stream."""

    def __init__(self, interval: float, chunks: int):
        self.interval = interval
        self.chunks = chunks
        self.streams: list[list] = []
        self.seq = 0

    def add(self, conn: _Conn) -> None:
        self.seq += 1
        rid = b"chatcmpl-%032x" % self.seq
        first = (b'data: {"id":"' + rid + b'","object":"chat.completion.chunk","created":1700000000,"model":"'
                 + MODEL.encode() + b'","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                 b'"logprobs":null,"finish_reason":null}]}\n\n')
        conn.tr.write(_frame(first))
        self.streams.append([conn, rid, 0])

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        n_tok = len(TOKENS)
        while True:
            deadline += self.interval
            delay = deadline - loop.time()
            await asyncio.sleep(max(0.0, delay))
            if delay < -1.0:
                deadline = loop.time()
            keep = []
            for st in self.streams:
                conn, rid, k = st
                tr = conn.tr
                if tr is None:
                    continue
                piece = "".join(TOKENS[(k * 4 + j) % n_tok] for j in range(4))
                k += 1
                last = k >= self.chunks
                data = _frame(_chunk(rid, piece, "stop" if last else None))
                if last:
                    usage = (b'data: {"id":"' + rid + b'","object":"chat.completion.chunk","created":1700000000,'
                             b'"model":"' + MODEL.encode() + b'","choices":[],"usage":{"prompt_tokens":40,'
                             b'"total_tokens":%d,"completion_tokens":%d}}\n\n' % (40 + 4 * k, 4 * k))
                    data += _frame(usage) + _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
                tr.write(data)
                if not last:
                    st[2] = k
                    keep.append(st)
            self.streams = keep


def serve(port: int, interval: float, chunks: int) -> None:
    async def main() -> None:
        srv = _Server(interval, chunks)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Conn(srv), "127.0.0.1", port, backlog=8192, reuse_address=True)
        print("ready", flush=True)
        async with server:
            await srv.run()

    asyncio.run(main())


# --------------------------------------------------------------------------------------------------------------
# The clients (each in its own process).

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Write the section in about 250 words."}],
        "max_tokens": 520, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}


async def client_ours(url: str, streams: int, requests: int) -> tuple[int, int]:
    import anyio

    from orchestrator.core.config import Backend
    from orchestrator.wire.client import BackendClient

    got = {"chunks": 0, "errors": 0}
    async with BackendClient(Backend(url, cap=streams), MODEL) as client:
        body = client.body(BODY["messages"], max_tokens=520, temperature=0.0)

        async def worker() -> None:
            for _ in range(requests):
                r = await client.chat(body)
                if not r.ok or r.finish_reason != "stop" or r.completion_tokens != 4 * CHUNKS_PER_REQUEST:
                    got["errors"] += 1
                else:
                    got["chunks"] += CHUNKS_PER_REQUEST  # content chunks (the role chunk carries no text)

        async with anyio.create_task_group() as tg:
            tg.start_soon(client.watchdog)
            async with anyio.create_task_group() as work:
                for _ in range(streams):
                    work.start_soon(worker)
            tg.cancel_scope.cancel()
    return got["chunks"], got["errors"]


async def client_aiohttp(url: str, streams: int, requests: int) -> tuple[int, int]:
    import aiohttp
    import orjson

    got = {"chunks": 0, "errors": 0}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        data = orjson.dumps(BODY)

        async def worker() -> None:
            for _ in range(requests):
                parts = []
                async with session.post(url + "/chat/completions", data=data,
                                        headers={"Content-Type": "application/json"}) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            d = orjson.loads(line[6:])
                            ch = d["choices"]
                            if ch and ch[0]["delta"].get("content"):
                                parts.append(ch[0]["delta"]["content"])
                    ok = r.status == 200
                "".join(parts)
                if ok and len(parts) == CHUNKS_PER_REQUEST:
                    got["chunks"] += len(parts)
                else:
                    got["errors"] += 1

        await asyncio.gather(*(worker() for _ in range(streams)))
    return got["chunks"], got["errors"]


def sdk_http():
    """The HTTP library the installed openai SDK runs on: httpx2 (openai 3.x) or httpx (earlier SDKs). The SDK
    brings it, so a fresh install has it; the client below is made with it, never with another stack."""
    try:
        import httpx2 as http
    except ImportError:
        import httpx as http
    return http


async def client_openai(url: str, streams: int, requests: int) -> tuple[int, int]:
    import openai

    http = sdk_http()
    got = {"chunks": 0, "errors": 0}
    # No connection limit (the SDK's default pool holds 1,000): every stream gets its own connection, as ours do.
    # An SDK that refuses this client raises: the benchmark never falls back to a pool of another size.
    http_client = http.AsyncClient(limits=http.Limits(max_connections=None, max_keepalive_connections=None),
                                   timeout=http.Timeout(600.0))
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0, http_client=http_client)

    async def worker() -> None:
        for _ in range(requests):
            parts = []
            s = await client.chat.completions.create(
                model=MODEL, messages=BODY["messages"], max_tokens=520, temperature=0, stream=True,
                stream_options={"include_usage": True})
            async for ch in s:
                if ch.choices and ch.choices[0].delta.content:
                    parts.append(ch.choices[0].delta.content)
            "".join(parts)
            if len(parts) == CHUNKS_PER_REQUEST:
                got["chunks"] += len(parts)
            else:
                got["errors"] += 1

    await asyncio.gather(*(worker() for _ in range(streams)))
    await client.close()
    return got["chunks"], got["errors"]


CLIENTS = {"ours": client_ours, "ours-uvloop": client_ours, "aiohttp": client_aiohttp, "openai": client_openai}
LABELS = {"ours": "ours: BackendClient.chat (sseproto + orjson), asyncio",
          "ours-uvloop": "ours: the same on uvloop (as a job runs it)",
          "aiohttp": "aiohttp + orjson, line by line",
          "openai": "openai SDK typed stream"}


def run_client(kind: str, url: str, streams: int, requests: int) -> dict:
    raise_open_file_limit(streams + 256)
    import anyio

    # Imports are not part of the cost per chunk: load everything the client uses before measuring.
    if kind == "openai":
        import openai  # noqa: F401

        sdk_http()
    else:
        import aiohttp  # noqa: F401
        import orjson  # noqa: F401

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    options = {}
    if kind == "ours-uvloop":
        from orchestrator.wire.sseproto import event_loop_options

        options = event_loop_options()
        if not options:  # a row that says uvloop must run on it
            raise SystemExit("uvloop is not installed here")
    chunks, errors = anyio.run(CLIENTS[kind], url, streams, requests, backend_options=options)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    rss_mb = r1.ru_maxrss / 1024
    return {"client": kind, "streams": streams, "chunks": chunks, "errors": errors, "cpu_s": cpu, "wall_s": wall,
            "us_per_chunk": cpu / chunks * 1e6 if chunks else float("nan"), "peak_rss_mb": rss_mb}


# --------------------------------------------------------------------------------------------------------------


def start_server(interval: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--_serve", str(port), "--_interval", str(interval)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise RuntimeError("the SSE server did not start")
    return proc, f"http://127.0.0.1:{port}/v1"


def measure(kind: str, streams: int, requests: int, interval: float) -> dict:
    server, url = start_server(interval)
    try:
        out = subprocess.run([sys.executable, __file__, "--_client", kind, "--_url", url, "--streams", str(streams),
                              "--_requests", str(requests)], capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"{kind} client failed:\n{out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        server.kill()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="256,1536", help="comma-separated concurrent stream counts")
    ap.add_argument("--clients", default="ours,ours-uvloop,aiohttp,openai",
                    help="any of ours,ours-uvloop,aiohttp,openai (all but ours-uvloop on asyncio's own loop)")
    ap.add_argument("--chunks", type=int, default=65536, help="at least this many chunks per measurement")
    ap.add_argument("--step-ms", type=float, default=None,
                    help="server step (one chunk per stream per step); default: streams/25 ms (25k chunks/s)")
    ap.add_argument("--json", action="store_true", help="print our figures as JSON last")
    ap.add_argument("--_serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_interval", type=float, default=0.02, help=argparse.SUPPRESS)
    ap.add_argument("--_client", help=argparse.SUPPRESS)
    ap.add_argument("--_url", help=argparse.SUPPRESS)
    ap.add_argument("--_requests", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._serve:
        serve(a._serve, a._interval, CHUNKS_PER_REQUEST)
        return
    if a._client:
        print(json.dumps(run_client(a._client, a._url, int(a.streams), a._requests)))
        return

    streams_list = [int(x) for x in a.streams.split(",") if x.strip()]
    kinds = [k.strip() for k in a.clients.split(",") if k.strip()]
    results = []
    print(f"{'client':<58} {'streams':>7} {'chunks':>8} {'cpu s':>7} {'wall s':>7} {'us/chunk':>9} {'RSS MB':>7}")
    for streams in streams_list:
        requests = max(1, -(-a.chunks // (streams * CHUNKS_PER_REQUEST)))
        interval = (a.step_ms if a.step_ms is not None else streams / 25.0) / 1000.0
        for kind in kinds:
            r = measure(kind, streams, requests, interval)
            results.append(r)
            flag = "" if not r["errors"] else f"  ({r['errors']} bad replies)"
            print(f"{LABELS[kind]:<58} {streams:>7} {r['chunks']:>8} {r['cpu_s']:>7.2f} {r['wall_s']:>7.2f} "
                  f"{r['us_per_chunk']:>9.1f} {r['peak_rss_mb']:>7.0f}{flag}", flush=True)
    if a.json:
        ours = {r["streams"]: r["us_per_chunk"] for r in results if r["client"] == "ours"}
        print(json.dumps({"us_per_chunk_256": round(ours[256], 2) if 256 in ours else None,
                          "us_per_chunk_1536": round(ours[1536], 2) if 1536 in ours else None}))
    bad = [f"{r['client']} at {r['streams']} streams: {r['errors']}" for r in results if r["errors"]]
    if bad:  # a figure over replies that did not all arrive whole is no figure
        sys.exit("client_overhead: bad replies (" + "; ".join(bad) + "): the figures above are not valid")


if __name__ == "__main__":
    main()
