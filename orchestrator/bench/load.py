"""The bench's load and its measurement: N streams per backend, kept full, read from the servers' counters.

One level of the ladder (:func:`measure_level`):

1. Every backend gets N streaming chat requests at once, all clients on the same absolute start time. Each stream
   starts a new, distinct request (a numbered prompt, so no two share a prefix) the moment its previous one ends:
   N requests stay in flight per backend for the whole level. ``max_tokens`` (512), temperature 0, thinking off.
2. Ramp-up is excluded: the window opens once every backend is full *and* at least ``ramp`` seconds have
   passed since the level began; it lasts ``window`` seconds. Full: every stream has had its first token, or,
   on a server that cannot hold N (it reports requests waiting), every stream it runs has had one.
3. The one :class:`~orchestrator.metrics.MetricsSampler` of the bench samples every backend's /metrics every
   0.5 s on one absolute schedule throughout; the window's figures come from
   :func:`~orchestrator.metrics.server_counted` (interpolated, summed, best second a simultaneous peak).
4. The load is cancelled (its connections closed, so the servers abort the requests) and the bench waits for the
   servers to drain before the next level.

TTFT is client side: the median over the level's requests of send to first content; a request still waiting
for its first token when the load stops counts with its wait so far (a lower bound), so a level the server
cannot hold shows its queueing.

When no server exposes ``vllm:generation_tokens_total`` the level falls back to a client-side estimate (each
request's usage spread evenly between its first token and its end), labelled ``client-estimate``.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anyio
import orjson

from ..errors import BackendError
from ..metrics import GENERATION_METRIC, MetricsSampler, Point, server_counted

PROMPT = (
    "{n}. Request number {n} of a throughput benchmark. Write a long, detailed technical article of about "
    "800 words on software engineering topic number {n}: explain every idea step by step, with examples "
    "and code. Do not stop early."
)


@dataclass
class LoadStats:
    """What the clients saw during one level (client side: only TTFT and the fallback estimate use it)."""

    streams_total: int
    first_seen: set[tuple[int, int]] = field(default_factory=set)
    all_first: anyio.Event = field(default_factory=anyio.Event)
    ttft_s: list[tuple[float, float]] = field(default_factory=list)  # (t_send, ttft)
    spans: list[tuple[float, float, float]] = field(default_factory=list)  # (t_first, t_end, tokens)
    chunk_spans: list[tuple[float, float, int]] = field(default_factory=list)  # cut requests: chunks only
    tokens_per_chunk: list[float] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    last_error: str | None = None
    errors_by_backend: dict[int, int] = field(default_factory=dict)
    last_error_by_backend: dict[int, str] = field(default_factory=dict)

    def saw_first(self, stream: tuple[int, int]) -> None:
        if stream not in self.first_seen:
            self.first_seen.add(stream)
            if len(self.first_seen) >= self.streams_total:
                self.all_first.set()


@dataclass(frozen=True)
class Target:
    url: str  # base URL ending in /v1
    model: str
    api_key: str


async def _stream_once(
    session: aiohttp.ClientSession,
    target: Target,
    n: int,
    max_tokens: int,
    stream: tuple[int, int],
    stats: LoadStats,
) -> None:
    body = orjson.dumps(
        {
            "model": target.model,
            "messages": [{"role": "user", "content": PROMPT.format(n=n)}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {target.api_key}"}
    t_send = time.monotonic()
    t_first: float | None = None
    chunks = 0
    usage_tokens: float | None = None
    try:
        async with session.post(target.url + "/chat/completions", data=body, headers=headers) as resp:
            if resp.status != 200:
                raise _RequestError(f"HTTP {resp.status}: {_error_message(await resp.read())}")
            async for raw in resp.content:
                if not raw.startswith(b"data:"):
                    continue
                payload = raw[5:].strip()
                if payload == b"[DONE]":
                    break
                if b'"completion_tokens"' in payload:
                    u = orjson.loads(payload).get("usage") or {}
                    if u.get("completion_tokens") is not None:
                        usage_tokens = float(u["completion_tokens"])
                        continue
                if t_first is None:
                    choices = orjson.loads(payload).get("choices") or []
                    delta = (choices[0].get("delta") or {}) if choices else {}
                    if not (delta.get("content") or delta.get("reasoning_content")):
                        continue
                    t_first = time.monotonic()
                    stats.ttft_s.append((t_send, t_first - t_send))
                    stats.saw_first(stream)
                chunks += 1
    except anyio.get_cancelled_exc_class():
        if t_first is None:  # still waiting at the window's end: its wait so far is a lower bound of its TTFT
            stats.ttft_s.append((t_send, time.monotonic() - t_send))
        raise
    finally:
        # also on cancellation at the window's end: keep what this request produced for the fallback estimate
        t_end = time.monotonic()
        if t_first is not None:
            if usage_tokens is not None:
                stats.spans.append((t_first, t_end, usage_tokens))
                if chunks:
                    stats.tokens_per_chunk.append(usage_tokens / chunks)
            elif chunks:
                stats.chunk_spans.append((t_first, t_end, chunks))
    if usage_tokens is None and t_first is None:
        raise _RequestError("the stream ended without any content")
    stats.completed += 1


class _RequestError(Exception):
    pass


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body, else the body's start, on one line."""
    try:
        data = orjson.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        msg = (err.get("message") if isinstance(err, dict) else None) or (
            data.get("message") if isinstance(data, dict) else None
        )
        if isinstance(msg, str) and msg:
            return " ".join(msg.split())[:300]
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return " ".join(body[:200].decode("utf-8", "replace").split())


