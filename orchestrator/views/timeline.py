"""A picture of the run: in-flight streams per card, the planning requests and their critical path, and the servers'
tokens/s, over time (``--timeline``: OUT/timeline.png and the data under it, OUT/timeline.json).

:class:`RunTimeline` is an event consumer like the progress view and the feed: it keeps one record per request (every
attempt, from NodeStarted to the NodeFinished or NodeFailed of the same node) and the counter samples the job's own
/metrics sampler emits (MetricsSample), so /metrics is not scraped twice. It never asks for Delta events.
``time_scale`` divides every time (and multiplies every rate), so a run on a stretched simulator clock shows model
seconds.

timeline.json keys (times in seconds from JobStarted, divided by ``time_scale``): ``time_scale``, ``unit``,
``end``, ``backends``, ``caps`` (url -> in-flight cap), ``requests`` (``{"kind", "path", "backend", "attempt",
"start", "end", "ok", "error"}`` per attempt; ``ok`` is None for one still open when the data was taken), ``in_flight``
(url -> ``[[t, n], ...]``: n streams from t on), ``max_in_flight`` (url -> n), ``levels`` (``{"level", "nodes",
"t"}``: when every title of a planning level was known), ``critical_path`` (``{"nodes": [{"kind", "path",
"start", "end"}, ...], "last_section_start"}``: the book, the part and the chapter whose titles arrived last, as
one chain), ``tokens_per_s`` (``{"t", "total", "per_backend": {url: [...]}}``, from the servers' counters).

matplotlib is imported only when a chart is drawn (Agg, no display), so ``import orchestrator`` stays light.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..core.events import Delta, JobStarted, LevelPlanned, MetricsSample, NodeFailed, NodeFinished, NodeStarted
from ..core.osutil import atomic_path, atomic_write

PLANNING_KINDS = ("book", "brief", "part", "chapter")  # the brief (--context outline): sections wait for it too


@dataclass(frozen=True)
class Request:
    """One attempt at one node, on one backend; times are time.monotonic(). ``ok`` is None while it is open."""

    kind: str
    path: str
    backend: str
    attempt: int
    start: float
    end: float
    ok: bool | None
    error: str | None = None  # why a failed attempt failed (NodeFailed.error)


class RunTimeline:
    """Collects a job's requests and counter samples from its events; :meth:`data` and :meth:`write` give them."""


    def __init__(self, time_scale: float = 1.0, caps: Mapping[str, int] | None = None):
        """``caps``: each backend's in-flight cap as the fleet holds it (default: the job's ``cap`` setting)."""
        if not time_scale > 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = float(time_scale)
        self.t0: float | None = None
        self.t_last: float | None = None
        self.backends: list[str] = []
        self.caps: dict[str, int] = dict(caps or {})
        self.cap: int | None = None
        self.done: list[Request] = []
        self._open: dict[tuple[str, str], Request] = {}  # (kind, path) -> its attempt in flight
        self._continued: dict[tuple[str, str], Request] = {}  # a reply being continued -> its request, held
        self.levels: list[LevelPlanned] = []
        self.samples: list[MetricsSample] = []

    def __call__(self, ev: Any) -> None:
        if isinstance(ev, Delta):  # a bus with deltas on (a library caller's): nothing here needs them
            return
        t = getattr(ev, "t", None)
        if isinstance(t, float):
            self.t_last = t if self.t_last is None else max(self.t_last, t)
        match ev:
            case JobStarted():
                self._job_started(ev)
            case NodeStarted():
                self._node_started(ev)
            case NodeFinished():
                self._node_finished(ev)
            case NodeFailed():
                if (ev.kind, ev.path) in self._open:
                    self._close((ev.kind, ev.path), ev.t, False, ev.error)
            case LevelPlanned():
                self.levels.append(ev)
            case MetricsSample():
                self._sample(ev)

    def _job_started(self, ev: JobStarted) -> None:
        self.t0 = ev.t
        self.backends = list(ev.backends)
        cap = ev.settings.get("cap")
        self.cap = cap if isinstance(cap, int) else None

    def _node_started(self, ev: NodeStarted) -> None:
        key = (ev.kind, ev.path)
        first = self._open.pop(key, None)
        if first is not None:
            # A continuation of an accepted reply (--finish-truncated). The first reply ended before this
            # request waited for its lease; when is known only from the NodeFinished to come (its reply keeps
            # the first reply's t_end), so it is held until then rather than counted in flight meanwhile.
            self._continued[key] = first
        self._open[key] = Request(ev.kind, ev.path, ev.backend, ev.attempt, ev.t, ev.t, None)

    def _node_finished(self, ev: NodeFinished) -> None:
        key = (ev.kind, ev.path)
        first = self._continued.pop(key, None)
        if first is not None:
            end = ev.reply.t_end if first.start <= ev.reply.t_end <= ev.t else first.start
            self.done.append(Request(first.kind, first.path, first.backend, first.attempt, first.start, end, True))
        started = self._open.get(key)
        if started is not None:  # else answered from the journal: no request
            # the reply's own end lies inside the fleet's lease; the event comes a moment later
            end = ev.reply.t_end if first is None and started.start <= ev.reply.t_end <= ev.t else ev.t
            self._close(key, end, True)

    def _sample(self, ev: MetricsSample) -> None:
        self.samples.append(ev)
        for url in ev.per_backend:
            if url not in self.backends:
                self.backends.append(url)

    def _close(self, key: tuple[str, str], end: float, ok: bool, error: str | None = None) -> None:
        r = self._open.pop(key)
        self.done.append(Request(r.kind, r.path, r.backend, r.attempt, r.start, max(end, r.start), ok, error))

    # -- data ---------------------------------------------------------------------------------------------------

    def requests(self, t_end: float | None = None) -> list[Request]:
        """Every request so far, in start order; one still open ends at ``t_end`` (default: the last event)."""
        end = t_end if t_end is not None else (self.t_last or time.monotonic())
        still = [Request(r.kind, r.path, r.backend, r.attempt, r.start, max(end, r.start), None)
                 for r in (*self._open.values(), *self._continued.values())]
        return sorted(self.done + still, key=lambda r: r.start)

    def data(self, t_end: float | None = None) -> dict[str, Any]:
        """timeline.json (see the module docstring)."""
        reqs = self.requests(t_end)
        t0 = self.t0 if self.t0 is not None else min((r.start for r in reqs), default=0.0)
        end = t_end if t_end is not None else (self.t_last or t0)
        s = self.time_scale

        def rel(t: float) -> float:
            return round((t - t0) / s, 4)

        backends = list(self.backends)
        for r in reqs:
            if r.backend not in backends:
                backends.append(r.backend)
        in_flight = {url: [[rel(t), n] for t, n in steps] for url, steps in _in_flight(reqs, backends).items()}
        chain, last_start = critical_path(reqs)
        return {
            "time_scale": s,
            "unit": "model seconds" if s != 1 else "seconds",
            "end": rel(end),
            "backends": backends,
            "caps": {u: self.caps.get(u, self.cap) for u in backends},
            "requests": [{"kind": r.kind, "path": r.path, "backend": r.backend, "attempt": r.attempt,
                          "start": rel(r.start), "end": rel(r.end), "ok": r.ok, "error": r.error} for r in reqs],
            "in_flight": in_flight,
            "max_in_flight": {url: max((n for _, n in steps), default=0) for url, steps in in_flight.items()},
            "levels": [{"level": lv.level, "nodes": lv.nodes, "t": rel(lv.t)} for lv in self.levels],
            "critical_path": {
                "nodes": [{"kind": k, "path": p, "start": rel(a), "end": rel(b)} for k, p, a, b in chain],
                "last_section_start": None if last_start is None else rel(last_start),
            },
            "tokens_per_s": self._rates(backends, rel),
        }

    def _rates(self, backends: list[str], rel: Any) -> dict[str, Any]:
        """Tokens/s per backend and summed at every sampling round, from the counters the job sampled anyway:
        each backend's rate over its last second (reset-aware, as the sampler's own MetricsSample.rate_tok_s), or
        its last model second on a stretched clock (over a third of a model second, the published take at time
        scale 3 drew a ±10% sawtooth from sample to sample)."""
        span = max(1.0, self.time_scale)
        from ..metrics.series import Point, recent_rate

        series: dict[str, list[Point]] = {u: [] for u in backends}
        ts: list[float] = []
        total: list[float | None] = []
        per: dict[str, list[float | None]] = {u: [] for u in backends}
        for sample in self.samples:
            ts.append(rel(sample.t))
            summed: float | None = None
            for url in backends:
                v = sample.per_backend.get(url) or {}
                rate = None
                if v.get("tokens") is not None:
                    series[url].append((sample.t, v.get("tokens"), v.get("running"), v.get("waiting")))
                    rate = recent_rate(series[url], span)
                if rate is not None:
                    rate *= self.time_scale  # the same tokens over model seconds
                    summed = (summed or 0.0) + rate
                per[url].append(None if rate is None else round(rate, 2))
            total.append(None if summed is None else round(summed, 2))
        return {"t": ts, "total": total, "per_backend": per}

    # -- files --------------------------------------------------------------------------------------------------

    def write(self, png: str | Path, json_path: str | Path | None = None, t_end: float | None = None
              ) -> dict[str, Path]:
        """Write the chart to ``png`` and its data to ``json_path`` (default: beside it, .json); return both."""
        png = Path(png)
        json_path = Path(json_path) if json_path is not None else png.with_suffix(".json")
        data = self.data(t_end)
        atomic_write(json_path, orjson.dumps(data) + b"\n")  # compact: a published take has ~1,700 requests
        with atomic_path(png) as tmp:
            draw(data, tmp)
        return {"timeline": png, "timeline_json": json_path}


