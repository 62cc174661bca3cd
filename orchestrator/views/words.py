"""Figures in words, as the views say them: counts, durations, the forecast beside the live figures
(``orchestrator.eta``) and when the reader could open the PDF."""

from __future__ import annotations

from .eta import Eta

__all__ = ["LEVEL_NAMES", "closing_words", "duration", "eta_words", "figure", "num", "pdf_words", "rate_num", "secs"]

LEVEL_NAMES = {1: "parts", 2: "chapters", 3: "sections"}


def num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}{unit}"


def rate_num(x: float | None) -> str:
    """A rate in tokens per second, as both the fleet's rate and each reader's share of it are shown: tenths below
    100, whole above. One rounding for both keeps their order on screen (a reader's share is at most the rate, and
    a whole-number rate beside a one-decimal share read "188" against "188.2" for one stream)."""
    if x is None:
        return "-"
    return f"{x:,.1f}" if x < 99.95 else f"{x:,.0f}"


def duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def secs(s: float) -> str:
    """A forecast or ETA: tenths below ten seconds (a short job's forecast error is otherwise lost to rounding)."""
    return f"{s:.1f}s" if s < 9.95 else duration(s)


def eta_words(eta: Eta) -> str:
    """The forecast beside where the job stands, in one phrase: ``forecast 41s · ETA 12s (by the forecast)``,
    ``forecast 41s · 3s over``, and once finished ``forecast 41s, took 43s (+5%)``."""
    head = f"forecast {secs(eta.forecast_s)}"
    if eta.took_s is not None:
        pct = f" ({eta.error_pct:+.0f}%)" if eta.error_pct is not None else ""
        return f"{head}, took {secs(eta.took_s)}{pct}"
    parts = [head]
    if eta.over_s > 0:
        parts.append(f"{secs(eta.over_s)} over")
    if eta.left_s is not None:
        parts.append(f"ETA {secs(eta.left_s)} ({eta.basis_text})")
    return " · ".join(parts)


def closing_words(eta: Eta) -> str:
    """The finished job against its forecast: ``forecast 41s, took 43s (+5%); 96 A5 pages forecast, 101 typeset``."""
    line = eta_words(eta)
    if eta.pdf_pages is not None:
        pct = f" ({eta.pages_error_pct:+.0f}%)" if eta.pages_error_pct is not None else ""
        line += f"; {eta.pages:,} A5 pages forecast, {eta.pdf_pages:,} typeset{pct}"
    return line


def figure(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def pdf_words(stats: dict[str, object] | None) -> str | None:
    """When the reader could open book.pdf: ``PDF ready 154.2 s after start, 6.1 s after the last section (1,348
    A5 pages)``; None when the job made no PDF (``pdf_ready_s`` is None or absent)."""
    stats = stats or {}
    ready = figure(stats.get("pdf_ready_s"))
    if ready is None:
        return None
    line = f"PDF ready {ready:,.1f} s after start"
    after = figure(stats.get("typeset_after_write_s"))
    if after is not None:
        line += f", {after:,.1f} s after the last section"
    pages = stats.get("pdf_pages")
    if isinstance(pages, int) and not isinstance(pages, bool):
        line += f" ({pages:,} A5 pages)"
    return line
