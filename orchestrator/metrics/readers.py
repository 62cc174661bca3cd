"""What each reader gets: ``stats.json`` ``readers``, the per-stream view of a run beside the fleet's aggregate.

* ``per_stream_tok_s``: the reference's definition, the server-counted sustained rate over the window divided by
  the streams in flight over it (``streams_in_flight``: the mean of the servers' running gauges summed over the
  counted backends where they have one, ``streams_source`` "server"; else the client's mean of requests open, by
  Little's law the sum of their times in the window over its length, "client").
* ``section_decode_tok_s``: each section's own decode rate, (tokens - 1) / (last token - first token): the first
  token is the prefill's, as in `vllm bench serve`'s TPOT. p10/p50/p90, client-timed (only the client sees one
  request's tokens).
* ``ttft_s`` (p50/p95/p99), ``itl_ms`` (p50/p99) and ``e2e_s`` (p50/p95/p99): from the servers' histograms
  (:mod:`~orchestrator.metrics.latency`, ``source`` "server", with coverage) where every counted backend has them,
  else from the client's replies (``source`` "client"): TTFT from send to first chunk, end to end from send to the
  stream's end, and ITL as each request's mean gap between tokens (AIPerf's inter-token latency; the client keeps
  no per-chunk times). Client figures cover only streamed replies for TTFT and ITL: an unstreamed reply has no
  first token to see.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..core.reply import Reply
from .latency import FIGURES, HistogramSeries, percentiles, server_latency
from .series import Point


def mean_running(series: Mapping[str, Sequence[Point]], t0: float, t1: float) -> float | None:
    """The servers' running gauges over [t0, t1]: each backend's time-weighted mean (steps held between samples),
    summed; None when no backend reports the gauge in the window."""
    total: float | None = None
    for points in series.values():
        pts = [(p[0], p[2]) for p in points if p[2] is not None]
        inside = [(t, v) for t, v in pts if t0 <= t <= t1]
        if not inside:
            continue
        if len(inside) == 1:
            mean = float(inside[0][1])
        else:
            area = sum(v * (tb - ta) for (ta, v), (tb, _) in itertools.pairwise(inside))
            mean = area / (inside[-1][0] - inside[0][0])
        total = (total or 0.0) + mean
    return total


def streams_figure(running: float) -> float:
    """Streams in flight as stats.json gives them: tenths, and two significant digits below one, so that a window
    where requests were open 4% of the time says 0.04, not 0.0 beside a per-stream rate 25 times the fleet's (a fake
    server that answers at once, CI)."""
    return round(running, 1) if running >= 0.95 else float(f"{running:.2g}")


def client_in_flight(replies: Iterable[Reply], t0: float, t1: float) -> float:
    """Mean requests open over [t0, t1]: the sum of each reply's time inside the window over the window's length."""
    if t1 <= t0:
        return 0.0
    busy = sum(max(0.0, min(r.t_end, t1) - max(r.t_start, t0)) for r in replies)
    return busy / (t1 - t0)


def latency_figures(histograms: Mapping[str, HistogramSeries], t0: float, t1: float,
                    client: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """``ttft_s``, ``itl_ms`` and ``e2e_s`` over [t0, t1]: the servers' histograms where every backend of
    ``histograms`` has the figure (``source`` "server", with coverage), else the percentiles of ``client``'s values
    in seconds, figure (``ttft``, ``itl``, ``e2e``) -> values (``source`` "client"); None where neither has any."""
    server = server_latency(histograms, t0, t1)
    out: dict[str, Any] = {}
    for figure, (key, pcts, scale) in FIGURES.items():
        entry = server.get(key)
        if entry is not None and entry["covered_backends"] and len(entry["covered_backends"]) == len(histograms):
            out[key] = entry  # a part of the fleet's histogram is never presented as the fleet's
            continue
        got = client.get(figure) or ()
        if not got:
            out[key] = None
            continue
        ps = percentiles([v * scale for v in got], pcts)
        out[key] = {k: None if v is None else round(v, 4) for k, v in ps.items()} | {
            "n": len(got), "source": "client"}
    return out


def _client_values(replies: Sequence[Reply]) -> dict[str, list[float]]:
    streamed = [r for r in replies if r.ok and r.t_first is not None and r.streamed]
    return {
        "ttft": [r.t_first - r.t_start for r in streamed],  # type: ignore[operator]
        "itl": [(r.t_end - r.t_first) / (r.completion_tokens - 1)  # type: ignore[operator]
                for r in streamed if r.completion_tokens > 1 and r.t_end > r.t_first],  # type: ignore[operator]
        "e2e": [r.t_end - r.t_start for r in replies if r.ok],
    }


def readers(
    replies: Sequence[Reply],
    t0: float,
    t1: float,
    *,
    sustained_tok_s: float | None,
    series: Mapping[str, Sequence[Point]] | None = None,
    histograms: Mapping[str, HistogramSeries] | None = None,
    sections: Sequence[Reply] | None = None,
) -> dict[str, Any]:
    """The ``readers`` figures of the window [t0, t1] (see the module docstring).

    ``replies``: every reply of the run (those of the window are taken); ``sections``: the section replies among
    them, whose decode rates are given (default: all of ``replies``); ``sustained_tok_s``: the server-counted
    sustained rate (None: not counted, then ``per_stream_tok_s`` is the client's usage tokens over the window per
    stream, ``rate_source`` "client"); ``series``/``histograms``: the sampler's, per counted backend."""
    inside = [r for r in replies if r.t_end >= t0 and r.t_start <= t1]
    answered = [r for r in inside if r.ok]
    own = [r for r in (replies if sections is None else sections) if r.ok and r.t_end >= t0 and r.t_start <= t1]
    running = mean_running(series or {}, t0, t1)
    streams_source = "server"
    if not running:
        running = client_in_flight(inside, t0, t1)
        streams_source = "client"
    rate = sustained_tok_s
    rate_source = "server"
    if rate is None:
        rate = sum(r.completion_tokens for r in answered) / (t1 - t0) if t1 > t0 else 0.0
        rate_source = "client"
    decode = [(r.completion_tokens - 1) / (r.t_end - r.t_first) for r in own
              if r.streamed and r.t_first is not None and r.completion_tokens > 1 and r.t_end > r.t_first]
    ps = percentiles(decode, (10, 50, 90))
    latency = latency_figures(histograms or {}, t0, t1, _client_values(answered))
    return {
        "per_stream_tok_s": round(rate / running, 2) if running else None,
        "rate_tok_s": round(rate, 1),
        "streams_in_flight": streams_figure(running) if running else None,
        "streams_source": streams_source,
        "rate_source": rate_source,
        "section_decode_tok_s": ({k: None if v is None else round(v, 2) for k, v in ps.items()}
                                 | {"n": len(decode), "source": "client"}) if decode else None,
        **latency,
    }