def _in_flight(reqs: list[Request], backends: list[str]) -> dict[str, list[tuple[float, int]]]:
    """Per backend, the number of its requests in flight as a step series, starting at 0. An end and a start at the
    same instant count the end first: a slot freed and taken again is one stream, not two."""
    moves: dict[str, list[tuple[float, int]]] = {u: [] for u in backends}
    for r in reqs:
        moves[r.backend] += [(r.start, 1), (r.end, -1)]
    out: dict[str, list[tuple[float, int]]] = {}
    for url, ms in moves.items():
        n = 0
        steps: list[tuple[float, int]] = []
        for t, d in sorted(ms):  # (t, -1) sorts before (t, +1)
            n += d
            if steps and steps[-1][0] == t:
                steps[-1] = (t, n)
            else:
                steps.append((t, n))
        out[url] = steps
    return out


def critical_path(reqs: list[Request]) -> tuple[list[tuple[str, str, float, float]], float | None]:
    """The planning chain whose titles arrived last: the chapter whose list was accepted last, its part and the
    book, each as (kind, path, first attempt's start, accepted reply's end), then the book's brief when it was known
    later still (with ``--context outline`` a section waits for both); and when the last section started (its first
    attempt), where the chain's work ends. Nodes this run did not ask (the journal had them) are left out; no
    chapter asked: an empty chain."""
    spans: dict[tuple[str, str], tuple[float, float]] = {}
    accepted: set[tuple[str, str]] = set()
    for r in reqs:
        if r.kind not in PLANNING_KINDS:
            continue
        if r.ok:  # a node with no accepted reply brought no titles: it is on no path
            accepted.add((r.kind, r.path))
        a, b = spans.get((r.kind, r.path), (r.start, r.end))
        spans[(r.kind, r.path)] = (min(a, r.start), max(b, r.end) if r.ok else b)
    spans = {k: v for k, v in spans.items() if k in accepted}
    firsts: dict[str, float] = {}
    for r in reqs:
        if r.kind == "section":
            firsts[r.path] = min(firsts.get(r.path, r.start), r.start)
    last_start = max(firsts.values(), default=None)
    chapters = [(b, path) for (kind, path), (_, b) in spans.items() if kind == "chapter"]
    if not chapters:
        return [], last_start
    _, chapter = max(chapters)
    chain = []
    for kind, path in (("book", ""), ("part", chapter.split(".")[0]), ("chapter", chapter)):
        if (kind, path) in spans:
            a, b = spans[(kind, path)]
            chain.append((kind, path, a, b))
    brief = next(((k, p) for k, p in spans if k == "brief"), None)
    if brief is not None and chain and spans[brief][1] > chain[-1][3]:
        chain.append((*brief, *spans[brief]))
    return chain, last_start


