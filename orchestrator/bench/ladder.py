"""The throughput ladder: load the servers at rising stream counts and read what they deliver from their counters.

For each level N, N streaming requests per backend are kept in flight for the whole window (:mod:`.load`); the
figures come from ``vllm:generation_tokens_total`` (or another server's counter, :mod:`orchestrator.metrics`)
sampled every 0.5 s. One level (:func:`measure_level`):

1. the load starts on every backend at once;
2. ramp-up is excluded: the window opens once the level is full *and* at least ``ramp`` seconds have passed since
   it began; it lasts ``window`` seconds;
3. the one :class:`~orchestrator.metrics.MetricsSampler` of the bench samples every backend's /metrics on one
   absolute schedule throughout; the window's figures come from :func:`~orchestrator.metrics.server_counted`
   (interpolated, summed, best second a simultaneous peak); when no server exposes a counter, from the clients'
   estimate, labelled ``client-estimate``;
4. the load is cancelled and the bench waits for the servers to drain before the next level.

``ladder.json``: ``{"levels": [{"streams", "sustained_tok_s", "best_second_tok_s", "per_stream_tok_s", "step_ms",
"ttft_median_ms", "running", "waiting", ...}], "fit": {"a_ms", "b_ms", "ceiling_tok_s"} | null, ...}``. Per level,
``streams`` is per backend; sustained and best second are summed over the backends; per stream = sustained /
(streams x backends); step_ms = 1000 / per stream (per server); running and waiting are the medians over the
window of the servers' gauges, summed. Extensions: per level ``held`` (false when requests waited: such a level
is flagged and left out of the fit), ``window_s``, ``requests_completed``, ``request_errors``, ``metric`` and, with
several backends, ``per_backend`` (each server's own sustained, best second, running, waiting); at the top
``label``, ``created``, ``backends``, ``model``, ``window_s``, ``ramp_s``, ``max_tokens``, ``interval_s``,
``time_scale``, ``metric``. The fit is least squares over the held levels; ``ceiling_tok_s`` = 1000 / b, per server.

Power and caches (:func:`level_power`): with ``--power`` pages (dcgm-exporter, :mod:`orchestrator.metrics.power`)
each level has ``power_w`` (the window's mean draw, summed over the cards), ``energy_j``, ``energy_source``
("counter" | "power-integrated"), ``tokens_per_joule`` (the window's server-counted tokens of the covered backends /
their joules) and ``power`` (coverage: ``covered_backends``, ``uncovered_backends``, ``covered_share``, ``coverage``
"k of n backends", ``per_backend``); without, those are None and ``power`` is ``{"available": false, "reason"}``.
Every level has ``kv_cache_usage`` ({median, max} of the servers' KV fill over the window, or None) and
``prefix_cache_hit_rate`` (hits / queries increase over the window, or None).

Latency (:func:`level_latency`): each level has ``ttft_s`` (p50/p95/p99, over the whole level), ``itl_ms``
(p50/p99, over the window) and ``e2e_s`` (p50/p95/p99 of the level's requests that finished, None when none did),
each with ``source``: "server" (the servers' histograms, :mod:`orchestrator.metrics.latency`, with coverage, when
every backend has them) or "client".

Every figure is in wall-clock seconds. Against the simulator run with ``--time-scale X`` the model's own figures
are tok/s x X, step ms / X and power W x X (tokens per joule unchanged); ``ladder.json`` records the servers'
``time_scale`` when they report one.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anyio
import orjson
from rich.console import Console

from ..core.config import Backend
from ..core.errors import BackendError
from ..metrics import GENERATION_METRIC, MetricsSampler, Point, server_counted
from ..metrics.readers import latency_figures
from ..wire.client import auth_header, discover
from .fit import fit_step
from .load import LoadStats, Target, client_estimate_series, client_for, saturated, stream_worker, wait_full

DEFAULT_STREAMS = (1, 4, 8, 16, 32, 64, 128, 256)
DISCOVER_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class BenchSettings:
    backends: tuple[str, ...]
    streams: tuple[int, ...] = DEFAULT_STREAMS
    window: float = 40.0
    max_tokens: int = 512
    out: str = "handbook-bench"
    model: str | None = None
    api_key: str = field(default="EMPTY", repr=False)
    ramp: float = 1.0
    interval: float = 0.5
    label: str | None = None
    power: tuple[str | None, ...] = ()  # per backend, in order: its GPU's power page (URL[#gpu=LABEL]) or None


async def find_targets(settings: BenchSettings) -> tuple[list[Target], Any]:
    """Check every backend answers /v1/models and pick its model (the job's own discovery); read the simulator's
    time scale where a server is one: a float when every server reports the same, else url -> scale."""
    backends = [Backend(url, api_key=settings.api_key) for url in settings.backends]
    targets: dict[str, Target] = {}
    scales: dict[str, float] = {}

    async def one(session: aiohttp.ClientSession, backend: Backend) -> None:
        model = await discover(backend, settings.api_key, settings.model, timeout_s=DISCOVER_TIMEOUT_S)
        targets[backend.url] = Target(backend, model)
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            url = backend.url.removesuffix("/v1") + "/sim/stats"
            headers = {"Authorization": auth_header(backend, settings.api_key)}
            async with session.get(url, headers=headers) as resp:
                stats = orjson.loads(await resp.read()) if resp.status == 200 else None
            if isinstance(stats, dict) and isinstance(stats.get("time_scale"), int | float):
                scales[backend.url] = float(stats["time_scale"])

    timeout = aiohttp.ClientTimeout(total=DISCOVER_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session, anyio.create_task_group() as tg:
        for backend in backends:
            tg.start_soon(one, session, backend)
    time_scale: Any = None
    if scales:
        vals = sorted(set(scales.values()))
        time_scale = vals[0] if len(vals) == 1 and len(scales) == len(backends) else scales
    return [targets[b.url] for b in backends], time_scale


async def run_ladder(
    settings: BenchSettings,
    console: Console | None = None,
    on_level: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure every level against every backend; return the ladder (``ladder.json``'s content).

    ``on_level`` sees the ladder so far after each level (the command writes its files then, so an interrupted
    bench keeps the levels it finished).
    """
    console = console or Console(stderr=True, highlight=False, soft_wrap=True)
    targets, time_scale = await find_targets(settings)
    urls = [t.url for t in targets]
    models = sorted({t.model for t in targets})
    power = dict(zip(settings.backends, settings.power, strict=False))
    sampler = MetricsSampler(urls, interval=settings.interval, power={u: power.get(u) for u in urls})
    numbers = itertools.count(1)
    levels: list[dict[str, Any]] = []
    started = time.time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.run)
        with anyio.move_on_after(10):
            await sampler.next_round()
        if not any(p[1] is not None for s in sampler.series.values() for p in s):
            console.print(
                "[yellow]warning:[/] no server exposes vllm:generation_tokens_total at /metrics; "
                "figures fall back to client-side estimates"
            )
        if not await wait_drained(sampler, urls, limit=30):
            console.print("[yellow]warning:[/] the servers were busy before the bench started")
        for n in settings.streams:
            console.print(
                f"level {n} stream{'s' if n != 1 else ''} x {len(urls)} server{'s' if len(urls) != 1 else ''}: "
                f"ramp, then {settings.window:g} s window ..."
            )
            level = await measure_level(
                targets=targets,
                streams=n,
                window=settings.window,
                ramp=settings.ramp,
                max_tokens=settings.max_tokens,
                sampler=sampler,
                numbers=numbers,
            )
            levels.append(level)
            if on_level is not None:
                on_level(_ladder(settings, started, urls, models, time_scale, levels))
            console.print(
                f"  sustained {level['sustained_tok_s']:,.1f} tok/s, best second "
                f"{level['best_second_tok_s']:,.1f}, per stream {level['per_stream_tok_s']:,.2f}"
                + level_power_words(level)
                + ("" if level["held"] else f"  [red]NOT HELD ({level['waiting']:g} waiting)[/]")
            )
            if not await wait_drained(sampler, urls, limit=60):
                console.print("[yellow]warning:[/] the servers did not drain between levels")
        tg.cancel_scope.cancel()
    return _ladder(settings, started, urls, models, time_scale, levels)


