"""The bench's load: N streams per backend, kept full, through the job's own client (:mod:`orchestrator.client`).

1. Every backend gets N streaming chat requests at once, all clients on the same absolute start time. Each stream
   starts a new, distinct request (a numbered prompt, so no two share a prefix) the moment its previous one ends:
   N requests stay in flight per backend for the whole level. ``max_tokens`` (512), temperature 0, thinking off
   (the body :meth:`BackendClient.body <orchestrator.client.BackendClient.body>` makes for every job request).
2. The level is full once every backend is: every stream has had its first token, or, on a server that cannot
   hold N (it reports requests waiting), every stream it runs has had one (:func:`wait_full`).
3. Cancelling the load closes its connections (one client per backend per level), so the servers abort the
   requests.

What the clients see is secondary: TTFT and, when no server exposes a token counter, the fallback estimate. TTFT
is the time from send to first content; a request still waiting for its first token when the load stops counts
with its wait so far (a lower bound), so a level the server cannot hold shows its queueing. The estimate spreads
each request's usage evenly between its first token and its end (:func:`client_estimate_series`).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from ..core.config import Backend
from ..core.errors import BackendError
from ..core.reply import ANSWERS, Reply
from ..metrics import MetricsSampler, Point
from ..wire.client import BackendClient

PROMPT = (
    "{n}. Request number {n} of a throughput benchmark. Write a long, detailed technical article of about "
    "800 words on software engineering topic number {n}: explain every idea step by step, with examples "
    "and code. Do not stop early."
)
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Target:
    """One backend under load and the model its requests name."""

    backend: Backend
    model: str

    @property
    def url(self) -> str:
        return self.backend.url


class LoadStats:
    """What the clients saw during one level (client side: only TTFT and the fallback estimate use it).

    Streams are named ``(backend index, stream index)``. :meth:`changed` wakes up whoever waits for the level to
    fill whenever something it looks at moves: a first token, a failure, or (through :func:`wait_full`) a round
    of the sampler.
    """

    def __init__(self, streams_total: int):
        self.streams_total = streams_total
        self.first_seen: set[tuple[int, int]] = set()
        self.ttft_s: list[tuple[float, float]] = []  # (t_send, ttft)
        self.spans: list[tuple[float, float, float]] = []  # (t_first, t_end, tokens)
        self.chunk_spans: list[tuple[float, float, int]] = []  # cut requests: chunks only
        self.tokens_per_chunk: list[float] = []
        self.completed = 0
        self.errors = 0
        self.last_error: str | None = None
        self.errors_by_backend: dict[int, int] = {}
        self.last_error_by_backend: dict[int, str] = {}
        self._change: anyio.Event | None = None

    @property
    def all_first(self) -> bool:
        return len(self.first_seen) >= self.streams_total

    def saw_first(self, stream: tuple[int, int], t_send: float, t_first: float) -> None:
        self.ttft_s.append((t_send, t_first - t_send))
        if stream not in self.first_seen:
            self.first_seen.add(stream)
            self.poke()

    def failed(self, backend: int, error: str) -> None:
        self.errors += 1
        self.last_error = error
        self.errors_by_backend[backend] = self.errors_by_backend.get(backend, 0) + 1
        self.last_error_by_backend[backend] = error
        self.poke()

    def ended(self, t_first: float | None, t_end: float, usage_tokens: int, chunks: int) -> None:
        """A request ended (also when the load stopped it): keep what it produced for the fallback estimate."""
        if t_first is None:
            return
        if usage_tokens:
            self.spans.append((t_first, t_end, float(usage_tokens)))
            if chunks:
                self.tokens_per_chunk.append(usage_tokens / chunks)
        elif chunks:
            self.chunk_spans.append((t_first, t_end, chunks))

    def poke(self) -> None:
        if self._change is not None:
            self._change.set()
            self._change = None

    async def changed(self) -> None:
        if self._change is None:
            self._change = anyio.Event()
        await self._change.wait()


def client_for(target: Target, window: float) -> BackendClient:
    """The level's client for one backend. A stream is given up after 2 minutes of silence, or four windows when
    that is longer: a request queued behind the others may wait a whole level for its first token."""
    silence = max(120.0, 4 * window)
    return BackendClient(target.backend, target.model, connect_timeout=CONNECT_TIMEOUT_S,
                         first_token_timeout=silence, chunk_timeout=silence)


async def _request(
    client: BackendClient, n: int, max_tokens: int, stream: tuple[int, int], stats: LoadStats
) -> tuple[Reply, int]:
    """One request; returns its reply and how many content chunks it streamed."""
    body = client.body([{"role": "user", "content": PROMPT.format(n=n)}], max_tokens=max_tokens, temperature=0)
    t_send = time.monotonic()
    t_first: float | None = None
    chunks = 0
    usage = 0

    def on_delta(_text: str) -> None:
        nonlocal t_first, chunks
        if t_first is None:
            t_first = time.monotonic()
            stats.saw_first(stream, t_send, t_first)
        chunks += 1

    try:
        reply = await client.chat(body, on_delta=on_delta)
        usage = reply.completion_tokens
        return reply, chunks
    except anyio.get_cancelled_exc_class():
        if t_first is None:  # still waiting at the window's end: its wait so far is a lower bound of its TTFT
            stats.ttft_s.append((t_send, time.monotonic() - t_send))
        raise
    finally:
        # also on cancellation at the window's end
        stats.ended(t_first, time.monotonic(), usage, chunks)


async def stream_worker(
    client: BackendClient,
    numbers: itertools.count,
    max_tokens: int,
    stream: tuple[int, int],
    stats: LoadStats,
) -> None:
    """Keep one stream full: a new request the moment the last one ends, until cancelled."""
    while True:
        reply, chunks = await _request(client, next(numbers), max_tokens, stream, stats)
        # An answer with tokens counts, words or not ("length" is the usual end here: the token cap).
        if reply.finish_reason in ANSWERS and (reply.completion_tokens or chunks):
            stats.completed += 1
            continue
        stats.failed(stream[0], f"{client.url}: {reply.error or 'the stream ended without any content'}")
        await anyio.sleep(0.2)  # a failing server is not hammered in a tight loop


def _fail_if_every_request_fails(stats: LoadStats, targets: Sequence[Target], streams: int) -> None:
    """A backend whose every stream has failed at least twice, and none has had a token, is not worth waiting for."""
    for bi, target in enumerate(targets):
        errors = stats.errors_by_backend.get(bi, 0)
        if errors >= 2 * streams and not any(b == bi for b, _ in stats.first_seen):
            reason = stats.last_error_by_backend.get(bi, "").removeprefix(target.url + ": ")
            raise BackendError(f"backend {target.url} fails every request: {reason}")


def saturated(
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


async def wait_full(
    stats: LoadStats, sampler: MetricsSampler, targets: Sequence[Target], streams: int, t_level: float
) -> None:
    """Wait until the level is full; raise BackendError for a backend that fails every request. Only a
    first token, a failure or a sampler round can change the answer, so it is looked at after each of them."""

    async def poke_each_round() -> None:
        while True:
            await sampler.next_round()
            stats.poke()

    async with anyio.create_task_group() as tg:
        tg.start_soon(poke_each_round)
        while not (stats.all_first or saturated(stats, sampler, targets, streams, t_level)):
            _fail_if_every_request_fails(stats, targets, streams)
            await stats.changed()
        tg.cancel_scope.cancel()


def client_estimate_series(stats: LoadStats) -> dict[str, list[Point]]:
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
