"""``handbook bench compare A.json B.json``: two ladders side by side, B against A (the reference's Table 2)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from ..core.errors import ConfigError
from .report import compare_table, stdout_console


def load_ladder(path: str) -> dict[str, Any]:
    """A ``ladder.json`` written by ``handbook bench``; anything else is a ConfigError."""
    p = Path(path)
    try:
        data = orjson.loads(p.read_bytes())
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from None
    except orjson.JSONDecodeError:
        raise ConfigError(f"{p} is not JSON (expected a ladder.json written by 'handbook bench')") from None
    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, list) or not all(
        isinstance(lv, dict) and isinstance(lv.get("streams"), int) and "sustained_tok_s" in lv for lv in levels
    ):
        raise ConfigError(f"{p} is not a ladder.json: it needs 'levels' with 'streams' and 'sustained_tok_s'")
    return data


def _label(data: dict[str, Any], path: str, other: str) -> str:
    if data.get("label"):
        return str(data["label"])
    p, q = Path(path), Path(other)
    if p.stem != q.stem:
        return p.stem
    return p.parent.name or p.stem


EVEN = 0.01  # a ratio within 1% of 1 is even: neither ladder wins there


@dataclass(frozen=True)
class Crossover:
    """Where B stops winning (or starts): the last stream count on one side and the first on the other."""

    last: int  # the last stream count of the side before
    first: int  # the first stream count of the side after
    before: str  # "wins", "loses" or "is even" (B against A)
    after: str


def _verdict(ratio: float) -> str:
    return "wins" if ratio > 1 + EVEN else "loses" if ratio < 1 - EVEN else "is even"


def ratios(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[int, float]]:
    """(streams, B / A sustained) at every stream count both measured with a rate, in stream order."""
    by_a = {lv["streams"]: lv.get("sustained_tok_s") for lv in a["levels"]}
    out = []
    for lv in sorted(b["levels"], key=lambda lv: lv["streams"]):
        ra, rb = by_a.get(lv["streams"]), lv.get("sustained_tok_s")
        if ra and rb is not None:
            out.append((lv["streams"], rb / ra))
    return out


def crossovers(a: dict[str, Any], b: dict[str, Any]) -> list[Crossover]:
    """Every change of verdict between neighbouring stream counts, in stream order (the reference's drafting
    result: it wins up to 32 streams and loses from 64, one crossover)."""
    points = ratios(a, b)
    out = []
    for (n0, r0), (n1, r1) in itertools.pairwise(points):
        v0, v1 = _verdict(r0), _verdict(r1)
        if v0 != v1:
            out.append(Crossover(n0, n1, v0, v1))
    return out


def verdict_line(a: dict[str, Any], b: dict[str, Any], label_b: str) -> str | None:
    """B's verdict in words: where it crosses over, or that it wins (loses) at every stream count measured."""
    points = ratios(a, b)
    if not points:
        return None
    found = crossovers(a, b)
    if not found:
        return f"{label_b} {_verdict(points[0][1])} at every stream count measured ({points[0][0]}-{points[-1][0]})"
    n = found[0].last
    parts = [f"{label_b} {found[0].before} up to {n} stream{'s' if n != 1 else ''}"]
    parts += [f"{c.after} from {c.first}" for c in found]
    return "crossover: " + ", ".join(parts)


def compare(path_a: str, path_b: str, console: Console | None = None) -> int:
    """Print B against A (ratio B / A) at every stream count both ladders measured, and where B crosses over."""
    a, b = load_ladder(path_a), load_ladder(path_b)
    la, lb = _label(a, path_a, path_b), _label(b, path_b, path_a)
    if la == lb:
        la, lb = f"A ({la})", f"B ({lb})"
    if not {lv["streams"] for lv in a["levels"]} & {lv["streams"] for lv in b["levels"]}:
        raise ConfigError(f"{path_a} and {path_b} share no stream count; nothing to compare")
    console = console or stdout_console()
    console.print(compare_table(a, b, la, lb))
    line = verdict_line(a, b, lb)
    if line:
        console.print(line, markup=False)
    for label, data in ((la, a), (lb, b)):
        fit = data.get("fit")
        if fit and fit.get("b_ms"):
            ceiling = f"{fit['ceiling_tok_s']:,.0f}" if fit.get("ceiling_tok_s") else "-"
            console.print(
                f"{label}: step = {fit['a_ms']:.2f} ms + {fit['b_ms']:.4f} ms x N, ceiling {ceiling} tok/s"
            )
    return 0
