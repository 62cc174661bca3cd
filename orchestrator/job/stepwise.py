"""Outline first: plan, let a person review and edit the outline, see the forecast, then write.

``plan`` runs the planning only and leaves ``outline.md`` (to edit), ``outline.json`` and ``forecast.json`` in the
out dir; ``write`` makes the book from ``outline.md`` as edited, with the out dir's journal: a rerun asks only for
the sections whose title, place (book, part, chapter) or length changed, and none of the planning; ``forecast``
says what a shape or an outline would take on these backends. Each has an async twin (``aplan``, ``awrite``,
``aforecast``) for use inside an event loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from ..core.config import Backend, Settings, settings_from
from ..core.errors import ConfigError, Interrupted
from ..core.events import Event
from ..core.outline import Outline
from ..core.outline_md import FILENAME as OUTLINE_FILE
from ..core.outline_md import read_outline_md
from ..dispatch.journal import FILENAME as JOURNAL_FILE
from ..dispatch.journal_schema import peek_job
from ..forecasting import Forecast, fits_from_ladder, forecast, probe_fits
from .connect import backends_up, discover_all
from .finish import Planned, Result
from .forecast_file import job_sections
from .run import Mode, Options, default_out, session

__all__ = ["aforecast", "aplan", "awrite", "forecast_of", "plan", "plan_job", "write", "write_settings"]

OnEvent = Callable[[Event], None] | Sequence[Callable[[Event], None]] | None

# What `handbook write` may change in the settings a plan was made with: how to reach the backends and what to
# make of the book, never the words, tokens or sampling the sections are asked with (that would make every journaled
# section a different one). ``context`` is the exception that proves it: each section's journal context records what
# its request carried, so a changed context redoes exactly the sections it changes, like an edited outline.md.
WRITE_OVERRIDES = frozenset({
    "api_key", "cap", "attempts", "connect_timeout_s", "first_token_timeout_s", "chunk_timeout_s", "request_timeout_s",
    "metrics_interval_s", "interrupt_grace_s", "all_down_timeout_s", "formats", "ladder", "forecast", "timeline",
    "typeset_while_writing", "stream_sections",
    "context", "repairs", "affinity", "stop_at_sign_off",
})


# A plan journaled before one of these settings existed is written as it was then (a published-preset plan of an
# earlier version reads every section to its end, as its preset now says too), not with today's default.
PLANNED_BEFORE: dict[str, Any] = {"stop_at_sign_off": False}


async def plan_job(prompt: str, backends: Sequence[Backend | str] | None = None, settings: Settings | None = None,
                   out: str | os.PathLike[str] | None = None, on_event: OnEvent = None, *, fresh: bool = False,
                   handle_sigint: bool = False) -> Planned:
    """Plan the book only: ``out/outline.md`` (for a person to edit), ``outline.json`` and ``forecast.json`` (what
    writing it will take on these backends); ``settings.pages`` / ``settings.minutes`` fit the shape to a budget.
    What `handbook plan` runs; ``aplan`` is the same returning the outline."""
    result = await session(prompt, backends, settings, out, on_event, Mode(plan_only=True),
                           Options(fresh=fresh, handle_sigint=handle_sigint))
    assert isinstance(result, Planned)
    return result


async def aplan(prompt: str, backends: Sequence[Backend | str] | None = None, settings: Settings | None = None,
                out: str | os.PathLike[str] | None = None, on_event: OnEvent = None, *,
                fresh: bool = False) -> Outline:
    """The outline of the book, planned on ``backends`` (and left in ``out`` as outline.md, outline.json and
    forecast.json, with the journal ``awrite`` resumes). Interrupted when planning could not finish."""
    planned = await plan_job(prompt, backends, settings, out, on_event, fresh=fresh)
    if planned.outline is None or not planned.complete:
        raise Interrupted("planning stopped before the outline was complete; call again to resume it")
    return planned.outline


def plan(prompt: str, backends: Sequence[Backend | str] | None = None, settings: Settings | None = None,
         out: str | os.PathLike[str] | None = None, on_event: OnEvent = None, *, fresh: bool = False) -> Outline:
    """``aplan`` from synchronous code."""
    return anyio.run(partial(aplan, prompt, backends, settings, out, on_event, fresh=fresh))


def write_settings(out_dir: Path, overrides: Settings | None = None,
                   changed: frozenset[str] = frozenset()) -> tuple[str, Settings]:
    """The prompt and settings a book in ``out_dir`` is written with: those of its plan (the journal's), with the
    fields named in ``changed`` taken from ``overrides`` (only those in WRITE_OVERRIDES may change). Without a
    journal (an outline.md written by hand), the prompt is the outline's title and the settings ``overrides``."""
    peeked = peek_job(out_dir / JOURNAL_FILE)
    if peeked is None:
        return "", overrides or Settings()
    prompt, public, _ = peeked
    refused = sorted(changed - WRITE_OVERRIDES)
    if refused:
        raise ConfigError(f"{', '.join(refused)} cannot change between `handbook plan` and `handbook write` (they "
                          f"decide what every section is asked); plan again with them, or edit {OUTLINE_FILE}")
    # A plan folder written by another version may hold a setting this one lacks: only the known names are taken
    # (settings_from refuses an unknown one, as it must for a person's job file).
    known = {f.name for f in fields(Settings)}
    base = settings_from({**PLANNED_BEFORE, **{k: v for k, v in public.items() if k in known}})
    if overrides is not None:
        base = replace(base, **{k: getattr(overrides, k) for k in changed})
    return prompt, base


async def awrite(outline: Outline | str | os.PathLike[str], backends: Sequence[Backend | str] | None = None,
                 settings: Settings | None = None, out: str | os.PathLike[str] | None = None,
                 on_event: OnEvent = None, *, deltas: bool = False, handle_sigint: bool = False) -> Result:
    """Write the book of ``outline``: an Outline, or the folder ``plan`` wrote (its outline.md, as a person edited
    it) or that outline.md itself. With the journal in ``out`` (default: that folder), sections it holds for the same
    title, book, part, chapter and length come from it and the rest are asked; no planning request is made, and
    titles are used as written. ``settings`` None: the settings the plan was made with."""
    outline, out_dir = _outline_and_dir(outline, out)
    prompt, planned = write_settings(out_dir)
    result = await session(prompt or outline.title, backends, settings or planned, out_dir, on_event,
                           Mode(outline=outline), Options(deltas=deltas, handle_sigint=handle_sigint))
    assert isinstance(result, Result)
    return result


def _outline_and_dir(outline: Outline | str | os.PathLike[str],
                     out: str | os.PathLike[str] | None) -> tuple[Outline, Path]:
    """The outline to write and its out dir: an Outline (out: given, else the default for its title), or a folder
    holding outline.md, or an outline.md file (out: given, else its folder)."""
    if isinstance(outline, Outline):
        return outline, Path(out) if out is not None else default_out(outline.title)
    path = Path(outline)
    md = path / OUTLINE_FILE if path.is_dir() or not path.suffix else path
    return read_outline_md(md), Path(out) if out is not None else md.parent


def write(outline: Outline | str | os.PathLike[str], backends: Sequence[Backend | str] | None = None,
          settings: Settings | None = None, out: str | os.PathLike[str] | None = None,
          on_event: OnEvent = None) -> Result:
    """``awrite`` from synchronous code."""
    return anyio.run(partial(awrite, outline, backends, settings, out, on_event, handle_sigint=True))


async def aforecast(outline: Outline | None = None, backends: Sequence[Backend | str] | None = None,
                    settings: Settings | None = None) -> Forecast:
    """What making ``outline`` (None: a book of ``settings``' shape, planning included) would take on ``backends``:
    step times from ``settings.ladder`` or a short probe of each backend's counters (up to the streams the book
    can run at once)."""
    settings = settings or Settings()
    async with backends_up(backends, settings) as bk:
        usable = await discover_all(bk, settings)
        fits = (fits_from_ladder(settings.ladder, [b for b, _ in usable]) if settings.ladder
                else await probe_fits(usable, settings, most=job_sections(settings, outline)))
    return forecast(outline, settings, fits, planned=outline is not None)


def forecast_of(outline: Outline | None = None, backends: Sequence[Backend | str] | None = None,
                settings: Settings | None = None) -> Forecast:
    """``aforecast`` from synchronous code (exported as ``orchestrator.forecast``)."""
    return anyio.run(aforecast, outline, backends, settings)
