"""Where the step times come from: a `handbook bench` ladder.json, or a short probe of each backend's counters.

The probe is the bench's own machinery (:func:`orchestrator.bench.ladder.measure_level`: N streams per backend
kept full, the figures read from the servers' generation-token counters) at a few stream levels up to the job's
cap, every backend at once, with short windows: about 3 s a level, at most :data:`PROBE_MAX_WINDOW_S`. The levels
stop at the sections the job writes (``most``: ``job.forecast_file.job_sections``; no backend runs more than that at
once, but for a planning request beside them): a 36-section book on one backend never runs 256 streams, and on a
server that holds fewer (the embedded engine on two CPU cores holds about 90) a level of 256 measured preemption for
minutes before the first planning request. Each backend's step time at a level is ``1000 x running / its own
counted tok/s`` (the streams its gauge says ran, when it has one; a level the server could not hold still gives a
true point that way), and ``a + b x N`` is fitted over the levels (:func:`orchestrator.bench.fit_step`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import orjson

from ..bench import fit_step
from ..bench.ladder import measure_level, wait_drained
from ..bench.load import Target
from ..core.config import Backend, Settings
from ..core.errors import BackendError, ConfigError, unwrap
from ..metrics import MetricsSampler
from .model import StepFit

log = logging.getLogger("handbook")

__all__ = ["fits_from_ladder", "probe_fits", "probe_levels"]

PROBE_WINDOW_S = 1.5  # each level's measured window, at least ...
PROBE_STEPS = 30  # ... and this many decoding steps (as the levels below predict): the counter moves a step at a
# time, so a window of a few steps would read it to within a step at each end (13 steps: +-8%)
PROBE_RAMP_S = 0.5  # the window opens this long after the level starts (and every stream has had a token)
PROBE_INTERVAL_S = 0.25  # /metrics sampling: 8 samples a window
PROBE_MAX_TOKENS = 512  # long replies: few streams end inside a window
PROBE_MAX_WINDOW_S = 12.0  # ... but no longer than this: at a step of seconds (a server past what it holds, or
# levels whose fit predicts one: the embedded engine's 64-stream level, read during its prefills, once predicted a
# 181 s window at 256) the window holds fewer steps, each read to a larger error, rather than minutes of probing
PROBE_FIRST_SAMPLE_S = 5.0  # a backend whose /metrics has not answered by then has no readable counter
PROBE_DRAIN_S = 10.0
PROBE_FILL_S = 30.0  # a level whose streams have not all started by then is not measured (a busy or small server)


def probe_levels(cap: int, most: int | None = None) -> tuple[int, ...]:
    """The stream levels a probe measures: the top (where a job spends most of its time), a quarter of it and, on
    tops of 64 and more, a sixteenth (the tail of a job, where few streams run); one level when the top is 1. The
    top is the cap, or ``most`` where that is lower: the most streams the job will run on one backend at once."""
    top = cap if most is None else max(1, min(cap, most))
    return tuple(sorted({max(1, top // 16), max(1, top // 4), top} if top >= 64 else {max(1, top // 4), top}))


async def probe_fits(backends: Sequence[tuple[Backend, str]], settings: Settings, most: int | None = None,
                     on_start: Callable[[tuple[int, ...]], None] | None = None) -> list[StepFit]:
    """Fit every backend's step time from a short load at a few levels (all backends at once), read from the
    servers' own counters. ``backends`` are (backend, model) as discovered; ``most``: the most streams the job will
    run on one backend, when known (:func:`probe_levels`). BackendError when no backend exposes a readable token
    counter. ``on_start(levels)`` is called as the probe begins."""
    if not backends:
        raise BackendError("no backend to probe")
    targets = [Target(replace(b, api_key=b.api_key or settings.api_key), model) for b, model in backends]
    urls = [t.url for t in targets]
    sampler = MetricsSampler(urls, interval=PROBE_INTERVAL_S)
    levels = probe_levels(min(b.cap for b, _ in backends), most)
    if on_start is not None:
        on_start(levels)
    points: dict[str, list[dict[str, Any]]] = {u: [] for u in urls}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            await _load(sampler, targets, levels, points)
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # the BackendError inside, as one line
        inner = unwrap(group)
        if inner is group:
            raise
        raise inner from None
    counted = {u: fit for u in urls if sampler.metric.get(u) and (fit := _fit(points[u])) is not None}
    if not counted:
        raise BackendError("cannot probe the step time: the servers' counters did not move under load")
    fleet_a = sum(f[0] for f in counted.values()) / len(counted)
    fleet_b = sum(f[1] for f in counted.values()) / len(counted)
    out = []
    for (b, _), url in zip(backends, urls, strict=True):
        # the top level asked for, where it is below the cap (a level the server could not fill ends the probe
        # below it, but the fit then holds what the server can run: it is kept as measured to the top)
        top = levels[-1] if levels[-1] < b.cap else None
        if url in counted:
            a, bm = counted[url]
            out.append(StepFit(url, a, bm, b.cap, f"probe ({', '.join(str(n) for n in levels)} streams)", top))
        else:  # no counter on this one: the others' mean (a fleet is usually one kind of server)
            out.append(StepFit(url, fleet_a, fleet_b, b.cap, "probe: no token counter here; the other backends' mean",
                               top))
    return out


async def _load(sampler: MetricsSampler, targets: list[Target], levels: tuple[int, ...],
                points: dict[str, list[dict[str, Any]]]) -> None:
    """Check a counter is readable, then measure every level; each backend's points go to ``points``."""
    urls = [t.url for t in targets]
    with anyio.move_on_after(PROBE_FIRST_SAMPLE_S):
        while not all(sampler.series[u] or sampler.errors[u] for u in urls):
            await sampler.next_round()
    if not any(sampler.metric.values()):
        why = "; ".join(f"{u}: {sampler.uncounted_reason(u)}" for u in urls)
        raise BackendError(f"cannot probe the step time: no backend has a readable token counter ({why}); "
                           "give a `handbook bench` ladder.json with --ladder")
    numbers = itertools.count(1)
    for n in levels:
        window = _window(points, n)
        try:
            level = await measure_level(targets=targets, streams=n, window=window, ramp=PROBE_RAMP_S,
                                        max_tokens=PROBE_MAX_TOKENS, sampler=sampler, numbers=numbers,
                                        ramp_timeout=PROBE_FILL_S)
        except BackendError as e:
            if not any(points.values()):
                raise
            # A level the server cannot fill (its KV cache, a busy host) is past what a probe should load: the
            # levels below it are the fit, and the message says so.
            log.warning("the forecast's probe stopped below %d streams: %s", n, e)
            await wait_drained(sampler, urls, limit=PROBE_DRAIN_S)
            return
        for url, own in _per_backend(level, urls).items():
            points[url].append(own)
        await wait_drained(sampler, urls, limit=PROBE_DRAIN_S)


