"""The bench's outputs: the rich tables (reference Tables 1 and 2), ladder.json/.csv and an SVG chart.

Everything here is pure (values in, text or files out); the SVG chart is drawn with matplotlib (imported only
when a chart is drawn).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rich import box
from rich.console import Console
from rich.table import Table

from ..core.osutil import atomic_write
from .fit import predicted_total

LEVEL_KEYS = (
    "streams",
    "sustained_tok_s",
    "best_second_tok_s",
    "per_stream_tok_s",
    "step_ms",
    "ttft_median_ms",
    "running",
    "waiting",
    "power_w",
    "energy_j",
    "tokens_per_joule",
    "prefix_cache_hit_rate",
)


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return f"{v:,.{digits}f}"
    return str(v)


def _count(v: Any) -> str:
    """Gauge medians: whole numbers without decimals, halves (a median of an even count) with one."""
    if v is None:
        return "-"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def ladder_table(ladder: dict[str, Any]) -> Table:
    """Reference Table 1: one row per level; a level the servers cannot hold (waiting > 0) is flagged in red."""
    k = len(ladder.get("backends") or [1])
    title = f"Throughput ladder: {k} server{'s' if k != 1 else ''}"
    if ladder.get("model"):
        title += f", {ladder['model']}"
    title += f", window {_fmt(ladder.get('window_s'))} s, max_tokens {ladder.get('max_tokens', '-')}"
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("streams" + ("\nper server" if k > 1 else ""), justify="right")
    t.add_column("sustained\ntok/s", justify="right")
    t.add_column("best second\ntok/s", justify="right")
    t.add_column("per stream\ntok/s", justify="right")
    t.add_column("step\nms", justify="right")
    t.add_column("TTFT median\nms", justify="right")
    t.add_column("running", justify="right")
    t.add_column("waiting", justify="right")
    power = any(lv.get("power_w") is not None for lv in ladder["levels"])
    if power:
        t.add_column("power\nW", justify="right")
        t.add_column("tokens\nper joule", justify="right")
    kv = any(lv.get("kv_cache_usage") for lv in ladder["levels"])
    if kv:
        t.add_column("KV cache\nmedian", justify="right")
    itl = any(lv.get("itl_ms") for lv in ladder["levels"])
    if itl:
        t.add_column("ITL p50/p99\nms", justify="right")
    if any(not lv.get("held", True) or _odd_metric(lv) or _part_power(lv) for lv in ladder["levels"]):
        t.add_column("note")
    for lv in ladder["levels"]:
        held = lv.get("held", True)
        row = [
            str(lv["streams"]),
            _fmt(lv["sustained_tok_s"]),
            _fmt(lv["best_second_tok_s"]),
            _fmt(lv["per_stream_tok_s"], 1),
            _fmt(lv["step_ms"], 2),
            _fmt(lv["ttft_median_ms"], 0),
            _count(lv["running"]),
            _count(lv["waiting"]),
        ]
        row += _optional_cells(lv, power=power, kv=kv, itl=itl)
        if len(t.columns) > len(row):
            row.append(_notes(lv, held))
        t.add_row(*row, style=None if held else "bold red")
    return t


def _optional_cells(lv: dict[str, Any], *, power: bool, kv: bool, itl: bool) -> list[str]:
    """A level's cells of the columns shown only when some level has them: power, KV fill, ITL."""
    cells = []
    if power:
        cells += [_fmt(lv.get("power_w")), _fmt(lv.get("tokens_per_joule"), 3)]
    if kv:
        fill = lv.get("kv_cache_usage")
        cells.append(f"{100 * fill['median']:.0f}%" if fill else "-")
    if itl:
        cells.append(_itl(lv.get("itl_ms")))
    return cells


def _notes(lv: dict[str, Any], held: bool) -> str:
    notes = [] if held else ["NOT HELD"]
    if _odd_metric(lv):
        notes.append(str(lv["metric"]))
    if _part_power(lv):
        notes.append(f"power of {lv['power']['coverage']}")
    return "; ".join(notes)


def _itl(entry: dict[str, Any] | None) -> str:
    """A level's inter-token latency, p50/p99 in ms, marked "(client)" when the servers have no histogram."""
    if not entry:
        return "-"
    got = f"{_fmt(entry.get('p50'), 1)}/{_fmt(entry.get('p99'), 1)}"
    return got if entry.get("source") == "server" else got + " (client)"


def _part_power(lv: dict[str, Any]) -> bool:
    """Power figures that cover only some of the servers."""
    p = lv.get("power") or {}
    return lv.get("power_w") is not None and p.get("covered_share", 1) < 1


def _odd_metric(lv: dict[str, Any]) -> bool:
    return bool(lv.get("metric")) and lv["metric"] != "vllm:generation_tokens_total"