# -- the chart ---------------------------------------------------------------------------------------------------

def draw(data: dict[str, Any], png: str | Path) -> Path:
    """Three panels over one time axis: in-flight streams per card, the planning requests (critical path
    highlighted) and the servers' tokens/s, summed and per card."""
    # The Figure API renders a .png with Agg whatever backend pyplot has: no display is needed, and a library
    # caller's own pyplot backend (a notebook's) is left alone, which matplotlib.use("Agg") would not do.
    from matplotlib.figure import Figure

    backends: list[str] = data["backends"]
    colours = {u: f"C{i % 10}" for i, u in enumerate(backends)}
    names = {u: f"card {i + 1}" for i, u in enumerate(backends)}
    fig = Figure(figsize=(12, 10), dpi=110, layout="constrained")
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True, height_ratios=[1, 1.5, 1])
    fig.suptitle(f"handbook: the run over {data['unit']}")

    for url in backends:
        steps = data["in_flight"].get(url) or []
        if steps:
            ts, ns = zip(*steps, strict=True)
            ax1.step(ts, ns, where="post", color=colours[url], lw=1, label=names[url])
    # The axis follows the streams: a cap far above the peak (a small job on big cards) would flatten them to the
    # floor, so such a cap is named in the title rather than drawn.
    peak = max([n for n in data["max_in_flight"].values()] + [1])
    caps = sorted({c for c in data["caps"].values() if c})
    drawn = [c for c in caps if c <= 2 * peak]
    for cap in drawn:
        ax1.axhline(cap, color="0.4", ls="--", lw=0.8, label=f"cap {cap}")
    far = [c for c in caps if c not in drawn]
    ax1.set_ylabel("streams in flight")
    ax1.set_title("in-flight streams per card" + (f" (cap {', '.join(map(str, far))}, off the axis)" if far else ""),
                  loc="left", fontsize=10)
    ax1.legend(loc="upper right", fontsize=7, ncols=min(4, len(backends) + 1))

    _planning_panel(ax2, data)

    rates = data["tokens_per_s"]
    for url in backends:
        ax3.plot(rates["t"], _nan(rates["per_backend"].get(url, [])), color=colours[url], lw=0.7, alpha=0.8,
                 label=names[url])
    ax3.plot(rates["t"], _nan(rates["total"]), color="black", lw=1.6, label="all cards")
    ax3.set_ylabel("tokens/s (counters)")
    ax3.set_xlabel(data["unit"])
    ax3.set_title("generation tokens/s from the servers' counters", loc="left", fontsize=10)
    ax3.set_ylim(0, 1.3 * max([v for v in rates["total"] if v] or [1.0]))  # room for the legend above the lines
    ax3.legend(loc="upper right", fontsize=7, ncols=min(4, len(backends) + 1))

    last = data["critical_path"]["last_section_start"]
    for ax in (ax1, ax2, ax3):
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.set_xlim(0, max(data["end"], 1e-3))
        if last is not None:
            ax.axvline(last, color="crimson", ls=":", lw=1)
    ax1.set_ylim(0, 1.25 * max([*drawn, peak]))
    png = Path(png)
    fig.savefig(png)
    return png


