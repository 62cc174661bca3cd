"""GPU power and energy: NVIDIA dcgm-exporter's page read, and energy and tokens per joule over a window.

dcgm-exporter's default counters (NVIDIA/dcgm-exporter etc/default-counters.csv), each series labelled ``gpu``
(the index), ``UUID``, ``device``, ``modelName``, ``Hostname``:

* ``DCGM_FI_DEV_POWER_USAGE``: gauge, the power draw in W;
* ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``: counter, the energy since boot in mJ.

A backend names the page and which GPU is its (``--power URL#gpu=LABEL``, :func:`~orchestrator.core.config.
split_power`): the series whose ``gpu`` label or ``UUID`` is LABEL; without a label, every GPU on the page summed
(a server that spans the node's GPUs). Several backends may share one page, each with its own label.

Energy over a window [t0, t1] (:func:`energy_over`) is the energy counter's increase where the page carries it
(interpolated between samples and reset-aware, as the token counters are), else the power gauge integrated over
the samples (trapezoids, the gauge held at its first/last sample outside them); ``energy_source`` says which
("counter" or "power-integrated"). ``power_w`` is the window's mean draw: the gauge's time average where there is
a gauge, else energy / length.

Coverage (:func:`power_figures`): the fleet's watts and joules are sums over the backends that have power samples
only, and ``tokens_per_joule`` divides only those backends' server-counted tokens by them, so a part of the fleet is
never presented as the whole; the result says "k of n backends" and why each other one has none.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .series import Point, counter_increase

POWER_METRIC = "DCGM_FI_DEV_POWER_USAGE"
ENERGY_METRIC = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
_NAMES = (POWER_METRIC, ENERGY_METRIC)

PowerPoint = tuple[float, float | None, float | None]
"""One power sample of one backend: (t = time.monotonic(), power W, energy counter mJ); None where absent."""


@dataclass(frozen=True)
class PowerReading:
    """What one dcgm page says of one backend's GPU(s): the power (W) and the energy counter (mJ), summed over the
    matching series; None where the page has no such series. ``gpus``: the ``gpu`` labels the page carries."""

    power_w: float | None = None
    energy_mj: float | None = None
    matched: int = 0  # series (GPUs) that matched the label
    gpus: tuple[str, ...] = ()


def _relevant(text: str) -> str:
    """The dcgm lines we read (samples and their HELP/TYPE lines): a page is dozens of metrics per GPU."""
    keep = []
    for line in text.splitlines():
        if line.startswith(_NAMES):
            keep.append(line)
        elif line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2] in _NAMES:
                keep.append(line)
    return "\n".join(keep) + "\n"


def parse_dcgm(text: str, gpu: str | None = None) -> PowerReading:
    """Read a dcgm-exporter page for the GPU ``gpu`` (its ``gpu`` label or ``UUID``; None: all GPUs, summed).

    Uses ``prometheus_client.parser``; raises ``ValueError`` on text it rejects."""
    sums: dict[str, float] = {}
    matched: set[tuple[str, str]] = set()
    gpus: dict[str, None] = {}
    for family in text_string_to_metric_families(_relevant(text)):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name not in _NAMES or math.isnan(sample.value):
                continue
            label = sample.labels.get("gpu", "")
            gpus.setdefault(label)
            if gpu is not None and gpu not in (label, sample.labels.get("UUID")):
                continue
            sums[name] = sums.get(name, 0.0) + float(sample.value)
            matched.add((label, sample.labels.get("UUID", "")))
    return PowerReading(sums.get(POWER_METRIC), sums.get(ENERGY_METRIC), len(matched), tuple(gpus))


def _gauge_integral(points: Sequence[PowerPoint], t0: float, t1: float) -> float | None:
    """Joules of the power gauge over [t0, t1]: trapezoids between samples, held constant outside them."""
    pts = sorted((p[0], float(p[1])) for p in points if p[1] is not None)
    if not pts or t1 <= t0:
        return None
    ts = [t for t, _ in pts]
    ws = [w for _, w in pts]

    def at(t: float) -> float:
        if t <= ts[0]:
            return ws[0]
        if t >= ts[-1]:
            return ws[-1]
        i = bisect.bisect_left(ts, t)
        return ws[i - 1] + (ws[i] - ws[i - 1]) * (t - ts[i - 1]) / (ts[i] - ts[i - 1])

    grid = [t0, *(t for t in ts if t0 < t < t1), t1]
    return sum((b - a) * (at(a) + at(b)) / 2 for a, b in itertools.pairwise(grid))


def energy_over(points: Sequence[PowerPoint], t0: float, t1: float) -> tuple[float, str, float] | None:
    """(joules, energy_source, mean watts) of one backend's power samples over [t0, t1]; None without samples.

    The counter's increase where at least two samples carry it, else the gauge integrated ("power-integrated")."""
    if t1 <= t0:
        return None
    gauge = _gauge_integral(points, t0, t1)
    with_counter = [p for p in points if p[2] is not None]
    if len(with_counter) >= 2:
        as_points: list[Point] = [(p[0], p[2], None, None) for p in with_counter]
        joules = counter_increase({"gpu": as_points}, t0, t1) / 1000.0
        return joules, "counter", (gauge if gauge is not None else joules) / (t1 - t0)
    if gauge is None:
        return None
    return gauge, "power-integrated", gauge / (t1 - t0)