def _ladder(
    settings: BenchSettings,
    started: float,
    urls: list[str],
    models: list[str],
    time_scale: Any,
    levels: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "label": settings.label,
        "created": _dt.datetime.fromtimestamp(started, _dt.UTC).isoformat(timespec="seconds"),
        "backends": urls,
        "model": models[0] if len(models) == 1 else models,
        "window_s": settings.window,
        "ramp_s": settings.ramp,
        "max_tokens": settings.max_tokens,
        "interval_s": settings.interval,
        "time_scale": time_scale,
        "metric": GENERATION_METRIC,
        "levels": list(levels),
        "fit": fit_step(levels),
    }


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
    stats = LoadStats(streams * k)
    # one client per backend per level: leaving the level closes its connections, and the servers abort
    async with contextlib.AsyncExitStack() as clients, anyio.create_task_group() as tg:
        t_level = time.monotonic()
        for bi, target in enumerate(targets):
            client = await clients.enter_async_context(client_for(target, window))
            tg.start_soon(client.watchdog)
            for si in range(streams):
                tg.start_soon(stream_worker, client, numbers, max_tokens, (bi, si), stats)
        with anyio.move_on_after(ramp_timeout):
            await wait_full(stats, sampler, targets, streams, t_level)
        if not (stats.all_first or saturated(stats, sampler, targets, streams, t_level)):
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
        await sample_after(sampler, [x.url for x in targets], t1)
        tg.cancel_scope.cancel()
    return _level(stats, sampler, targets, streams, t0, t1, t_level=t_level)