def _planning_panel(ax: Any, data: dict[str, Any]) -> None:
    """One row per planning node (book, parts, chapters in outline order), one bar per attempt; a failed attempt
    is hatched; the critical path in crimson, joined by a line that ends where the last section started."""
    plan = [r for r in data["requests"] if r["kind"] in PLANNING_KINDS]
    order = {"book": 0, "brief": 1, "part": 2, "chapter": 3}
    rows = sorted({(r["kind"], r["path"]) for r in plan},
                  key=lambda kp: (order[kp[0]], [int(x) for x in kp[1].split(".") if x.isdigit()]))
    y = {kp: i for i, kp in enumerate(rows)}
    on_path = {(n["kind"], n["path"]) for n in data["critical_path"]["nodes"]}
    shade = {"book": "#4c72b0", "brief": "#c44e52", "part": "#55a868", "chapter": "#8da0cb"}
    for r in plan:
        key = (r["kind"], r["path"])
        colour = "crimson" if key in on_path else shade[r["kind"]]
        ax.barh(y[key], max(r["end"] - r["start"], 1e-3), left=r["start"], height=0.8, color=colour,
                hatch="////" if r["ok"] is False else None, alpha=0.55 if r["ok"] is False else 1.0, lw=0)
    chain = data["critical_path"]["nodes"]
    if chain:
        xs = [n["end"] for n in chain]
        ys = [y[(n["kind"], n["path"])] for n in chain]
        last = data["critical_path"]["last_section_start"]
        if last is not None:
            xs.append(last)
            ys.append(ys[-1])
        ax.plot(xs, ys, color="crimson", lw=1.2, marker="o", ms=3,
                label="critical path: " + " -> ".join(n["kind"] + (f" {n['path']}" if n["path"] else "")
                                                     for n in chain) + " -> last section starts")
        ax.legend(loc="lower right", fontsize=7)
    ticks: list[tuple[float, str]] = []  # one label per kind, at the middle of its rows
    for kind in order:
        ys_kind = [y[kp] for kp in rows if kp[0] == kind]
        if ys_kind:
            ticks.append(((ys_kind[0] + ys_kind[-1]) / 2, f"{kind}s ({len(ys_kind)})" if kind != "book" else kind))
    ax.set_yticks([t for t, _ in ticks], [label for _, label in ticks])
    ax.set_ylim(len(rows) - 0.5 if rows else 1, -0.5)  # the book on top
    for lv in data["levels"]:
        ax.axvline(lv["t"], color="0.5", ls="--", lw=0.7)
    ax.set_title("planning requests (one bar per attempt; hatched: failed; dashed: a level's titles all known)",
                 loc="left", fontsize=10)


def _nan(values: list[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]