def power_figures(
    series: Mapping[str, Sequence[PowerPoint]],
    t0: float,
    t1: float,
    tokens: Mapping[str, float],
    *,
    reasons: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The fleet's power over [t0, t1]: ``{"available": True, "power_w", "energy_j", "energy_source",
    "tokens_per_joule", "tokens", "covered_backends", "uncovered_backends", "covered_share", "coverage",
    "per_backend"}``, or ``{"available": False, "reason", "uncovered_backends"}`` when no backend has power.

    ``series``: url -> power samples of every backend of the fleet (empty: none); ``tokens``: url -> the server-
    counted tokens of that backend over the window (absent: not counted). ``tokens_per_joule`` divides the covered
    backends' tokens by their joules (None when one of them has no token count)."""
    why = reasons or {}
    per: dict[str, dict[str, Any]] = {}
    for url, points in series.items():
        e = energy_over(points, t0, t1)
        if e is not None:
            per[url] = {"power_w": round(e[2], 1), "energy_j": round(e[0], 1), "energy_source": e[1]}
    uncovered = [{"url": u, "reason": why.get(u, "no power samples in the window")} for u in series if u not in per]
    n = len(series)
    if not per:
        said = {b["reason"] for b in uncovered}
        reason = (said.pop() if len(said) == 1 else "; ".join(f"{b['url']}: {b['reason']}" for b in uncovered)
                  ) if said else "no backend was sampled"
        return {"available": False, "reason": reason, "uncovered_backends": uncovered}
    joules = sum(p["energy_j"] for p in per.values())
    counted = [tokens.get(u) for u in per]
    toks = None if any(t is None for t in counted) else sum(t or 0.0 for t in counted)
    sources = sorted({p["energy_source"] for p in per.values()})
    return {
        "available": True,
        "power_w": round(sum(p["power_w"] for p in per.values()), 1),
        "energy_j": round(joules, 1),
        "energy_source": " + ".join(sources),
        "tokens_per_joule": round(toks / joules, 3) if toks is not None and joules > 0 else None,
        "tokens": None if toks is None else round(toks),
        "covered_backends": list(per),
        "uncovered_backends": uncovered,
        "covered_share": round(len(per) / n, 4),
        "coverage": f"{len(per)} of {n} backend{'s' if n != 1 else ''}",
        "per_backend": per,
    }