def _level(
    stats: LoadStats, sampler: MetricsSampler, targets: Sequence[Target], streams: int, t0: float, t1: float, *,
    t_level: float | None = None,
) -> dict[str, Any]:
    """The figures of one level measured over the window [t0, t1]."""
    k = len(targets)
    # each server's own counter name (vLLM, SGLang, llama.cpp, TGI), as the sampler found it
    names = {u: m for u, m in sampler.metric.items() if m}
    figures = server_counted(sampler.series, t0, t1, names or GENERATION_METRIC)
    if figures is None:
        figures = server_counted(client_estimate_series(stats), t0, t1, "client-estimate")
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
        own = server_counted({target.url: points}, t0, t1) if k > 1 else None
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
        "per_backend": per_backend if k > 1 else None,
        **level_power(sampler, t0, t1),
        **level_latency(sampler, stats, t0, t1, t0 if t_level is None else t_level),
    }


def level_latency(sampler: MetricsSampler, stats: LoadStats, t0: float, t1: float, t_level: float) -> dict[str, Any]:
    """A level's ``ttft_s``, ``itl_ms`` and ``e2e_s`` percentiles: the servers' histograms where every backend has
    them, else the client's. ITL over the window (the level held); TTFT and end to end over the whole level from
    its start (``t_level``: the level's first requests are sent in its ramp, and a request longer than the window
    starts and ends nowhere inside it). The client's ITL is each finished request's mean gap; the client keeps no
    send time for a finished request, so it has no end-to-end figure; end to end is None when no request of the
    level finished (its requests outlive it: they are cancelled when it ends)."""
    histograms = sampler.histograms_of()
    gaps = [(t_end - t_first) / (n - 1) for t_first, t_end, n in stats.spans
            if n > 1 and t_end > t_first and t_end >= t0 and t_first <= t1]
    itl = latency_figures(histograms, t0, t1, {"itl": gaps})
    whole = latency_figures(histograms, t_level, t1, {"ttft": [ttft for _, ttft in stats.ttft_s]})
    return {"ttft_s": whole["ttft_s"], "itl_ms": itl["itl_ms"], "e2e_s": whole["e2e_s"]}


def level_power(sampler: MetricsSampler, t0: float, t1: float) -> dict[str, Any]:
    """A level's power and cache keys: ``power_w``, ``energy_j``, ``energy_source``, ``tokens_per_joule``,
    ``power`` (coverage), ``kv_cache_usage`` ({median, max}), ``prefix_cache_hit_rate``."""
    pf = sampler.power_over(t0, t1)
    on = pf.get("available") is True
    keys = ("covered_backends", "uncovered_backends", "covered_share", "coverage", "per_backend")
    cover = {k: pf[k] for k in keys if k in pf}
    return {
        "power_w": pf["power_w"] if on else None,
        "energy_j": pf["energy_j"] if on else None,
        "energy_source": pf["energy_source"] if on else None,
        "tokens_per_joule": pf["tokens_per_joule"] if on else None,
        "power": cover if on else {"available": False, "reason": pf["reason"]},
        **sampler.caches_over(t0, t1),
    }


def level_power_words(level: dict[str, Any]) -> str:
    """The bench's printed level line's power and cache part ("" when the level has neither)."""
    out = ""
    if level.get("power_w") is not None:
        p = level["power"]
        part = "" if p.get("covered_share", 1) == 1 else f" ({p['coverage']})"
        tpj = level.get("tokens_per_joule")
        out += f", power{part} {level['power_w']:,.1f} W" + (f", {tpj:,.3f} tok/J" if tpj is not None else "")
    kv = level.get("kv_cache_usage")
    if kv:
        out += f", KV cache {100 * kv['median']:.0f}% (max {100 * kv['max']:.0f}%)"
    return out


def _median_gauge(points: Sequence[Point], t0: float, t1: float, index: int) -> float | None:
    vals = [v for p in points if t0 <= p[0] <= t1 and (v := p[index]) is not None]
    return float(statistics.median(vals)) if vals else None


async def sample_after(sampler: MetricsSampler, urls: Sequence[str], t: float, limit: float = 5.0) -> None:
    """Wait (bounded) until every server that has ever answered a scrape has a sample later than ``t``."""
    with anyio.move_on_after(limit):
        while not all(not sampler.series.get(u) or sampler.series[u][-1][0] > t for u in urls):
            await sampler.next_round()


async def wait_drained(sampler: MetricsSampler, urls: Sequence[str], limit: float = 60.0) -> bool:
    """Wait until every server's gauges say nothing runs or waits (servers without gauges: a short pause)."""
    with anyio.move_on_after(limit):
        while True:
            latest = await sampler.next_round()
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
