"""The step-time fit: ``step_ms = a + b * N`` over the levels the servers held, and what it predicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def fit_step(levels: Sequence[Mapping[str, Any]]) -> dict[str, float | None] | None:
    """Least squares ``step_ms = a + b * N`` over the levels the servers held (waiting == 0).

    ``step_ms`` is per server and per stream (1000 * N / per-server sustained), so ``1000 / b`` is the implied
    per-server ceiling in tok/s. None with fewer than two distinct held levels or a non-positive slope's ceiling.
    """
    pts = [
        (float(lv["streams"]), float(lv["step_ms"]))
        for lv in levels
        if lv.get("step_ms") is not None and lv.get("held", True)
    ]
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    a = my - b * mx
    return {
        "a_ms": round(a, 4),
        "b_ms": round(b, 5),
        "ceiling_tok_s": round(1000.0 / b, 1) if b > 0 else None,
    }


def predicted_total(fit: Mapping[str, Any] | None, streams: float, servers: int) -> float | None:
    """Total tok/s the fit predicts at ``streams`` per server over ``servers`` servers; None without a fit (or
    where the fitted step is not positive)."""
    if not fit:
        return None
    step = fit["a_ms"] + fit["b_ms"] * streams
    return servers * 1000.0 * streams / step if step > 0 else None


def fit_line(fit: Mapping[str, Any] | None) -> str:
    """The fit as one sentence, printed under the ladder table."""
    if not fit:
        return "fit: needs two or more levels the servers held"
    ceiling = f"{fit['ceiling_tok_s']:,.0f} tok/s" if fit.get("ceiling_tok_s") else "none (slope <= 0)"
    return (
        f"fit over held levels: step = {fit['a_ms']:.2f} ms + {fit['b_ms']:.4f} ms x N;"
        f" implied ceiling per server 1000/b = {ceiling}"
    )
