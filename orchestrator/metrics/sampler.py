"""The sampler: every backend's ``/metrics`` scraped on one absolute schedule, kept as a time series per backend.

A scrape that fails (refused, timed out, not 200, unparsable) leaves a gap in that backend's series and is
counted in ``MetricsSampler.errors``; interpolation bridges it.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import anyio

from ..core.events import MetricsSample
from .counters import GENERATION_NAMES, Counters, metrics_url, parse_metrics
from .latency import HistogramSeries, parse_histograms
from .power import PowerSampler
from .series import (
    CachePoint,
    Point,
    cache_figures,
    counter_increase,
    has_counter,
    recent_rate,
    server_counted,
    unavailable,
)


class MetricsSampler:
    """Scrape every backend's /metrics every ``interval`` seconds on one absolute schedule until cancelled.

    ``series[url]`` is the list of :data:`Point` of that backend, in time order; a failed scrape adds nothing
    (a gap). Each round calls ``on_sample`` with a :class:`MetricsSample` (``t`` the round's end,
    ``tokens`` the summed counter, ``rate_tok_s`` the summed rate over the last ~1 s). A round that overruns
    the interval skips the ticks it missed instead of bunching up. :meth:`next_round` waits for the next one.

    ``metric[url]`` is the generation metric a backend's page carried (None until one did); ``last_failure[url]``
    says, in words, why its last failed scrape failed. :meth:`counted` turns all of it into the ``stats.json``
    figures, naming the backends they cover. ``caches[url]`` keeps each backend's KV fill and prefix-cache
    counters (:meth:`caches_over`); ``histograms[url]`` the snapshots of its latency histograms (TTFT, ITL, end to
    end: :mod:`~orchestrator.metrics.latency`), which :func:`~orchestrator.metrics.readers.readers` reads.

    ``power`` (url -> ``URL[#gpu=LABEL]`` or None, also settable later with :meth:`set_power`): the backends' GPU
    power pages (dcgm-exporter), scraped in the same rounds by a :class:`~orchestrator.metrics.power.PowerSampler`;
    :meth:`power_over` gives the window's watts, joules and tokens per joule.

    Usage::

        sampler = MetricsSampler(["http://gpu1:8000/v1", "http://gpu2:8000/v1"], on_sample=print)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            ...  # the work
            tg.cancel_scope.cancel()
        figures = sampler.counted(t0, t1)
    """

    def __init__(
        self,
        urls: Sequence[str],
        interval: float = 0.5,
        session: aiohttp.ClientSession | None = None,
        on_sample: Callable[[MetricsSample], None] | None = None,
        *,
        timeout: float | None = None,
        power: Mapping[str, str | None] | None = None,
    ):
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.urls: list[str] = list(dict.fromkeys(urls))
        self.interval = float(interval)
        self.timeout = float(timeout) if timeout is not None else max(1.0, 2.0 * self.interval)
        self.on_sample = on_sample
        self._session = session
        self._metrics_urls = {u: metrics_url(u) for u in self.urls}
        self.series: dict[str, list[Point]] = {u: [] for u in self.urls}
        self.errors: dict[str, int] = {u: 0 for u in self.urls}
        self.last_error: dict[str, str | None] = {u: None for u in self.urls}
        self.last_failure: dict[str, str | None] = {u: None for u in self.urls}
        self.metric: dict[str, str | None] = {u: None for u in self.urls}
        self.caches: dict[str, list[CachePoint]] = {u: [] for u in self.urls}
        self.histograms: dict[str, HistogramSeries] = {u: HistogramSeries() for u in self.urls}
        self.power = PowerSampler({u: (power or {}).get(u) for u in self.urls})
        self.rounds = 0
        self.latest: MetricsSample | None = None
        # made by the first waiter (an anyio.Event needs a running event loop), set and dropped by the next round
        self._round_done: anyio.Event | None = None

    def set_power(self, endpoints: Mapping[str, str | None]) -> None:
        """Name the backends' power pages (url -> ``URL[#gpu=LABEL]`` or None); before :meth:`run`."""
        self.power = PowerSampler({u: endpoints.get(u) for u in self.urls})

    async def run(self) -> None:
        """Sample until cancelled. Opens (and closes) its own session when none was given."""
        if self._session is None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                self._session = session
                try:
                    await self._loop()
                finally:
                    self._session = None
        else:
            await self._loop()

    async def _loop(self) -> None:
        start = time.monotonic()
        k = 0
        while True:
            await self.sample_once()
            now = time.monotonic()
            k = max(k + 1, math.floor((now - start) / self.interval) + 1)  # skip missed ticks
            await anyio.sleep(max(0.0, start + k * self.interval - now))

    async def next_round(self) -> MetricsSample:
        """Wait until the next round (of :meth:`run` or :meth:`sample_once`) has finished; return its sample."""
        if self._round_done is None:
            self._round_done = anyio.Event()
        await self._round_done.wait()
        assert self.latest is not None
        return self.latest

    async def sample_once(self) -> MetricsSample:
        """Scrape every backend once, concurrently; record the points, emit and return the round's sample."""
        if self._session is None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                return await self._round(session)
        return await self._round(self._session)

    async def _round(self, session: aiohttp.ClientSession) -> MetricsSample:
        results: dict[str, Counters | None] = {}

        async def one(url: str) -> None:
            results[url] = await self._scrape(session, url)

        async with anyio.create_task_group() as tg:
            for url in self.urls:
                tg.start_soon(one, url)
            if self.power.active:
                tg.start_soon(self.power.round, session, self.timeout)
        t = time.monotonic()
        per_backend: dict[str, dict[str, float | None]] = {}
        total: float | None = None
        rate: float | None = None
        for url in self.urls:
            c = results.get(url)
            if c is None:
                per_backend[url] = {"tokens": None, "running": None, "waiting": None}
                continue
            per_backend[url] = {"tokens": c.generation_tokens, "running": c.running, "waiting": c.waiting}
            if c.generation_tokens is not None:
                total = (total or 0.0) + c.generation_tokens
                r = recent_rate(self.series[url])
                if r is not None:
                    rate = (rate or 0.0) + r
        self.rounds += 1
        sample = MetricsSample(t=t, tokens=total, rate_tok_s=rate, per_backend=per_backend)
        self.latest = sample
        if self._round_done is not None:
            self._round_done.set()
            self._round_done = None
        if self.on_sample is not None:
            self.on_sample(sample)
        return sample

    async def _scrape(self, session: aiohttp.ClientSession, url: str) -> Counters | None:
        t_send = time.monotonic()
        try:
            with anyio.fail_after(self.timeout):
                async with session.get(self._metrics_urls[url]) as resp:
                    if resp.status != 200:
                        raise _ScrapeError(resp.status)
                    text = await resp.text()
            t_recv = time.monotonic()
            counters = parse_metrics(text)
            latency = parse_histograms(text)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, _ScrapeError) as e:
            self.errors[url] += 1
            self.last_error[url] = f"{type(e).__name__}: {e}".rstrip(": ")
            self.last_failure[url] = _failure(e, self.last_error[url])
            return None
        if counters.metric is not None:
            self.metric[url] = counters.metric
        # the counters describe the server somewhere between send and receive: take the midpoint
        point: Point = ((t_send + t_recv) / 2, counters.generation_tokens, counters.running, counters.waiting)
        cache: CachePoint = (point[0], counters.kv_usage, counters.prefix_queries, counters.prefix_hits)
        for points, p in ((self.series[url], point), (self.caches[url], cache)):
            if points and p[0] < points[-1][0]:  # an overlapping sample_once() finished out of order
                bisect.insort(points, p, key=lambda q: q[0])
            else:
                points.append(p)
        self.histograms[url].add(point[0], latency)
        return counters

    # -- coverage ---------------------------------------------------------------------------------------------

    def uncounted_reason(self, url: str) -> str:
        """Why ``url`` adds nothing to the counted figures, in words (for a backend that has no counter)."""
        if self.series[url]:  # it answered, but never with a generation counter
            return f"no generation-token counter on /metrics (looked for {GENERATION_NAMES})"
        return self.last_failure[url] or "/metrics was never scraped"

    def counted(self, t0: float, t1: float) -> dict[str, Any]:
        """The ``stats.json`` ``server_counted`` figures over [t0, t1].

        Either :func:`~orchestrator.metrics.server_counted`'s result (figures, covered and uncovered backends), or
        ``{"available": False, "reason", "uncovered_backends"}`` when nothing could be counted in the window.
        """
        reasons = {u: self.uncounted_reason(u) for u in self.urls if not has_counter(self.series[u])}
        names = {u: m for u, m in self.metric.items() if m is not None}
        figures = server_counted(self.series, t0, t1, names, reasons=reasons)
        if figures is None:
            return unavailable(self.urls, reasons)
        caches = self.caches_over(t0, t1, figures["covered_backends"])
        kv = caches["kv_cache_usage"]
        return {**figures, "kv_cache_usage_peak": kv["max"] if kv else None,
                "prefix_cache_hit_rate": caches["prefix_cache_hit_rate"],
                "prefix_cache_coverage": caches["prefix_cache_coverage"]}

    def caches_over(self, t0: float, t1: float, urls: Sequence[str] | None = None) -> dict[str, Any]:
        """:func:`~orchestrator.metrics.series.cache_figures` over [t0, t1] of ``urls`` (default: every backend)."""
        return cache_figures({u: self.caches[u] for u in (self.urls if urls is None else urls)}, t0, t1)

    def histograms_of(self, urls: Sequence[str] | None = None) -> dict[str, HistogramSeries]:
        """The latency histograms' snapshots (:mod:`~orchestrator.metrics.latency`) of ``urls`` (default: all)."""
        return {u: self.histograms[u] for u in (self.urls if urls is None else urls)}

    def tokens_over(self, t0: float, t1: float) -> dict[str, float]:
        """Each counted backend's server-counted tokens over [t0, t1]."""
        return {u: counter_increase({u: pts}, t0, t1) for u, pts in self.series.items() if has_counter(pts)}

    def power_over(self, t0: float, t1: float) -> dict[str, Any]:
        """The window's power figures (:func:`~orchestrator.metrics.power.power_figures`): W, J, tok/J, coverage."""
        return self.power.figures(t0, t1, self.tokens_over(t0, t1))


class _ScrapeError(Exception):
    """/metrics answered, but not 200."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


def _failure(e: BaseException, detail: str | None) -> str:
    """A failed scrape, in words: the page is missing, unreadable, or the server does not answer."""
    if isinstance(e, _ScrapeError):
        # llama-server answers 501 ("not supported") on /metrics unless started with --metrics
        hint = " (llama-server needs --metrics)" if e.status == 501 else ""
        return f"/metrics answered {e}{hint}"
    if isinstance(e, ValueError):
        return f"/metrics is not Prometheus text the parser reads ({detail})"
    return f"/metrics unreachable ({detail})"