async def _stream_worker(
    session: aiohttp.ClientSession,
    target: Target,
    numbers: itertools.count,
    max_tokens: int,
    stream: tuple[int, int],
    stats: LoadStats,
) -> None:
    while True:
        try:
            await _stream_once(session, target, next(numbers), max_tokens, stream, stats)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, _RequestError) as e:
            stats.errors += 1
            what = str(e) if isinstance(e, _RequestError) else f"{type(e).__name__}: {e}".rstrip(": ")
            stats.last_error = f"{target.url}: {what}"
            stats.errors_by_backend[stream[0]] = stats.errors_by_backend.get(stream[0], 0) + 1
            stats.last_error_by_backend[stream[0]] = stats.last_error
            await anyio.sleep(0.2)  # a failing server is not hammered in a tight loop


def _fail_if_every_request_fails(stats: LoadStats, targets: Sequence[Target], streams: int) -> None:
    """A backend whose every stream has failed at least twice, and none has had a token, is not worth waiting for."""
    for bi, target in enumerate(targets):
        errors = stats.errors_by_backend.get(bi, 0)
        if errors >= 2 * streams and not any(b == bi for b, _ in stats.first_seen):
            reason = stats.last_error_by_backend.get(bi, "").removeprefix(target.url + ": ")
            raise BackendError(f"backend {target.url} fails every request: {reason}")


def _saturated(
    stats: LoadStats, sampler: MetricsSampler, targets: Sequence[Target], streams: int, t_level: float
) -> bool:
    """Every backend is full: all its streams have had a first token, or (a server that cannot hold them all)
    it reports requests waiting and at least as many of its streams have had a first token as it runs."""
    firsts = [0] * len(targets)
    for bi, _ in stats.first_seen:
        firsts[bi] += 1
    for bi, target in enumerate(targets):
        if firsts[bi] >= streams:
            continue
        points = sampler.series.get(target.url)
        if not points or points[-1][0] <= t_level:
            return False
        _, _, running, waiting = points[-1]
        if not (waiting and waiting > 0 and running and firsts[bi] >= running):
            return False
    return True


def _median_gauge(points: Sequence[Point], t0: float, t1: float, index: int) -> float | None:
    vals = [p[index] for p in points if t0 <= p[0] <= t1 and p[index] is not None]
    return float(statistics.median(vals)) if vals else None


def _client_estimate_series(stats: LoadStats) -> dict[str, list[Point]]:
    """A cumulative token curve from the clients: each request's tokens spread evenly over its stream."""
    tpc = statistics.median(stats.tokens_per_chunk) if stats.tokens_per_chunk else 1.0
    spans = list(stats.spans) + [(a, b, c * tpc) for a, b, c in stats.chunk_spans]
    if not spans:
        return {}
    t_lo = min(s[0] for s in spans)
    t_hi = max(s[1] for s in spans)
    step = 0.1
    points: list[Point] = []
    k = 0
    while True:
        t = min(t_lo + k * step, t_hi)
        total = 0.0
        for a, b, tok in spans:
            if t >= b:
                total += tok
            elif t > a:
                total += tok * (t - a) / (b - a)
        points.append((t, total, None, None))
        if t >= t_hi:
            break
        k += 1
    return {"client": points}


