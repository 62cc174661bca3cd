"""Server-counted measurement: sample every backend's ``/metrics``, interpolate, sum.

The figures a job or a bench reports come from the servers' own counters (``vllm:generation_tokens_total``),
never from client-side timing. Three pieces:

* :func:`parse_metrics` reads one Prometheus text exposition into :class:`Counters` (summed over label sets).
* :class:`MetricsSampler` scrapes every backend on one absolute 0.5 s schedule and keeps a time series per
  backend; each round it emits a :class:`~orchestrator.events.MetricsSample`.
* :func:`server_counted` / :func:`counter_increase` turn those series into sustained and best-second rates.

Series math. Each backend's counter is first made monotone (a drop means the server restarted: counting resumes
from the new value, as Prometheus' ``increase`` does), then linearly interpolated between its samples and held
constant outside them (a server that stops answering adds nothing). Backends are summed on one common timeline:
the union of all sample times. Because every interpolated counter is piecewise linear, the 1 s increase
``C(s+1) - C(s)`` of the sum is piecewise linear in ``s`` with breakpoints at the sample times and at the
sample times minus one second, so evaluating it there finds the exact largest increase over any 1 s span: a
simultaneous peak of the fleet, not a sum of separate per-server peaks.

A scrape that fails (refused, timed out, not 200, unparsable) leaves a gap in that backend's series and is
counted in ``MetricsSampler.errors``; interpolation bridges it.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
from prometheus_client.parser import text_string_to_metric_families

from .events import MetricsSample

__all__ = [
    "GENERATION_METRIC",
    "PROMPT_METRIC",
    "RUNNING_METRIC",
    "WAITING_METRIC",
    "Counters",
    "MetricsSampler",
    "Point",
    "counter_increase",
    "metrics_url",
    "parse_metrics",
    "server_counted",
]

GENERATION_METRIC = "vllm:generation_tokens_total"
PROMPT_METRIC = "vllm:prompt_tokens_total"
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"

_WANTED = {
    GENERATION_METRIC: "generation_tokens",
    PROMPT_METRIC: "prompt_tokens",
    RUNNING_METRIC: "running",
    WAITING_METRIC: "waiting",
}

Point = tuple[float, float | None, float | None, float | None]
"""One sample of one backend: (t = time.monotonic(), tokens, running, waiting); None where the server lacks it."""


@dataclass(frozen=True)
class Counters:
    """What one /metrics scrape says, each value summed over its label sets; None where the metric is absent."""

    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    running: float | None = None
    waiting: float | None = None


def _relevant_lines(text: str) -> str:
    """Keep only the lines of the four metrics we read (and their HELP/TYPE lines).

    A vLLM exposition is hundreds of lines, mostly histogram buckets; the pure-Python parser is the costly part
    of a scrape, so it only sees what we use. Names are matched exactly, never by prefix.
    """
    keep: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in _WANTED:
                keep.append(line)
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if brace != -1 and (space == -1 or brace < space) else space
        if (line[:end] if end != -1 else line) in _WANTED:
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> Counters:
    """Parse a Prometheus text exposition (vLLM's names) into :class:`Counters`.

    Uses ``prometheus_client.parser.text_string_to_metric_families`` on the relevant lines only. Every value is
    the sum over its label sets (several engines or models behind one server add up). Raises ``ValueError`` on
    text the parser rejects.
    """
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(_relevant_lines(text)):
        for sample in family.samples:
            field_name = _WANTED.get(sample.name)
            if field_name is None or math.isnan(sample.value):
                continue
            sums[field_name] = sums.get(field_name, 0.0) + float(sample.value)
    return Counters(**sums)


def metrics_url(base_url: str) -> str:
    """``http://h:p/v1`` -> ``http://h:p/metrics`` (the base URL without its trailing /v1, plus /metrics)."""
    u = base_url.rstrip("/")
    u = u.removesuffix("/v1")
    return u + "/metrics"


class MetricsSampler:
    """Scrape every backend's /metrics every ``interval`` seconds on one absolute schedule until cancelled.

    ``series[url]`` is the list of :data:`Point` of that backend, in time order; a failed scrape adds nothing
    (a gap). Each round calls ``on_sample`` with a :class:`MetricsSample` (``t`` the round's end,
    ``tokens`` the summed counter, ``rate_tok_s`` the summed rate over the last ~1 s). A round that overruns
    the interval skips the ticks it missed instead of bunching up.

    Usage::

        sampler = MetricsSampler(["http://gpu1:8000/v1", "http://gpu2:8000/v1"], on_sample=print)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            ...  # the work
            tg.cancel_scope.cancel()
        figures = server_counted(sampler.series, t0, t1)
    """

    def __init__(
        self,
        urls: Sequence[str],
        interval: float = 0.5,
        session: aiohttp.ClientSession | None = None,
        on_sample: Callable[[MetricsSample], None] | None = None,
        *,
        timeout: float | None = None,
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
        self.rounds = 0
        self.latest: MetricsSample | None = None

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
                r = _recent_rate(self.series[url])
                if r is not None:
                    rate = (rate or 0.0) + r
        self.rounds += 1
        sample = MetricsSample(t=t, tokens=total, rate_tok_s=rate, per_backend=per_backend)
        self.latest = sample
        if self.on_sample is not None:
            self.on_sample(sample)
        return sample

    async def _scrape(self, session: aiohttp.ClientSession, url: str) -> Counters | None:
        t_send = time.monotonic()
        try:
            with anyio.fail_after(self.timeout):
                async with session.get(self._metrics_urls[url]) as resp:
                    if resp.status != 200:
                        raise _ScrapeError(f"HTTP {resp.status}")
                    text = await resp.text()
            t_recv = time.monotonic()
            counters = parse_metrics(text)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, _ScrapeError) as e:
            self.errors[url] += 1
            self.last_error[url] = f"{type(e).__name__}: {e}".rstrip(": ")
            return None
        # the counters describe the server somewhere between send and receive: take the midpoint
        point: Point = ((t_send + t_recv) / 2, counters.generation_tokens, counters.running, counters.waiting)
        points = self.series[url]
        if points and point[0] < points[-1][0]:  # an overlapping sample_once() finished out of order
            bisect.insort(points, point, key=lambda p: p[0])
        else:
            points.append(point)
        return counters


class _ScrapeError(Exception):
    pass


def _recent_rate(points: list[Point], span: float = 1.0) -> float | None:
    """Rate of a backend's counter over its last ~``span`` seconds (reset-aware); None without two points."""
    if len(points) < 2 or points[-1][1] is None:
        return None
    t_last = points[-1][0]
    i = len(points) - 1
    while i > 0 and t_last - points[i][0] < span - 1e-6:
        i -= 1
    t_then, v_then = points[i][0], points[i][1]
    if v_then is None or t_last <= t_then:
        return None
    inc = 0.0
    prev = v_then
    for p in points[i + 1 :]:
        v = p[1]
        if v is None:
            continue
        inc += v - prev if v >= prev else v
        prev = v
    return inc / (t_last - t_then)


# --------------------------------------------------------------------------------------------- series math


def _monotone(points: Iterable[Point]) -> tuple[list[float], list[float]]:
    """(times, adjusted counter values) of the points that carry the counter; resets are stitched over."""
    ts: list[float] = []
    vs: list[float] = []
    prev: float | None = None
    acc = 0.0
    for p in sorted((p for p in points if p[1] is not None), key=lambda p: p[0]):
        v = float(p[1])  # type: ignore[arg-type]
        if prev is None:
            acc = v
        else:
            acc += v - prev if v >= prev else v  # a drop is a restart from zero
        prev = v
        if ts and p[0] == ts[-1]:
            vs[-1] = acc
            continue
        ts.append(p[0])
        vs.append(acc)
    return ts, vs


def _at(ts: list[float], vs: list[float], t: float) -> float:
    """Linear interpolation inside the samples, constant outside them."""
    if t <= ts[0]:
        return vs[0]
    if t >= ts[-1]:
        return vs[-1]
    i = bisect.bisect_right(ts, t)
    t_a, t_b = ts[i - 1], ts[i]
    return vs[i - 1] + (vs[i] - vs[i - 1]) * (t - t_a) / (t_b - t_a)


def _curves(series: Mapping[str, Sequence[Point]]) -> list[tuple[list[float], list[float]]]:
    out = []
    for points in series.values():
        ts, vs = _monotone(points)
        if ts:
            out.append((ts, vs))
    return out


def _sum_at(curves: list[tuple[list[float], list[float]]], t: float) -> float:
    return sum(_at(ts, vs, t) for ts, vs in curves)


def counter_increase(series: Mapping[str, Sequence[Point]], t0: float, t1: float) -> float:
    """Summed increase of every backend's counter over [t0, t1] (interpolated, reset-aware); 0.0 when none."""
    curves = _curves(series)
    if not curves or t1 <= t0:
        return 0.0
    return _sum_at(curves, t1) - _sum_at(curves, t0)


def server_counted(
    series: Mapping[str, Sequence[Point]],
    t0: float,
    t1: float,
    metric: str = GENERATION_METRIC,
) -> dict[str, Any] | None:
    """Sustained and best-second rates of the summed counter over the window [t0, t1].

    Returns ``{"sustained_tok_s", "best_second_tok_s", "metric"}``, or None when no server exposes the counter
    (no backend has a point with a value) or the window is empty. ``series`` maps url -> list of
    ``(t, tokens, running, waiting)`` as :class:`MetricsSampler` keeps them; ``metric`` only names the counter
    in the result.

    The window is first clipped to the span the samples cover (earliest to latest sample of any backend), so
    the rates never divide by time nobody observed. Sustained is the increase over the window divided by its
    length. Best second is the largest increase of the *sum* over any 1 s span inside the window, found exactly
    (see the module docstring). A window shorter than 1 s has no 1 s span inside it: its best second is then
    the sustained rate (the only rate the window holds); best second >= sustained always holds.
    """
    curves = _curves(series)
    if not curves:
        return None
    lo = max(t0, min(ts[0] for ts, _ in curves))
    hi = min(t1, max(ts[-1] for ts, _ in curves))
    if hi <= lo:
        return None
    span = hi - lo
    # the sum is piecewise linear between the union of sample times: tabulate it there once
    grid = sorted({t for ts, _ in curves for t in ts if lo < t < hi} | {lo, hi})
    total = [_sum_at(curves, t) for t in grid]
    sustained = (total[-1] - total[0]) / span
    if span <= 1.0:
        best = sustained
    else:
        last_start = hi - 1.0
        candidates = {lo, last_start}
        for t in grid:
            for s in (t, t - 1.0):
                if lo < s < last_start:
                    candidates.add(s)
        best = max(_at(grid, total, s + 1.0) - _at(grid, total, s) for s in candidates)
        # A window that is not a whole number of seconds can, in contrived cases, hold no 1 s span as busy as
        # its own average; report the average then, so that best second >= sustained always.
        best = max(best, sustained)
    return {"sustained_tok_s": sustained, "best_second_tok_s": best, "metric": metric}