def compare_table(a: dict[str, Any], b: dict[str, Any], label_a: str, label_b: str) -> Table:
    """Reference Table 2: B against A at every stream count both measured (ratio = B / A)."""
    by_a = {lv["streams"]: lv for lv in a["levels"]}
    t = Table(title=f"{label_b} against {label_a}", title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("streams", justify="right")
    t.add_column(f"{label_a} tok/s", justify="right")
    t.add_column(f"{label_b} tok/s", justify="right")
    t.add_column("ratio", justify="right")
    t.add_column(f"{label_b} TTFT median ms", justify="right")
    t.add_column("running", justify="right")
    t.add_column("waiting", justify="right")
    for lv in b["levels"]:
        base = by_a.get(lv["streams"])
        if base is None:
            continue
        ra, rb = base.get("sustained_tok_s"), lv.get("sustained_tok_s")
        ratio = rb / ra if ra and rb is not None else None
        held = lv.get("held", not (lv.get("waiting") or 0) > 0)
        t.add_row(
            str(lv["streams"]),
            _fmt(ra),
            _fmt(rb),
            f"{ratio:.2f}" if ratio is not None else "-",
            _fmt(lv.get("ttft_median_ms"), 0),
            _count(lv.get("running")),
            _count(lv.get("waiting")),
            style=None if held else "bold red",
        )
    return t


def write_outputs(ladder: dict[str, Any], out: Path) -> None:
    """``ladder.json``, ``ladder.csv`` and ``ladder.svg`` into ``out``."""
    atomic_write(out / "ladder.json", orjson.dumps(ladder, option=orjson.OPT_INDENT_2) + b"\n")
    write_csv(out / "ladder.csv", ladder["levels"])
    atomic_write(out / "ladder.svg", chart_svg(ladder))


def write_csv(path: Path, levels: Sequence[dict[str, Any]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*LEVEL_KEYS, "held"])
    for lv in levels:
        w.writerow([("" if lv.get(k) is None else lv.get(k)) for k in LEVEL_KEYS] + [lv.get("held", True)])
    atomic_write(path, buf.getvalue())


# ------------------------------------------------------------------------------------------------ SVG chart

BLUE, ORANGE, GREY = "#1f5fbf", "#d9730d", "#888888"
FIT_DASH, CEILING_DASH = (0, (5, 4)), (0, (1, 3))


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def _text(s: str) -> str:
    """A label drawn as it is written: a ``$`` (a model's name may hold one) is not matplotlib's mathtext."""
    return s.replace("$", r"\$")


@dataclass(frozen=True)
class _ChartData:
    """What the ladder chart shows: the levels measured, the servers, the fit and the axes' ranges."""

    levels: list[dict[str, Any]]  # those with a sustained rate
    k: int  # servers
    xs: list[float]  # stream counts (per server); [1.0] when none
    x_range: tuple[float, float]  # log2 of the x axis's ends
    fit: dict[str, Any] | None
    ceiling: float | None  # the fit's implied ceiling, all servers together (tok/s)
    tot_max: float  # the left axis's top (total tok/s)
    per_max: float  # the right axis's top (per-stream tok/s)

    @classmethod
    def of(cls, ladder: dict[str, Any]) -> _ChartData:
        levels = [lv for lv in ladder["levels"] if lv.get("sustained_tok_s") is not None]
        k = max(1, len(ladder.get("backends") or [1]))
        xs = [float(lv["streams"]) for lv in levels] or [1.0]
        lx_min, lx_max = math.log2(min(xs)), math.log2(max(xs))
        if lx_max - lx_min < 1e-9:
            lx_min, lx_max = lx_min - 1, lx_max + 1
        fit = ladder.get("fit")
        ceiling = k * fit["ceiling_tok_s"] if fit and fit.get("ceiling_tok_s") else None
        tot_max = _nice_max(max(
            [ceiling or 0]
            + [lv["sustained_tok_s"] for lv in levels]
            + [lv.get("best_second_tok_s") or 0 for lv in levels]
            + [predicted_total(fit, x, k) or 0 for x in xs]
            + [1.0]
        ))
        per_max = _nice_max(max([lv.get("per_stream_tok_s") or 0 for lv in levels] + [1.0]))
        return cls(levels, k, xs, (lx_min, lx_max), fit, ceiling, tot_max, per_max)

    def title(self, model: str | None) -> str:
        title = "Throughput ladder"
        if model:
            title += f" - {model}"
        return title + f" ({self.k} server{'s' if self.k != 1 else ''}; read from the servers' counters)"

    def fit_curve(self, steps: int = 64) -> tuple[list[float], list[float]]:
        """The fit's predicted total tok/s over the x axis (log-spaced), where it predicts one."""
        ns: list[float] = []
        ps: list[float] = []
        if self.fit and len(self.xs) >= 2:
            lx_min, lx_max = self.x_range
            for i in range(steps + 1):
                n = 2 ** (lx_min + (lx_max - lx_min) * i / steps)
                p = predicted_total(self.fit, n, self.k)
                if p is not None:
                    ns.append(n)
                    ps.append(p)
        return ns, ps


def chart_svg(ladder: dict[str, Any]) -> str:
    """Total and per-stream tok/s against streams (log2 x axis), the fit's prediction dashed; one SVG string.

    Drawn with matplotlib's Figure API (no pyplot, no display; imported only here, so ``import orchestrator``
    stays light). The text stays text in the SVG, and the same ladder gives the same SVG (fixed ids, no date).
    Each series is a group whose id names it: total, per-stream, fit, ceiling, not-held."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    c = _ChartData.of(ladder)
    fig = Figure(figsize=(7.6, 4.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    right = ax.twinx()
    fig.suptitle(_text(c.title(ladder.get("model"))), fontsize=12)
    _chart_axes(c, ax, right)
    handles = _chart_series(c, ax, right)
    # the legend in two columns under the plot, read row by row (matplotlib fills a column first)
    fig.legend(handles=handles[0::2] + handles[1::2], loc="outside lower center", ncols=2, frameon=False,
               fontsize=9, handlelength=3)
    buf = io.StringIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "ladder"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def _chart_axes(c: _ChartData, ax: Any, right: Any) -> None:
    """The log2 streams axis (a tick at every level), total tok/s on the left, per-stream tok/s on the right,
    both in fifths of their range."""
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xlim(2 ** c.x_range[0], 2 ** c.x_range[1])
    ticks = sorted(set(c.xs))
    ax.set_xticks(ticks, [str(int(x)) for x in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(f"streams{' per server' if c.k > 1 else ''} (log scale)")
    ax.set_ylim(0, c.tot_max)
    ax.set_yticks([c.tot_max * i / 5 for i in range(6)], [f"{c.tot_max * i / 5:,.0f}" for i in range(6)])
    ax.set_ylabel("total tok/s (sustained)", color=BLUE)
    ax.tick_params(axis="y", labelcolor=BLUE)
    right.set_ylim(0, c.per_max)
    right.set_yticks([c.per_max * i / 5 for i in range(6)], [f"{c.per_max * i / 5:,.1f}" for i in range(6)])
    right.set_ylabel("per-stream tok/s", color=ORANGE, rotation=270, labelpad=14)
    right.tick_params(axis="y", labelcolor=ORANGE)
    ax.grid(axis="y", color="#e5e5e5")
    ax.grid(axis="x", color="#f0f0f0")
    ax.set_axisbelow(True)
    for a in (ax, right):
        for spine in a.spines.values():
            spine.set_color("#444444")


def _chart_series(c: _ChartData, ax: Any, right: Any) -> list[Any]:
    """Draw the series; returns the legend's entries, in the legend's order."""
    handles: list[Any] = []
    total = [(float(lv["streams"]), lv["sustained_tok_s"]) for lv in c.levels]
    per = [(float(lv["streams"]), lv["per_stream_tok_s"]) for lv in c.levels if lv.get("per_stream_tok_s")]
    for axis, values, color, gid, label in ((ax, total, BLUE, "total", "total tok/s (left axis)"),
                                            (right, per, ORANGE, "per-stream", "per-stream tok/s (right axis)")):
        (line,) = axis.plot([x for x, _ in values], [v for _, v in values], color=color, linewidth=2, marker="o",
                            markersize=7, label=label, gid=gid, clip_on=False)
        handles.append(line)
    ns, ps = c.fit_curve()
    if ns:
        ax.plot(ns, ps, color=GREY, linewidth=1, linestyle=FIT_DASH, gid="fit")
    if c.fit:
        handles.append(_legend_line(GREY, FIT_DASH, f"fit: step = {c.fit['a_ms']:.2f} + {c.fit['b_ms']:.4f} x N ms"))
    if c.ceiling:
        ax.axhline(c.ceiling, color=GREY, linewidth=1, linestyle=CEILING_DASH, gid="ceiling")
        if c.fit:
            handles.append(_legend_line(GREY, CEILING_DASH, f"implied ceiling {c.ceiling:,.0f} tok/s"))
    missed = [(float(lv["streams"]), lv["sustained_tok_s"]) for lv in c.levels if not lv.get("held", True)]
    if missed:
        (ring,) = ax.plot([x for x, _ in missed], [v for _, v in missed], linestyle="none", marker="o",
                          markersize=14, markerfacecolor="none", markeredgecolor="red", markeredgewidth=2,
                          label="level not held (requests waiting)", gid="not-held", clip_on=False)
        handles.append(ring)
    return handles


def _legend_line(color: str, dash: Any, label: str) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, linewidth=1.5, linestyle=dash, label=_text(label))


def stdout_console() -> Console:
    """A console for the tables: never narrower than they need when stdout is a pipe or a file."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 200)  # every column, the optional ones too
    return console