def _window(points: dict[str, list[dict[str, Any]]], streams: int) -> float:
    """A level's measured window: :data:`PROBE_STEPS` steps as the levels measured so far predict them, within
    [:data:`PROBE_WINDOW_S`, :data:`PROBE_MAX_WINDOW_S`]."""
    return min(PROBE_MAX_WINDOW_S, max(PROBE_WINDOW_S, PROBE_STEPS * _step_s(points, streams)))


def _step_s(points: dict[str, list[dict[str, Any]]], streams: int) -> float:
    """The slowest backend's step at ``streams`` as the levels measured so far predict it (0.0 before any)."""
    worst = 0.0
    for pts in points.values():
        fit = _fit(pts)
        if fit is not None:
            worst = max(worst, (fit[0] + fit[1] * streams) / 1000.0)
    return worst


def _per_backend(level: dict[str, Any], urls: list[str]) -> dict[str, dict[str, Any]]:
    """One level's point per backend: streams actually running and that backend's step time."""
    rows = level.get("per_backend") or [
        {"url": urls[0], "sustained_tok_s": level["sustained_tok_s"], "running": level.get("running")}
    ]
    out = {}
    for row in rows:
        tok_s = row.get("sustained_tok_s")
        if not tok_s:
            continue
        running = row.get("running")
        n = float(running) if running else float(level["streams"])
        out[row["url"]] = {"streams": n, "step_ms": 1000.0 * n / tok_s}
    return out


def _fit(points: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(a_ms, b_ms) over a backend's points; one point (a cap of 1) is all fixed cost."""
    if not points:
        return None
    fit = fit_step(points)
    if fit is None:
        step = sum(p["step_ms"] for p in points) / len(points)
        return step, 0.0
    a, b = float(fit["a_ms"] or 0.0), float(fit["b_ms"] or 0.0)
    # noise at low levels can tilt the line: a step never costs less than nothing, nor less with more streams
    b = max(0.0, b)
    a = max(a, 0.05 * min(p["step_ms"] for p in points))
    return a, b


def fits_from_ladder(path: str | Path, backends: Sequence[Backend]) -> list[StepFit]:
    """Step times from `handbook bench`'s ladder.json: each backend's own levels when the ladder measured that
    server (its ``per_backend`` figures), else the ladder's fit (``fit``: a_ms, b_ms per server).
    ConfigError when the file cannot be read or holds no fit."""
    p = Path(path)
    try:
        data = orjson.loads(p.read_bytes())
    except OSError as e:
        raise ConfigError(f"cannot read the ladder {p}: {e.strerror or e}") from None
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"the ladder {p} is not JSON: {e}") from None
    fit = data.get("fit") if isinstance(data, dict) else None
    if not (isinstance(fit, dict) and all(isinstance(fit.get(k), int | float) for k in ("a_ms", "b_ms"))):
        raise ConfigError(f"the ladder {p} has no step-time fit (\"fit\": a_ms, b_ms): run `handbook bench` with "
                          "two or more levels the servers hold")
    out = []
    for b in backends:
        own = _own_fit(data, b.url)
        if own is not None:
            out.append(StepFit(b.url, own[0], own[1], b.cap, f"ladder {p} (this server's levels)"))
        else:
            out.append(StepFit(b.url, float(fit["a_ms"]), float(fit["b_ms"]), b.cap, f"ladder {p}"))
    return out


def _own_fit(data: dict[str, Any], url: str) -> tuple[float, float] | None:
    """A fit over one server's own figures in a ladder of several servers, when it has two held levels."""
    points = []
    for lv in data.get("levels") or ():
        if not isinstance(lv, dict) or not lv.get("held", True):
            continue
        for row in lv.get("per_backend") or ():
            if isinstance(row, dict) and row.get("url") == url and row.get("sustained_tok_s"):
                n = float(lv["streams"])
                points.append({"streams": n, "step_ms": 1000.0 * n / float(row["sustained_tok_s"])})
    fit = fit_step(points) or {}
    a, b = fit.get("a_ms"), fit.get("b_ms")
    if a is None or b is None:
        return None
    return float(a), max(0.0, float(b))
