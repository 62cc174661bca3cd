"""The forecast of a whole library (``--forecast``, or ``--ladder``): its books, sections, tokens, words and A5 pages,
and how long the fleet takes to write it.

Each book is forecast as the single book is (``forecasting.forecast`` of its shape and lengths: sections, tokens,
words, pages; one forecast per distinct set of a book's settings, so a library of a million lines of a few shapes
costs a few forecasts). The library's time is its tokens at the fleet's held rate, every backend at its cap
(``cap x 1000 / (a_ms + b_ms x cap)`` from each backend's step fit, probed or read from a ladder), plus the first
book's planning (no section starts before its first chapter's titles) and one section's length at that rate (the
tail, the last sections finishing with ever fewer beside them): the library keeps the fleet at its caps between
those (benchmarks/library_throughput.py: 0.94 of a bench level's rate at 40 books, 0.965 at 120).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..forecasting import StepFit, forecast
from .library_input import LibraryBook

FORECAST_FILE = "forecast.json"


def library_forecast(books: Iterable[LibraryBook], fits: Sequence[StepFit], *, skip: frozenset[str] = frozenset()
                     ) -> dict[str, Any]:
    """forecast.json of a library: the sums over its books, and its time (see the module docstring). ``skip``: the
    ids of books already done (in the library, not to write)."""
    cache: dict[str, dict[str, Any]] = {}
    totals = {"books": 0, "to_write": 0, "sections": 0, "tokens": 0, "words": 0, "pages": 0}
    first_plan_s: float | None = None
    longest_section_s = 0.0
    rate = sum(f.cap * 1000.0 / (f.a_ms + f.b_ms * f.cap) for f in fits)  # tokens per second at the caps
    for book in books:
        key = repr(sorted(book.settings.resume_key().items()))
        one = cache.get(key)
        if one is None:
            fc = forecast(None, book.settings, fits)
            one = cache[key] = {"sections": fc.sections, "tokens": fc.tokens, "words": fc.words, "pages": fc.pages,
                                "plan_s": fc.plan_s, "section_s": book.settings.max_tokens * max(
                                    (f.a_ms + f.b_ms * f.cap) / 1000.0 for f in fits)}
        totals["books"] += 1
        totals["pages"] += one["pages"]
        totals["sections"] += one["sections"]
        totals["words"] += one["words"]
        if book.id in skip:
            continue
        totals["to_write"] += 1
        totals["tokens"] += one["tokens"]
        if first_plan_s is None:
            first_plan_s = one["plan_s"]
        longest_section_s = max(longest_section_s, one["section_s"])
    write_s = totals["tokens"] / rate if rate > 0 else 0.0
    whole = (first_plan_s or 0.0) + write_s + (longest_section_s if totals["to_write"] else 0.0)
    return {**totals, "whole_job_s": round(whole, 2), "write_s": round(write_s, 2),
            "inputs": {"rate_at_caps_tok_s": round(rate, 1), "first_plan_s": round(first_plan_s or 0.0, 2),
                       "tail_s": round(longest_section_s, 2), "distinct_settings": len(cache),
                       "fits": [{"url": f.url, "a_ms": f.a_ms, "b_ms": f.b_ms, "cap": f.cap, "source": f.source}
                                for f in fits]}}
