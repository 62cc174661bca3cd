"""Server-counted measurement: sample every backend's ``/metrics``, interpolate, sum.

The figures a job or a bench reports come from the servers' own generation-token counters, never from client-side
timing. Four kinds of server are read (:data:`FAMILIES`, names checked against each server's source):

* vLLM: counter ``vllm:generation_tokens_total`` (advanced every engine step);
* SGLang: counter ``sglang:generation_tokens_total`` (advanced when a request finishes);
* llama.cpp's ``llama-server --metrics``: counter ``llamacpp:tokens_predicted_total`` (advanced when a slot finishes
  its request; printed with six significant digits, so above a million tokens it moves in steps of 10 or more);
* HF TGI: histogram ``tgi_request_generated_tokens``, whose ``_sum`` is the tokens of every successful request
  (observed when the request finishes).

The sums of servers that count at completion are exact over a window long against one request, and lumpy within
it: their best second is a figure of finished requests, not of decoding. Pieces:

* :func:`parse_metrics` reads one Prometheus text exposition into :class:`Counters` (summed over label sets), and
  names the counter it found.
* :class:`MetricsSampler` scrapes every backend on one absolute 0.5 s schedule and keeps a time series per
  backend; each round it emits a :class:`~orchestrator.events.MetricsSample`. It remembers which counter each
  backend exposed, and why a backend could not be counted.
* :func:`server_counted` / :func:`counter_increase` turn those series into sustained and best-second rates, and
  say which backends the figures cover. :meth:`MetricsSampler.counted` gives the ``stats.json`` form.

Coverage. A backend whose /metrics has none of the counters (or never answered) adds nothing to the sum; the
result then names the backends it covers and those it does not, with the reason, so that the sum of the others is
never presented as the whole fleet's.

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
    "FAMILIES",
    "GENERATION_METRIC",
    "PROMPT_METRIC",
    "RUNNING_METRIC",
    "WAITING_METRIC",
    "Counters",
    "MetricsSampler",
    "Point",
    "ServerFamily",
    "counter_increase",
    "metrics_url",
    "parse_metrics",
    "server_counted",
    "unavailable",
]

GENERATION_METRIC = "vllm:generation_tokens_total"
PROMPT_METRIC = "vllm:prompt_tokens_total"
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"


@dataclass(frozen=True)
class ServerFamily:
    """The metric names one kind of server writes on its /metrics page (None: that server has no such metric)."""

    server: str
    generation_tokens: str  # a counter, or a histogram's ``_sum`` of generated tokens per request
    prompt_tokens: str | None = None
    running: str | None = None
    waiting: str | None = None


# Tried in this order; the first family whose generation counter a page carries is the one read. Sources:
# vllm-project/vllm vllm/v1/metrics/loggers.py; sgl-project/sglang python/sglang/srt/metrics/collector.py
# (TokenizerMetricsCollector, SchedulerMetricsCollector); ggml-org/llama.cpp examples/server/server.cpp
# (handle_metrics: "llamacpp:" + name); huggingface/text-generation-inference router/src/server.rs.
FAMILIES: tuple[ServerFamily, ...] = (
    ServerFamily("vLLM", GENERATION_METRIC, PROMPT_METRIC, RUNNING_METRIC, WAITING_METRIC),
    ServerFamily("SGLang", "sglang:generation_tokens_total", "sglang:prompt_tokens_total",
                 "sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ServerFamily("llama.cpp", "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred"),
    ServerFamily("TGI", "tgi_request_generated_tokens_sum", "tgi_request_input_length_sum",
                 "tgi_batch_current_size", "tgi_queue_size"),
)

_FIELDS = ("generation_tokens", "prompt_tokens", "running", "waiting")


def _key(name: str) -> str:
    """One spelling for a metric name's variants.

    Exporters differ: prometheus_client appends ``_total`` to a counter declared without it, and relabelling
    proxies (or OpenTelemetry bridges) write colons as underscores. ``vllm:generation_tokens_total``,
    ``vllm:generation_tokens`` and ``vllm_generation_tokens_total`` all map to ``vllm_generation_tokens``.
    """
    return name.replace(":", "_").removesuffix("_total")


# sample key -> (family index, Counters field)
_SAMPLES: dict[str, tuple[int, str]] = {
    _key(name): (i, f)
    for i, fam in enumerate(FAMILIES)
    for f in _FIELDS
    if (name := getattr(fam, f)) is not None
}
# HELP/TYPE lines to keep: the samples' own names, and the histogram a ``_sum`` belongs to
_DECLARED: frozenset[str] = frozenset(_SAMPLES) | frozenset(k.removesuffix("_sum") for k in _SAMPLES)

GENERATION_NAMES = ", ".join(f.generation_tokens for f in FAMILIES)
"""The generation-token metrics looked for, for messages."""

Point = tuple[float, float | None, float | None, float | None]
"""One sample of one backend: (t = time.monotonic(), tokens, running, waiting); None where the server lacks it."""


@dataclass(frozen=True)
class Counters:
    """What one /metrics scrape says, each value summed over its label sets; None where the metric is absent.

    ``metric`` is the name of the generation-token metric the values came from (as the parser reports it), None
    when the page has none.
    """

    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    running: float | None = None
    waiting: float | None = None
    metric: str | None = None


def _metric_name(line: str) -> str:
    brace = line.find("{")
    space = line.find(" ")
    end = brace if brace != -1 and (space == -1 or brace < space) else space
    return line[:end] if end != -1 else line


def _relevant_lines(text: str) -> str:
    """Keep only the lines of the metrics we read (and their HELP/TYPE lines).

    A vLLM exposition is hundreds of lines, mostly histogram buckets; the pure-Python parser is the costly part
    of a scrape, so it only sees what we use. Names are matched by :func:`_key`, never by prefix; a histogram
    keeps only its ``_sum`` line.
    """
    keep: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and _key(parts[2]) in _DECLARED:
                keep.append(line)
            continue
        if _key(_metric_name(line)) in _SAMPLES:
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> Counters:
    """Parse a Prometheus text exposition (vLLM's, SGLang's, llama.cpp's or TGI's names) into :class:`Counters`.

    Uses ``prometheus_client.parser.text_string_to_metric_families`` on the relevant lines only. Every value is
    the sum over its label sets (several engines or models behind one server add up). When a page carries more
    than one family, the first of :data:`FAMILIES` with a generation counter wins and every field comes from it
    (a server's gauges are never mixed with another server's counter). Raises ``ValueError`` on text the parser
    rejects.
    """
    sums: dict[tuple[int, str], float] = {}
    names: dict[tuple[int, str], str] = {}
    for family in text_string_to_metric_families(_relevant_lines(text)):
        for sample in family.samples:
            hit = _SAMPLES.get(_key(sample.name))
            if hit is None or math.isnan(sample.value):
                continue
            sums[hit] = sums.get(hit, 0.0) + float(sample.value)
            names.setdefault(hit, sample.name)
    present = sorted({i for i, _ in sums})
    if not present:
        return Counters()
    chosen = next((i for i in present if (i, "generation_tokens") in sums), present[0])
    fields = {f: v for (i, f), v in sums.items() if i == chosen}
    return Counters(**fields, metric=names.get((chosen, "generation_tokens")))


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

    ``metric[url]`` is the generation metric a backend's page carried (None until one did); ``last_failure[url]``
    says, in words, why its last failed scrape failed. :meth:`counted` turns all of it into the ``stats.json``
    figures, naming the backends they cover.

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
                        raise _ScrapeError(resp.status)
                    text = await resp.text()
            t_recv = time.monotonic()
            counters = parse_metrics(text)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, _ScrapeError) as e:
            self.errors[url] += 1
            self.last_error[url] = f"{type(e).__name__}: {e}".rstrip(": ")
            self.last_failure[url] = _failure(e, self.last_error[url])
            return None
        if counters.metric is not None:
            self.metric[url] = counters.metric
        # the counters describe the server somewhere between send and receive: take the midpoint
        point: Point = ((t_send + t_recv) / 2, counters.generation_tokens, counters.running, counters.waiting)
        points = self.series[url]
        if points and point[0] < points[-1][0]:  # an overlapping sample_once() finished out of order
            bisect.insort(points, point, key=lambda p: p[0])
        else:
            points.append(point)
        return counters


    # -- coverage ---------------------------------------------------------------------------------------------

    def uncounted_reason(self, url: str) -> str:
        """Why ``url`` adds nothing to the counted figures, in words (for a backend that has no counter)."""
        if self.series[url]:  # it answered, but never with a generation counter
            return f"no generation-token counter on /metrics (looked for {GENERATION_NAMES})"
        return self.last_failure[url] or "/metrics was never scraped"

    def counted(self, t0: float, t1: float) -> dict[str, Any]:
        """The ``stats.json`` ``server_counted`` figures over [t0, t1].

        Either :func:`server_counted`'s result (figures, covered and uncovered backends), or
        ``{"available": False, "reason", "uncovered_backends"}`` when nothing could be counted in the window.
        """
        reasons = {u: self.uncounted_reason(u) for u in self.urls if not _has_counter(self.series[u])}
        names = {u: m for u, m in self.metric.items() if m is not None}
        figures = server_counted(self.series, t0, t1, names, reasons=reasons)
        if figures is not None:
            return figures
        return unavailable(self.urls, reasons)


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


def _has_counter(points: Iterable[Point]) -> bool:
    return any(p[1] is not None for p in points)


def unavailable(urls: Sequence[str], reasons: Mapping[str, str]) -> dict[str, Any]:
    """``server_counted`` when no figure can be given: why, per backend."""
    if reasons and len(reasons) == len(urls):
        why = "no backend exposes a generation-token counter: " + "; ".join(f"{u}: {r}" for u, r in reasons.items())
    elif not urls:
        why = "no backend was sampled"
    else:
        why = "the servers' counters were not sampled inside the measured window"
    return {
        "available": False,
        "reason": why,
        "uncovered_backends": [{"url": u, "reason": r} for u, r in reasons.items()],
    }


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
    metric: str | Mapping[str, str] = GENERATION_METRIC,
    *,
    reasons: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """Sustained and best-second rates of the summed counter over the window [t0, t1], and what they cover.

    Returns ``{"sustained_tok_s", "best_second_tok_s", "metric", "metric_by_backend", "covered_backends",
    "uncovered_backends", "covered_share"}``, or None when no server exposes the counter (no backend has a point
    with a value) or the window is empty. ``series`` maps url -> list of ``(t, tokens, running, waiting)`` as
    :class:`MetricsSampler` keeps them. ``metric`` names the counter in the result: one name for every backend,
    or url -> name (a mixed fleet). ``reasons`` says why a backend without a counter has none (url -> words).

    Coverage: the figures are sums over ``covered_backends`` (those with a counter) only; every other url of
    ``series`` is listed in ``uncovered_backends`` with its reason, and ``covered_share`` is k/n. A reader must
    never take a sum over k < n backends for the fleet's.

    The window is first clipped to the span the samples cover (earliest to latest sample of any backend), so
    the rates never divide by time nobody observed. Sustained is the increase over the window divided by its
    length. Best second is the largest increase of the *sum* over any 1 s span inside the window, found exactly
    (see the module docstring). A window shorter than 1 s has no 1 s span inside it: its best second is then
    the sustained rate (the only rate the window holds); best second >= sustained always holds.
    """
    covered = [u for u, points in series.items() if _has_counter(points)]
    if not covered:
        return None
    rates = _rates(_curves(series), t0, t1)
    if rates is None:
        return None
    sustained, best = rates
    names = {u: metric if isinstance(metric, str) else metric.get(u, "unnamed counter") for u in covered}
    why = reasons or {}
    uncovered = [
        {"url": u, "reason": why.get(u, "no generation-token counter in its samples")}
        for u in series
        if u not in names
    ]
    return {
        "sustained_tok_s": sustained,
        "best_second_tok_s": best,
        "metric": " + ".join(dict.fromkeys(names.values())),  # one name, unless the fleet mixes servers
        "metric_by_backend": names,
        "covered_backends": covered,
        "uncovered_backends": uncovered,
        "covered_share": round(len(covered) / len(series), 4),
    }


def _rates(curves: list[tuple[list[float], list[float]]], t0: float, t1: float) -> tuple[float, float] | None:
    """(sustained, best second) of the summed curves over [t0, t1] clipped to the sampled span; None if empty."""
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
        return sustained, sustained
    last_start = hi - 1.0
    candidates = {lo, last_start}
    for t in grid:
        for s in (t, t - 1.0):
            if lo < s < last_start:
                candidates.add(s)
    best = max(_at(grid, total, s + 1.0) - _at(grid, total, s) for s in candidates)
    # A window that is not a whole number of seconds can, in contrived cases, hold no 1 s span as busy as
    # its own average; report the average then, so that best second >= sustained always.
    return sustained, max(best, sustained)
