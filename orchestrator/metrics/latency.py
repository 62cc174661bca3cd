"""The servers' latency histograms: time to first token, inter-token latency and end-to-end latency.

Names (vllm-project/vllm vllm/v1/metrics/loggers.py; sgl-project/sglang python/sglang/srt/metrics/collector.py),
tried in this order for each figure, the first one a page carries being the one read:

* ``ttft``: ``vllm:time_to_first_token_seconds``, ``sglang:time_to_first_token_seconds``;
* ``itl``: ``vllm:inter_token_latency_seconds`` (vLLM 0.11 on), ``vllm:time_per_output_token_seconds`` (vLLM
  before 0.11 observed each token's gap under this name), ``sglang:inter_token_latency_seconds``;
* ``e2e``: ``vllm:e2e_request_latency_seconds``, ``sglang:e2e_request_latency_seconds``.

llama.cpp and TGI publish no such histograms: their figures are the client's.

Percentiles over a window follow Prometheus' ``histogram_quantile`` on the buckets' increases: the bucket that
holds the rank, linearly interpolated inside it (from 0 for the first bucket); a rank in the +Inf bucket reads
as the highest finite bound. A percentile is then only as fine as the server's buckets (vLLM's ITL buckets step
25 ms around 50-100 ms), which is the price of reading the server's own figure.

:class:`HistogramSeries` keeps a backend's snapshots in time order, thinned by halves past
:data:`MAX_SNAPSHOTS` so that a run of days stays in bounded memory (the window's ends then fall within
duration / 1,024 of the asked times).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
            "sglang:inter_token_latency_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
}
# figure -> (stats key, percentiles, scale from seconds): the conventions of `vllm bench serve` (ms for ITL)
FIGURES: dict[str, tuple[str, tuple[int, ...], float]] = {
    "ttft": ("ttft_s", (50, 95, 99), 1.0),
    "itl": ("itl_ms", (50, 99), 1000.0),
    "e2e": ("e2e_s", (50, 95, 99), 1.0),
}
MAX_SNAPSHOTS = 2048

_ALL = {n for names in HISTOGRAMS.values() for n in names}
_SUFFIXES = ("_bucket", "_count", "_sum")


@dataclass(frozen=True)
class Histogram:
    """One histogram summed over its label sets: finite upper bounds in order, cumulative counts (one per bound,
    then the +Inf bucket's, which is the total) and the sum of observations."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total_sum: float = 0.0

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The increase since ``earlier`` (a reset, any count fallen, or other bounds: this histogram whole)."""
        if earlier is None or earlier.bounds != self.bounds or any(
                b < a for a, b in zip(earlier.counts, self.counts, strict=True)):
            return self
        return Histogram(self.bounds, tuple(b - a for a, b in zip(earlier.counts, self.counts, strict=True)),
                         self.total_sum - earlier.total_sum)

    def plus(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            raise ValueError("histograms with different buckets cannot be added")
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)),
                         self.total_sum + other.total_sum)

    def quantile(self, q: float) -> float | None:
        """Prometheus' ``histogram_quantile(q)``; None when the histogram holds no observation."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        prev_bound, prev_count = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.counts, strict=False):
            if cum >= rank:
                if cum == prev_count:
                    return bound
                lo = prev_bound if prev_bound < bound else 0.0
                return lo + (bound - lo) * (rank - prev_count) / (cum - prev_count)
            prev_bound, prev_count = bound, cum
        return self.bounds[-1] if self.bounds else None


Snapshot = dict[str, tuple[str, Histogram]]
"""One page's histograms: figure (``ttft``, ``itl``, ``e2e``) -> (the metric name read, its histogram)."""


def _base(name: str) -> str | None:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            return stem if stem in _ALL else None
    return None


def _relevant(text: str) -> str:
    """Only the histograms' lines (and their HELP/TYPE): a vLLM page is hundreds of lines."""
    keep: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in _ALL:
                keep.append(line)
            continue
        end = min((i for i in (line.find("{"), line.find(" ")) if i != -1), default=len(line))
        if _base(line[:end]) is not None:
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_histograms(text: str) -> Snapshot:
    """The latency histograms on a Prometheus page, each summed over its label sets (engines, models).

    Raises ``ValueError`` on text the parser rejects."""
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(_relevant(text)):
        for sample in family.samples:
            base = _base(sample.name)
            if base is None or math.isnan(sample.value):
                continue
            if sample.name.endswith("_bucket"):
                le = float(sample.labels.get("le", "nan"))
                if not math.isnan(le):
                    b = buckets.setdefault(base, {})
                    b[le] = b.get(le, 0.0) + float(sample.value)
            elif sample.name.endswith("_sum"):
                sums[base] = sums.get(base, 0.0) + float(sample.value)
    snap: Snapshot = {}
    for figure, names in HISTOGRAMS.items():
        name = next((n for n in names if n in buckets and math.inf in buckets[n]), None)
        if name is None:
            continue
        b = buckets[name]
        bounds = tuple(sorted(le for le in b if le != math.inf))
        snap[figure] = (name, Histogram(bounds, tuple(b[le] for le in (*bounds, math.inf)), sums.get(name, 0.0)))
    return snap


class HistogramSeries:
    """One backend's snapshots in time order, at most :data:`MAX_SNAPSHOTS` of them (halved when full)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.snaps: list[Snapshot] = []

    def add(self, t: float, snap: Snapshot) -> None:
        if not snap:
            return
        if self.times and t < self.times[-1]:  # an overlapping scrape finished out of order
            i = bisect.bisect_right(self.times, t)
            self.times.insert(i, t)
            self.snaps.insert(i, snap)
        else:
            self.times.append(t)
            self.snaps.append(snap)
        if len(self.times) > MAX_SNAPSHOTS:  # keep every other one, and always the latest
            keep = list(range(len(self.times) - 1, -1, -2))[::-1]
            self.times = [self.times[i] for i in keep]
            self.snaps = [self.snaps[i] for i in keep]

    def window(self, t0: float, t1: float) -> Snapshot:
        """Each figure's increase from the last snapshot at or before t0 (else the first) to the first at or after
        t1 (else the last); empty without two snapshots."""
        if len(self.times) < 2 or t1 <= t0:
            return {}
        i0 = max(0, bisect.bisect_right(self.times, t0) - 1)
        i1 = min(len(self.times) - 1, bisect.bisect_left(self.times, t1))
        if i1 <= i0:
            return {}
        start, end = self.snaps[i0], self.snaps[i1]
        out: Snapshot = {}
        for figure, (name, hist) in end.items():
            before = start.get(figure)
            out[figure] = (name, hist.minus(before[1] if before is not None and before[0] == name else None))
        return out


def server_latency(series: Mapping[str, HistogramSeries], t0: float, t1: float) -> dict[str, Any]:
    """The fleet's latency percentiles over [t0, t1], from the backends whose pages carry the histograms.

    Returns, per stats key (``ttft_s``, ``itl_ms``, ``e2e_s``) that some backend has: ``{"p50", ..., "n",
    "source": "server", "metric", "covered_backends", "coverage": "k of n"}``; a key no backend has is left out
    (the caller falls back to the client's figure). Backends whose buckets differ from the first's are left out
    of the sum and out of the coverage."""
    out: dict[str, Any] = {}
    windows = {u: s.window(t0, t1) for u, s in series.items()}
    for figure, (key, pcts, scale) in FIGURES.items():
        total: Histogram | None = None
        names: dict[str, None] = {}
        covered: list[str] = []
        for url, snap in windows.items():
            got = snap.get(figure)
            if got is None:
                continue
            name, hist = got
            if total is not None and hist.bounds != total.bounds:
                continue
            total = hist if total is None else total.plus(hist)
            names[name] = None
            covered.append(url)
        if total is None or total.count <= 0:
            continue
        entry: dict[str, Any] = {}
        for p in pcts:
            v = total.quantile(p / 100)
            entry[f"p{p}"] = None if v is None else round(v * scale, 4)
        out[key] = {**entry, "n": int(total.count), "source": "server", "metric": " + ".join(names),
                    "covered_backends": covered, "coverage": f"{len(covered)} of {len(series)}"}
    return out


def percentiles(values: Sequence[float], pcts: Sequence[int]) -> dict[str, float | None]:
    """``p<k>`` of ``values`` by linear interpolation between closest ranks (numpy's default, which
    `vllm bench serve` uses); None for an empty sequence."""
    s = sorted(values)
    out: dict[str, float | None] = {}
    for p in pcts:
        if not s:
            out[f"p{p}"] = None
            continue
        pos = (len(s) - 1) * p / 100
        lo = math.floor(pos)
        hi = min(lo + 1, len(s) - 1)
        out[f"p{p}"] = s[lo] + (s[hi] - s[lo]) * (pos - lo)
    return out
