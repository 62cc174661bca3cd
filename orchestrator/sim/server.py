"""One simulated card: an aiohttp server speaking the OpenAI API (as vLLM does) over one :class:`Engine`.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (streaming or not), ``GET /metrics`` (Prometheus
text with vLLM's metric names, :mod:`.metrics`), ``GET /health``, ``GET /sim/stats`` and ``POST /sim/reset_max``.

Per-chunk cost is kept low: chunk JSON is assembled from pre-serialised bytes around ``orjson.dumps(content)``
and written straight to the response. Faults (500, 429, empty answers, cut streams, hangs) are drawn per request
by :mod:`.faults`; going down and coming back up is a timer here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from dataclasses import asdict, dataclass, field

import orjson
from aiohttp import hdrs, web

from . import text as simtext
from .chat import Ask, Reply, chunk_tail, error, read_ask
from .engine import Engine, EngineConfig, Stream
from .faults import Faults
from .metrics import CardMetrics
from .power import dcgm_text
from .prefix import prompt_blocks

__all__ = ["Card", "SimConfig"]


@dataclass(frozen=True)
class SimConfig:
    """Everything one card needs. ``engine`` holds the engine model; the rest is API behaviour and faults."""

    model: str = "sim-qwen3"
    engine: EngineConfig = field(default_factory=EngineConfig)
    json_schema: bool = True
    max_model_len: int = 32768
    fail_rate: float = 0.0
    rate_limit_rate: float = 0.0
    empty_rate: float = 0.0
    drop_rate: float = 0.0
    hang_rate: float = 0.0
    retry_after: float = 1.0
    down_after: float | None = None
    down_for: float | None = None
    down_cards: tuple[int, ...] | None = None  # cards --down-after applies to (None: all)
    fault_seed: int | None = None
    seed: int | None = None

    def fault_rates(self) -> tuple[float, ...]:
        return (self.fail_rate, self.rate_limit_rate, self.empty_rate, self.drop_rate, self.hang_rate)


def _noop(_s: Stream) -> None:
    return None


class Card:
    """One simulated GPU server on ``host:port``."""

    def __init__(self, index: int, port: int, cfg: SimConfig, host: str = "127.0.0.1"):
        self.index = index
        self.port = port
        self.host = host
        self.cfg = cfg
        self.engine = Engine(cfg.engine)
        self._metrics = CardMetrics(self)
        self.faults = Faults(cfg.fault_rates(), cfg.fault_seed, index)
        self._model_json = orjson.dumps(cfg.model)
        self.requests = 0
        self.streamed = 0  # chat requests that asked for a stream (the rest asked for one whole response)
        self.completed = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.finished = {"stop": 0, "length": 0}
        self.completion_tokens = 0  # as reported in usage of completed requests
        self.down = False
        self.down_count = 0
        self._active: dict[int, web.BaseRequest] = {}
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._timers: list[asyncio.Task] = []
        self._t0 = time.monotonic()
        self._created = int(time.time())

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def power_url(self) -> str:
        """The card's dcgm-exporter-like page and its GPU label, as ``--power`` takes it."""
        return f"http://{self.host}:{self.port}/dcgm/metrics#gpu={self.index}"

    # -- lifecycle --------------------------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/dcgm/metrics", self.dcgm)
        app.router.add_get("/health", self.health)
        app.router.add_get("/sim/stats", self.stats_handler)
        app.router.add_post("/sim/reset_max", self.reset_max)
        return app

    async def start(self) -> str:
        self.engine.start()
        self._runner = web.AppRunner(self.make_app(), access_log=None, handler_cancellation=True,
                                     shutdown_timeout=0.5, keepalive_timeout=75.0)
        await self._runner.setup()
        await self._listen()
        self._t0 = time.monotonic()
        cfg = self.cfg
        if cfg.down_after is not None and (cfg.down_cards is None or self.index in cfg.down_cards):
            self._timers.append(asyncio.get_running_loop().create_task(self._down_timer(cfg.down_after)))
        return self.url

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self.host, self.port, backlog=4096, reuse_address=True)
        await self._site.start()

    async def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        self._abort_all()
        await self.engine.close()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()

    async def _down_timer(self, after: float) -> None:
        cfg = self.cfg
        await asyncio.sleep(after)
        await self.go_down()
        if cfg.down_for is not None:
            await asyncio.sleep(cfg.down_for)
            await self.come_up()

    async def go_down(self) -> None:
        """Stop listening and drop every connection, in flight or idle."""
        self.down = True
        self.down_count += 1
        if self._site is not None:
            with contextlib.suppress(Exception):
                await self._site.stop()
            self._site = None
        self._abort_all()
        self.engine.drop_all()

    async def come_up(self) -> None:
        self.down = False
        await self._listen()

    def _abort_all(self) -> None:
        for req in list(self._active.values()):
            tr = req.transport
            if tr is not None:
                tr.abort()
        self._active.clear()
        if self._runner is not None and self._runner.server is not None:
            for conn in list(self._runner.server.connections):
                tr = conn.transport
                if tr is not None:
                    tr.abort()

    # -- small endpoints --------------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        body = {"object": "list", "data": [{
            "id": self.cfg.model, "object": "model", "created": self._created, "owned_by": "vllm",
            "root": self.cfg.model, "parent": None, "max_model_len": self.cfg.max_model_len, "permission": []}]}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.text(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def dcgm(self, request: web.Request) -> web.Response:
        return web.Response(body=dcgm_text(self.index, self.engine.power, self.engine.running, self.host),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def stats(self) -> dict:
        e = self.engine
        cfg = asdict(self.cfg)
        return {
            "card": self.index, "url": self.url, "power_url": self.power_url, "model": self.cfg.model,
            "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
            "requests": self.requests, "completed": self.completed, "streamed": self.streamed,
            "generation_tokens": e.generation_tokens, "prompt_tokens": e.prompt_tokens,
            "completion_tokens_reported": self.completion_tokens,
            "running": e.running, "waiting": e.num_waiting, "kv_used": e.kv_used,
            **e.cache_stats(),
            "finished": dict(self.finished), "faults": dict(self.faults.counts),
            "steps": e.steps, "busy_s": e.busy_s, "late_s": e.late_s, "resyncs": e.resyncs,
            "energy_mj": e.power.energy_mj,
            "uptime_s": time.monotonic() - self._t0, "time_scale": self.cfg.engine.time_scale,
            "model_time_s": (time.monotonic() - self._t0) / self.cfg.engine.time_scale,
            "process_cpu_s": time.process_time(), "pid": os.getpid(),
            "down": self.down, "down_count": self.down_count, "config": cfg,
        }

    async def stats_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.stats()), content_type="application/json")

    async def reset_max(self, request: web.Request) -> web.Response:
        self.max_in_flight = self.in_flight
        return web.Response(body=orjson.dumps(self.stats()), content_type="application/json")

    # -- chat completions -------------------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self._active[id(request)] = request
        try:
            return await self._chat(request)
        finally:
            self.in_flight -= 1
            self._active.pop(id(request), None)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return error(400, "request body is not valid JSON", "BadRequestError")
        ask = read_ask(body, self.cfg.model, self.cfg.json_schema, self.cfg.max_model_len)
        if isinstance(ask, web.Response):
            return ask
        fault = self.faults.draw()
        refused = await self._refuse(fault)
        if refused is not None:
            return refused
        r = self._reply(ask, fault)
        if ask.stream:
            self.streamed += 1
        try:
            if ask.stream:
                return await self._stream(request, r)
            return await self._whole(request, r)
        except ConnectionError:  # the client went away while we wrote
            raise asyncio.CancelledError from None
        finally:
            if r.s is not None and not r.s.done:
                self.engine.cancel(r.s)

    async def _refuse(self, fault: str | None) -> web.Response | None:
        """The answer of a request failed by ``fault`` (an error, or a hang: never answered), or None."""
        if fault == "fail":
            return error(500, "simulated internal server error", "InternalServerError")
        if fault == "rate_limit":
            ra = self.cfg.retry_after
            ra_s = str(int(ra)) if float(ra).is_integer() else f"{ra:g}"
            return error(429, "simulated rate limit: too many requests", "RateLimitError",
                         headers={"Retry-After": ra_s})
        if fault == "hang":
            await asyncio.get_running_loop().create_future()  # until the client (or the card) goes away
        return None

    def _reply(self, ask: Ask, fault: str | None) -> Reply:
        """What the request gets: its answer cut at max_tokens (none for an "empty" fault), and where a "drop"
        fault cuts the connection."""
        answer = simtext.answer(self.cfg.model, ask.body, self.cfg.seed)
        pieces = answer.pieces
        if fault == "empty":
            pieces = ()
            n, finish = 0, "stop"
        else:
            n = min(len(pieces), ask.max_tokens)
            finish = "length" if len(pieces) > ask.max_tokens else "stop"
            if n == 0:
                finish = "stop"
        drop_at = None
        if fault == "drop":
            drop_at = self.faults.drop_point(n)
        rid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        s = Stream(ask.prompt_tokens, n, self._blocks(ask)) if n > 0 else None
        return Reply(s, pieces, n, finish, rid, created, ask.prompt_tokens, ask.include_usage,
                     ask.continuous_usage, drop_at)

    def _blocks(self, ask: Ask) -> tuple[bytes, ...]:
        """The hashes of the prompt's full blocks, for the prefix cache (none without it: nothing to look up)."""
        eng = self.cfg.engine
        if not eng.prefix_caching:
            return ()
        return prompt_blocks(ask.body["messages"], ask.prompt_tokens, eng.block_size)

    def _finish(self, finish: str, n: int) -> None:
        self.completed += 1
        self.finished[finish] += 1
        self.completion_tokens += n

    def _cut(self, request: web.Request) -> None:
        tr = request.transport
        if tr is not None:
            tr.abort()
        raise asyncio.CancelledError  # the connection is gone; nothing more to send

    async def _whole(self, request: web.Request, r: Reply) -> web.Response:
        s, pieces, n, finish, drop_at = r.s, r.pieces, r.n, r.finish, r.drop_at
        if s is not None:
            if drop_at is not None:
                def sink(st: Stream) -> None:
                    if st.count >= drop_at:
                        st._wake()
                s.sink = sink
            else:
                s.sink = _noop
            self.engine.submit(s)
            while not s.done:
                if s.cancelled or (drop_at is not None and s.count >= drop_at):
                    self._cut(request)
                await s.wait()
            if s.cancelled:
                self._cut(request)
        if drop_at is not None:
            self._cut(request)
        prompt_tokens = r.prompt_tokens
        body = {
            "id": r.rid, "object": "chat.completion", "created": r.created, "model": self.cfg.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(pieces[:n]),
                                                 "reasoning_content": None, "tool_calls": []},
                         "logprobs": None, "finish_reason": finish, "stop_reason": None}],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n,
                      "completion_tokens": n, "prompt_tokens_details": None},
        }
        self._finish(finish, n)
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _stream(self, request: web.Request, r: Reply) -> web.StreamResponse:
        s, pieces, n, finish, rid, created, drop_at = r.s, r.pieces, r.n, r.finish, r.rid, r.created, r.drop_at
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        pre = (b'data: {"id":"' + rid.encode() + b'","object":"chat.completion.chunk","created":'
               + str(created).encode() + b',"model":' + self._model_json + b',"choices":[{"index":0,"delta":')
        tail = chunk_tail(finish, r.prompt_tokens, r.continuous_usage)
        await resp.write(pre + b'{"role":"assistant","content":""}' + tail(0, False))  # also flushes the headers
        if s is not None:
            # The sink writes to the socket itself, framed as prepare() chose: chunked exactly when it said so in
            # the headers it sent (HTTP/1.1 without a length), plain for HTTP/1.0 (the connection then closes).
            chunked = resp.headers.get(hdrs.TRANSFER_ENCODING) == "chunked"
            tr = request.transport
            if tr is None or tr.is_closing():
                raise asyncio.CancelledError
            dumps = orjson.dumps
            state = {"sent": 0, "dead": False}

            def sink(st: Stream) -> None:
                # Runs inside the engine's step: write the new tokens straight to the socket (no task switch).
                c = st.count
                sent = state["sent"]
                if c <= sent or state["dead"]:
                    return
                if tr.is_closing():
                    state["dead"] = True
                    st._wake()
                    return
                last = st.done and c >= n
                if drop_at is not None and c >= drop_at:
                    c, last = drop_at, False
                    state["dead"] = True
                data = pre + b'{"content":' + dumps("".join(pieces[sent:c])) + b"}" + tail(c, last)
                state["sent"] = c
                if chunked:
                    tr.write(b"%x\r\n%b\r\n" % (len(data), data))
                else:
                    tr.write(data)
                if state["dead"]:
                    tr.abort()
                    st._wake()

            s.sink = sink
            self.engine.submit(s)
            while not (s.done and state["sent"] >= n):
                if state["dead"] or s.cancelled:
                    self._cut(request)
                await s.wait()
        else:
            await resp.write(pre + b'{"content":""}' + tail(0, True))
        if r.include_usage:
            usage = {"prompt_tokens": r.prompt_tokens, "total_tokens": r.prompt_tokens + n, "completion_tokens": n}
            await resp.write(b'data: {"id":"' + rid.encode() + b'","object":"chat.completion.chunk","created":'
                             + str(created).encode() + b',"model":' + self._model_json + b',"choices":[],"usage":'
                             + orjson.dumps(usage) + b"}\n\n")
        await resp.write(b"data: [DONE]\n\n")
        self._finish(finish, n)
        await resp.write_eof()
        return resp
