"""Counter series -> figures: sustained and best-second rates over a window, and which backends they cover.

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
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .counters import GENERATION_METRIC

Point = tuple[float, float | None, float | None, float | None]
"""One sample of one backend: (t = time.monotonic(), tokens, running, waiting); None where the server lacks it."""


def has_counter(points: Iterable[Point]) -> bool:
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


def recent_rate(points: list[Point], span: float = 1.0) -> float | None:
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
    :class:`~orchestrator.metrics.MetricsSampler` keeps them. ``metric`` names the counter in the result: one
    name for every backend, or url -> name (a mixed fleet). ``reasons`` says why a backend without a counter has
    none (url -> words).

    Coverage: the figures are sums over ``covered_backends`` (those with a counter) only; every other url of
    ``series`` is listed in ``uncovered_backends`` with its reason, and ``covered_share`` is k/n. A reader must
    never take a sum over k < n backends for the fleet's.

    The window is first clipped to the span the samples cover (earliest to latest sample of any backend), so
    the rates never divide by time nobody observed. Sustained is the increase over the window divided by its
    length. Best second is the largest increase of the *sum* over any 1 s span inside the window, found exactly
    (see the module docstring). A window shorter than 1 s has no 1 s span inside it: its best second is then
    the sustained rate (the only rate the window holds); best second >= sustained always holds.
    """
    covered = [u for u, points in series.items() if has_counter(points)]
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


CachePoint = tuple[float, float | None, float | None, float | None]
"""One cache sample of one backend: (t, KV cache fill 0..1, prefix-cache queries, prefix-cache hits)."""


def cache_figures(caches: Mapping[str, Sequence[CachePoint]], t0: float, t1: float) -> dict[str, Any]:
    """The KV cache's fill and the prefix cache's hit rate over [t0, t1], from the backends that report them.

    ``kv_cache_usage``: ``{"median", "max"}`` over every sample of every backend in the window (None: no backend
    reports a fill); ``prefix_cache_hit_rate``: the hits' increase / the queries' increase, summed over the backends
    that have both counters (None: none has, or nothing was looked up); ``prefix_cache_coverage``: "k of n", the
    backends whose counters it sums of those given."""
    fills = [p[1] for points in caches.values() for p in points if t0 <= p[0] <= t1 and p[1] is not None]
    queries = {u: [(p[0], p[2], None, None) for p in ps if p[2] is not None] for u, ps in caches.items()}
    hits = {u: [(p[0], p[3], None, None) for p in ps if p[3] is not None] for u, ps in caches.items()}
    both = [u for u in caches if queries[u] and hits[u]]
    q = counter_increase({u: queries[u] for u in both}, t0, t1)
    h = counter_increase({u: hits[u] for u in both}, t0, t1)
    return {
        "kv_cache_usage": {"median": round(_median(fills), 4), "max": round(max(fills), 4)} if fills else None,
        "prefix_cache_hit_rate": round(h / q, 4) if both and q > 0 else None,
        "prefix_cache_coverage": f"{len(both)} of {len(caches)}",
    }


def _median(vals: list[float]) -> float:
    s = sorted(vals)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
