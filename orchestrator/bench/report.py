"""The bench's outputs: the rich tables (reference Tables 1 and 2), ladder.json/.csv and an SVG chart.

Everything here is pure (values in, text or files out); the SVG is written directly, no plotting library.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

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
    if any(not lv.get("held", True) or _odd_metric(lv) for lv in ladder["levels"]):
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
        if len(t.columns) > len(row):
            notes = [] if held else ["NOT HELD"]
            if _odd_metric(lv):
                notes.append(str(lv["metric"]))
            row.append("; ".join(notes))
        t.add_row(*row, style=None if held else "bold red")
    return t


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


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def chart_svg(ladder: dict[str, Any]) -> str:
    """Total and per-stream tok/s against streams (log2 x axis), the fit's prediction dashed; one SVG string."""
    levels = [lv for lv in ladder["levels"] if lv.get("sustained_tok_s") is not None]
    k = max(1, len(ladder.get("backends") or [1]))
    w, h = 760, 480
    left, right, top, bottom = 78, 78, 48, 104
    pw, ph = w - left - right, h - top - bottom
    xs = [float(lv["streams"]) for lv in levels] or [1.0]
    lx_min, lx_max = math.log2(min(xs)), math.log2(max(xs))
    if lx_max - lx_min < 1e-9:
        lx_min, lx_max = lx_min - 1, lx_max + 1
    fit = ladder.get("fit")
    ceiling = k * fit["ceiling_tok_s"] if fit and fit.get("ceiling_tok_s") else None
    tot_max = _nice_max(
        max(
            [ceiling or 0]
            + [lv["sustained_tok_s"] for lv in levels]
            + [lv.get("best_second_tok_s") or 0 for lv in levels]
            + [predicted_total(fit, x, k) or 0 for x in xs]
            + [1.0]
        )
    )
    per_max = _nice_max(max([lv.get("per_stream_tok_s") or 0 for lv in levels] + [1.0]))

    def X(n: float) -> float:
        return left + pw * (math.log2(n) - lx_min) / (lx_max - lx_min)

    def YL(v: float) -> float:
        return top + ph * (1 - v / tot_max)

    def YR(v: float) -> float:
        return top + ph * (1 - v / per_max)

    blue, orange, grey = "#1f5fbf", "#d9730d", "#888888"
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            'font-family="Helvetica, Arial, sans-serif" font-size="12">'
        ),
        f'<rect width="{w}" height="{h}" fill="white"/>',
    ]
    title = "Throughput ladder"
    if ladder.get("model"):
        title += f" - {ladder['model']}"
    title += f" ({k} server{'s' if k != 1 else ''}; read from the servers' counters)"
    out.append(f'<text x="{w / 2}" y="24" text-anchor="middle" font-size="14">{escape(title)}</text>')
    # grid and axes
    for i in range(6):
        v = tot_max * i / 5
        y = YL(v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(
            f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end" fill="{blue}">{v:,.0f}</text>'
        )
        pv = per_max * i / 5
        out.append(
            f'<text x="{left + pw + 8}" y="{y + 4:.1f}" text-anchor="start" fill="{orange}">{pv:,.1f}</text>'
        )
    for x in sorted(set(xs)):
        px = X(x)
        out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + ph}" stroke="#f0f0f0"/>')
        out.append(f'<text x="{px:.1f}" y="{top + ph + 18}" text-anchor="middle">{int(x)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    out.append(
        f'<text x="{left + pw / 2}" y="{top + ph + 40}" text-anchor="middle">'
        f"streams{' per server' if k > 1 else ''} (log scale)</text>"
    )
    out.append(
        f'<text transform="translate(20,{top + ph / 2}) rotate(-90)" text-anchor="middle" fill="{blue}">'
        "total tok/s (sustained)</text>"
    )
    out.append(
        f'<text transform="translate({w - 16},{top + ph / 2}) rotate(90)" text-anchor="middle" '
        f'fill="{orange}">per-stream tok/s</text>'
    )
    # fit prediction (dashed)
    if fit and len(xs) >= 2:
        pts = []
        steps = 64
        for i in range(steps + 1):
            n = 2 ** (lx_min + (lx_max - lx_min) * i / steps)
            p = predicted_total(fit, n, k)
            if p is not None:
                pts.append(f"{X(n):.1f},{YL(p):.1f}")
        if pts:
            out.append(
                f'<polyline points="{" ".join(pts)}" fill="none" stroke="{grey}" stroke-dasharray="5,4"/>'
            )

    if ceiling:
        y = YL(ceiling)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="{grey}" stroke-dasharray="1,3"/>'
        )

    def series(values: list[tuple[float, float]], y, color: str) -> None:
        if not values:
            return
        pts = " ".join(f"{X(x):.1f},{y(v):.1f}" for x, v in values)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, v in values:
            out.append(f'<circle cx="{X(x):.1f}" cy="{y(v):.1f}" r="3.5" fill="{color}"/>')

    series([(float(lv["streams"]), lv["sustained_tok_s"]) for lv in levels], YL, blue)
    series(
        [(float(lv["streams"]), lv["per_stream_tok_s"]) for lv in levels if lv.get("per_stream_tok_s")],
        YR,
        orange,
    )
    for lv in levels:
        if not lv.get("held", True):
            px, py = X(float(lv["streams"])), YL(lv["sustained_tok_s"])
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="7" fill="none" stroke="red" stroke-width="2"/>')
    # legend: two rows under the x axis label, outside the plot
    legend: list[tuple[str, str, str, str]] = [
        ("line", blue, "", "total tok/s (left axis)"),
        ("line", orange, "", "per-stream tok/s (right axis)"),
    ]
    if fit:
        legend.append(("line", grey, "5,4", f"fit: step = {fit['a_ms']:.2f} + {fit['b_ms']:.4f} x N ms"))
        if ceiling:
            legend.append(("line", grey, "1,3", f"implied ceiling {ceiling:,.0f} tok/s"))
    if any(not lv.get("held", True) for lv in levels):
        legend.append(("ring", "red", "", "level not held (requests waiting)"))
    col_w = pw / 2
    for i, (kind, color, dash, label) in enumerate(legend):
        x = left + col_w * (i % 2)
        y = top + ph + 64 + 18 * (i // 2)
        if kind == "ring":
            out.append(f'<circle cx="{x + 11}" cy="{y}" r="6" fill="none" stroke="{color}" stroke-width="2"/>')
        else:
            d = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{color}" stroke-width="2"{d}/>')
        out.append(f'<text x="{x + 28}" y="{y + 4}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def stdout_console() -> Console:
    """A console for the tables: never narrower than they need when stdout is a pipe or a file."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    return console
