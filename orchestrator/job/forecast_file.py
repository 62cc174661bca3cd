"""The forecast inside a job: where the step times come from, fitting the shape to a budget, and what is left to
write. The model itself is :mod:`orchestrator.forecasting`; this module only gathers its inputs.

Step times, first found wins: a budget already fitted this session; ``--ladder FILE`` (a `handbook bench`
ladder.json); the fits recorded in ``DIR/forecast.json`` by an earlier ``handbook plan`` when they name exactly
these backends and caps and measured up to the streams this job runs; else a short probe of the backends' own
counters, whose levels stop at the sections the job will write where that is known (:func:`job_sections`): no backend
runs many more streams than that at once (a planning request may run beside them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from ..core.config import Backend, Settings
from ..core.errors import ConfigError
from ..core.outline import Outline
from ..core.profiles import Profile
from ..core.states import NodeKind
from ..dispatch.journal import FILENAME as JOURNAL_FILE
from ..dispatch.journal import Journal
from ..dispatch.journal_schema import peek_job
from ..forecasting import Forecast, StepFit, fit_budget, fits_from_ladder, probe_fits
from .section_prompt import section_context

__all__ = ["FORECAST_FILE", "Budget", "fits_for", "forecast_json", "job_sections", "written_paths"]

log = logging.getLogger("handbook")

FORECAST_FILE = "forecast.json"
_SHAPE = ("parts", "chapters", "sections", "words", "max_tokens")  # what fit_budget may choose


@dataclass(frozen=True)
class Budget:
    """A shape chosen for ``--pages`` / ``--minutes``: the settings it gives, what it rests on and one sentence
    saying what was chosen (printed by the CLI, kept in forecast.json as ``budget``)."""

    settings: Settings
    sentence: str
    fits: tuple[StepFit, ...] = ()
    forecast: Forecast | None = None

    @classmethod
    def from_journal(cls, out_dir: Path, prompt: str, settings: Settings) -> Budget | None:
        """The shape an earlier run of this very job (same prompt, same budget) chose, so that rerunning the
        command resumes its journal instead of fitting again to a slightly different shape."""
        peeked = peek_job(out_dir / JOURNAL_FILE)
        if peeked is None or peeked[0] != prompt:
            return None
        old = peeked[1]
        if old.get("pages") != settings.pages or old.get("minutes") != settings.minutes:
            return None
        try:
            chosen = replace(settings, **{k: old[k] for k in _SHAPE})
        except (KeyError, TypeError, ConfigError):
            return None
        p, c, s, w, _ = (getattr(chosen, k) for k in _SHAPE)
        return cls(chosen, f"budget: the shape this job chose before, {p} parts x {c} chapters x {s} sections "
                           f"at {w} words (kept to resume its journal)")

    @classmethod
    async def fit(cls, settings: Settings, usable: list[tuple[Backend, str]], out_dir: Path,
                  on_probe: Callable[[tuple[int, ...]], None] | None = None) -> Budget:
        fits = await fits_for(usable, settings, out_dir, on_probe=on_probe)
        chosen, forecast, sentence = fit_budget(settings, fits, pages=settings.pages, minutes=settings.minutes)
        return cls(chosen, f"budget: {sentence}", tuple(fits), forecast)


def job_sections(settings: Settings, outline: Outline | None, budget: Budget | None = None) -> int | None:
    """How many sections the job writes: the outline's, else the shape's; None when a budget (``--pages``,
    ``--minutes``) is still to choose the shape (``budget``: the one that chose it, whose settings keep the budget)."""
    if outline is not None:
        return outline.shape[2]
    if budget is None and (settings.pages is not None or settings.minutes is not None):
        return None
    return settings.parts * settings.chapters * settings.sections


async def fits_for(usable: list[tuple[Backend, str]], settings: Settings, out_dir: Path,
                   budget: Budget | None = None, sections: int | None = None,
                   on_probe: Callable[[tuple[int, ...]], None] | None = None) -> list[StepFit]:
    """Step times, first found wins (module docstring); ``sections``: :func:`job_sections`, the probe's top level;
    ``on_probe(levels)``: called when a probe begins."""
    if budget is not None and budget.fits:
        return list(budget.fits)
    backends = [b for b, _ in usable]
    if settings.ladder:
        return fits_from_ladder(settings.ladder, backends)
    recorded = _recorded_fits(out_dir / FORECAST_FILE, backends, sections)
    if recorded is not None:
        return recorded
    return await probe_fits(usable, settings, most=sections, on_start=on_probe)


def _recorded_fits(path: Path, backends: list[Backend], sections: int | None = None) -> list[StepFit] | None:
    """The fits an earlier forecast.json recorded, when they are for exactly these backends and caps, and were
    measured up to the streams this job runs (``sections``, None: the cap): a probe of a small book's levels is not
    a fit for a bigger one (an edited outline, a budget choosing its shape)."""
    try:
        data = orjson.loads(path.read_bytes())
        fits = {(f.url, f.cap): f for f in (StepFit(**f) for f in data["inputs"]["fits"])}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    chosen = [fits.get((b.url, b.cap)) for b in backends]
    if not all(chosen):
        return None
    for b, f in zip(backends, chosen, strict=True):
        if f is not None and f.streams is not None and f.streams < min(b.cap, sections or b.cap):
            return None
    return [f if f.source.startswith(path.name) else replace(f, source=f"{path.name} ({f.source})")
            for f in chosen if f is not None]


def written_paths(outline: Outline, journal: Journal, settings: Settings, profile: Profile) -> set[str]:
    """The sections of ``outline`` the journal answers (same title and context): no time or tokens in a forecast of
    this run, but pages in the book."""
    return {ref.path for ref in outline.sections()
            if journal.get(ref.path, NodeKind.SECTION, ref.title,
                           section_context(ref, settings, ref.words or settings.words, profile)) is not None}


def forecast_json(forecast: Forecast, budget: Budget | None) -> dict[str, Any]:
    """forecast.json: the forecast, and the budget sentence when a budget chose the shape."""
    data = forecast.to_json()
    if budget is not None:
        data["budget"] = budget.sentence
    return data