def power_label(figures: Mapping[str, Any]) -> str:
    """"power" or "power (k of n backends)" when the figures cover only part of the fleet."""
    covered = figures.get("covered_backends") or ()
    n = len(covered) + len(figures.get("uncovered_backends") or ())
    return "power" if len(covered) == n else f"power ({len(covered)} of {n} backends)"


class PowerSampler:
    """Each backend's power samples, scraped in the rounds of :class:`~orchestrator.metrics.MetricsSampler`.

    ``endpoints``: backend url -> its power spec (``URL[#gpu=LABEL]``, or None: no power for it). A page several
    backends share is fetched once per round and read for each backend's label. ``series[url]`` holds the
    :data:`PowerPoint` of each backend that has a spec; ``last_failure[url]`` says why its last scrape gave nothing.
    """

    def __init__(self, endpoints: Mapping[str, str | None]):
        from ..core.config import split_power

        self.urls = list(endpoints)
        self.specs: dict[str, tuple[str, str | None]] = {u: split_power(s) for u, s in endpoints.items() if s}
        self.series: dict[str, list[PowerPoint]] = {u: [] for u in self.specs}
        self.last_failure: dict[str, str | None] = {u: None for u in self.specs}
        self.errors = 0

    @property
    def active(self) -> bool:
        return bool(self.specs)

    async def round(self, session: Any, limit_s: float) -> None:
        """Fetch every page once (concurrently), then read each backend's GPU from its page."""
        import time

        import aiohttp
        import anyio

        pages: dict[str, str | BaseException] = {}
        t_mid: dict[str, float] = {}

        async def fetch(page: str) -> None:
            t_send = time.monotonic()
            try:
                with anyio.fail_after(limit_s):
                    async with session.get(page) as resp:
                        if resp.status != 200:
                            raise ValueError(f"HTTP {resp.status}")
                        pages[page] = await resp.text()
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
                pages[page] = e
            t_mid[page] = (t_send + time.monotonic()) / 2

        async with anyio.create_task_group() as tg:
            for page in dict.fromkeys(p for p, _ in self.specs.values()):
                tg.start_soon(fetch, page)
        for url, (page, gpu) in self.specs.items():
            self._read(url, page, gpu, pages.get(page), t_mid.get(page, time.monotonic()))

    def _read(self, url: str, page: str, gpu: str | None, got: str | BaseException | None, t: float) -> None:
        if not isinstance(got, str):
            self.errors += 1
            self.last_failure[url] = f"{page} unreachable ({type(got).__name__}: {got})".replace(": )", ")")
            return
        try:
            r = parse_dcgm(got, gpu)
        except ValueError as e:
            self.errors += 1
            self.last_failure[url] = f"{page} is not Prometheus text the parser reads ({e})"
            return
        if r.power_w is None and r.energy_mj is None:
            self.last_failure[url] = (
                f"no series with gpu={gpu} on {page} (gpus there: {', '.join(r.gpus) or 'none'})"
                if gpu is not None and r.gpus else f"no {POWER_METRIC} or {ENERGY_METRIC} on {page}"
            )
            return
        points = self.series[url]
        point: PowerPoint = (t, r.power_w, r.energy_mj)
        if points and t < points[-1][0]:
            bisect.insort(points, point, key=lambda p: p[0])
        else:
            points.append(point)

    def reasons(self) -> dict[str, str]:
        """Why each backend without power samples has none, in words."""
        out = {}
        for u in self.urls:
            if u not in self.specs:
                out[u] = "no --power endpoint given"
            elif not self.series[u]:
                out[u] = self.last_failure[u] or "its power endpoint was never scraped"
        return out

    def figures(self, t0: float, t1: float, tokens: Mapping[str, float]) -> dict[str, Any]:
        """:func:`power_figures` over [t0, t1] for every backend (those without a spec listed as uncovered)."""
        series = {u: self.series.get(u, []) for u in self.urls}
        return power_figures(series, t0, t1, tokens, reasons=self.reasons())