async def measure_level(
    *,
    targets: Sequence[Target],
    streams: int,
    window: float,
    ramp: float,
    max_tokens: int,
    sampler: MetricsSampler,
    numbers: itertools.count,
    ramp_timeout: float = 300.0,
) -> dict[str, Any]:
    """Run one level and return its figures (the ``ladder.json`` level keys plus a few extra ones)."""
    k = len(targets)
    stats = LoadStats(streams_total=streams * k)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=max(120.0, 4 * window))
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        anyio.create_task_group() as tg,
    ):
        t_level = time.monotonic()
        for bi, target in enumerate(targets):
            for si in range(streams):
                tg.start_soon(_stream_worker, session, target, numbers, max_tokens, (bi, si), stats)
        with anyio.move_on_after(ramp_timeout):
            while not stats.all_first.is_set() and not _saturated(stats, sampler, targets, streams, t_level):
                _fail_if_every_request_fails(stats, targets, streams)
                await anyio.sleep(0.05)
        if not (stats.all_first.is_set() or _saturated(stats, sampler, targets, streams, t_level)):
            tg.cancel_scope.cancel()
            raise BackendError(
                f"at {streams} streams per backend only {len(stats.first_seen)} of {streams * k} streams "
                f"got a first token within {ramp_timeout:.0f} s"
                + (f" (last error: {stats.last_error})" if stats.last_error else "")
            )
        t0 = max(time.monotonic(), t_level + ramp)
        await anyio.sleep(t0 - time.monotonic() + window)
        t1 = time.monotonic()
        # the window's end must be bracketed by a sample of every server before the load stops
        await _sample_after(sampler, [x.url for x in targets], t1)
        tg.cancel_scope.cancel()

    # each server's own counter name (vLLM, SGLang, llama.cpp, TGI), as the sampler found it
    names = {u: m for u, m in sampler.metric.items() if m}
    figures = server_counted(sampler.series, t0, t1, names or GENERATION_METRIC)
    if figures is None:
        figures = server_counted(_client_estimate_series(stats), t0, t1, "client-estimate")
    if figures is None:
        raise BackendError(
            f"no tokens measured at {streams} streams per backend"
            + (f" (last error: {stats.last_error})" if stats.last_error else "")
        )
    sustained = figures["sustained_tok_s"]
    best = figures["best_second_tok_s"]
    running: float | None = None
    waiting: float | None = None
    per_backend: list[dict[str, Any]] = []
    for target in targets:
        points = sampler.series.get(target.url, [])
        r = _median_gauge(points, t0, t1, 2)
        w = _median_gauge(points, t0, t1, 3)
        if r is not None:
            running = (running or 0.0) + r
        if w is not None:
            waiting = (waiting or 0.0) + w
        own = server_counted({target.url: points}, t0, t1) if len(targets) > 1 else None
        per_backend.append(
            {
                "url": target.url,
                "sustained_tok_s": round(own["sustained_tok_s"], 1) if own else None,
                "best_second_tok_s": round(own["best_second_tok_s"], 1) if own else None,
                "running": r,
                "waiting": w,
            }
        )
    ttfts = [ttft for t_send, ttft in stats.ttft_s if t_send <= t1]
    per_stream = sustained / (streams * k) if sustained > 0 else 0.0
    return {
        "streams": streams,
        "sustained_tok_s": round(sustained, 1),
        "best_second_tok_s": round(best, 1),
        "per_stream_tok_s": round(per_stream, 2),
        "step_ms": round(1000.0 / per_stream, 3) if per_stream > 0 else None,
        "ttft_median_ms": round(1000.0 * statistics.median(ttfts), 1) if ttfts else None,
        "running": running,
        "waiting": waiting,
        "held": not (waiting is not None and waiting > 0),
        "window_s": round(t1 - t0, 3),
        "requests_completed": stats.completed,
        "request_errors": stats.errors,
        "metric": figures["metric"],
        "per_backend": per_backend if len(targets) > 1 else None,
    }


async def _sample_after(sampler: MetricsSampler, urls: Sequence[str], t: float, limit: float = 5.0) -> None:
    """Wait (bounded) until every server that has ever answered a scrape has a sample later than ``t``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if all(not sampler.series.get(u) or sampler.series[u][-1][0] > t for u in urls):
            return
        await anyio.sleep(0.02)


async def wait_drained(sampler: MetricsSampler, urls: Sequence[str], limit: float = 60.0) -> bool:
    """Wait until every server's gauges say nothing runs or waits (servers without gauges: a short pause)."""
    deadline = time.monotonic() + limit
    t_start = time.monotonic()
    while time.monotonic() < deadline:
        await anyio.sleep(sampler.interval / 2)
        latest = sampler.latest
        if latest is None or latest.t <= t_start:
            continue
        busy = False
        known = False
        for url in urls:
            pb = latest.per_backend.get(url) or {}
            r, w = pb.get("running"), pb.get("waiting")
            if r is not None or w is not None:
                known = True
                if (r or 0) > 0 or (w or 0) > 0:
                    busy = True
        if not known:
            await anyio.sleep(1.0)
            return True
        if not busy:
            return True
    return False
