"""Finishing a job: the written sections -> book.md and outline.json, defects.json/.md and stats.json
(:func:`save_book`), then book.html/book.pdf and the Result (:func:`publish`).

Everything but the typeset book is on disk before typesetting starts, so a typesetting failure loses nothing:
``Result.typeset_error`` says what broke and the CLI exits with TYPESET_FAILED_EXIT.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import orjson

from ..book.assemble import Book, assemble
from ..core.config import Settings
from ..core.events import Event, JobFinished
from ..core.osutil import atomic_write
from ..core.outline import Outline
from ..core.states import Missing, RunStatus, Stop, status_after
from .report import JobRecord, build_stats

if TYPE_CHECKING:
    from ..typeset.background import BackgroundTypesetter
    from ..views.timeline import RunTimeline
    from .writing import Written

log = logging.getLogger("handbook")


@dataclass(frozen=True)
class Result:
    """What a job produced. ``complete`` is False when any section failed, came back empty or was not written;
    ``interrupted`` is True when the run was stopped by Ctrl-C (what existed was written; rerun to resume);
    ``typeset_error`` says why the PDF/HTML could not be made (book.md, stats and defects were written first)."""

    markdown: str
    outline: Outline
    stats: dict[str, Any]
    defects: dict[str, Any] | None
    paths: dict[str, Path]
    complete: bool
    failed_sections: tuple[str, ...] = field(default=())
    interrupted: bool = False
    typeset_error: str | None = None  # book.html/book.pdf could not be made; everything else was written
    book: Book | None = field(default=None, repr=False, compare=False)  # the assembled book (a library's dataset)


@dataclass(frozen=True)
class Planned:
    """What `handbook plan` produced: the outline (also in outline.md, for a person to edit, and outline.json),
    its forecast (forecast.json; None when planning stopped early) and the files written."""

    outline: Outline | None
    forecast: dict[str, Any] | None
    paths: dict[str, Path]
    complete: bool  # the outline is whole (planning may have been interrupted after it was)
    interrupted: bool = False
    kept_edits: bool = False  # outline.md held a person's edits: kept, and the forecast is of it


@dataclass(frozen=True)
class JobInfo:
    """What the runner knew of the job before the writing began."""

    prompt: str
    settings: Settings
    out_dir: Path
    backends: tuple[str, ...]  # the usable backends' URLs, in fleet order
    model: str
    t_start: float  # time.monotonic() when the job started
    forecast: dict[str, Any] | None = None  # forecast.json, when a forecast was made
    timeline: RunTimeline | None = None  # --timeline: the consumer that saw the run (timeline.png, timeline.json)


@dataclass(frozen=True)
class Draft:
    """The book on disk but not yet typeset. ``status`` is the journal's word for the run: complete, incomplete,
    interrupted or aborted (every backend stopped answering)."""

    book: Book
    record: JobRecord
    stats: dict[str, Any]
    defects: dict[str, Any] | None
    paths: dict[str, Path]
    failed: tuple[str, ...]  # failed or empty sections
    stop: Stop | None  # why the writing ended early and left something missing (see Written.stop)
    status: RunStatus

    @property
    def complete(self) -> bool:
        return not self.failed and self.stop is None


def save_book(job: JobInfo, written: Written, plan_levels: tuple[int, ...], journal_path: Path) -> Draft:
    """Assemble the book and write book.md, outline.json, defects.json/.md and stats.json."""
    stop = written.stop
    outline = written.outline or Outline(title=job.prompt)  # stopped while planning: a title at most
    book = assemble(outline, written.sections, Missing.INTERRUPTED if stop == Stop.INTERRUPT else Missing.NOT_WRITTEN)
    if stop == Stop.INTERRUPT and written.t_titles is not None and len(written.sections) == len(book.sections):
        stop = None  # Ctrl-C came when every section was already in: nothing is missing
    if stop is not None:
        markdown = _mark_incomplete(book.markdown, stop, len(written.sections), len(book.sections),
                                    planned=written.t_titles is not None)
        book = Book(book.outline, book.sections, markdown)
    paths = _write_outputs(job.out_dir, book, outline)
    t_end = time.monotonic()
    failed = tuple(s.path for s in book.sections if s.failed or s.empty)
    status = RunStatus.INCOMPLETE if failed and stop is None else status_after(stop)

    defects = _write_defects(job.out_dir, book, paths)
    record = JobRecord(
        backends=job.backends,
        plan_levels=plan_levels,
        book=book,
        replies=written.replies,
        t_start=job.t_start,
        t_titles_known=written.t_titles or t_end,
        t_write_start=written.t_write_start,
        t_write_end=written.t_write_end,
        t_end=t_end,
        resumed_sections=written.resumed_sections,
        loop_cut_stopped=written.loop_cut_stopped,
        server_counted=written.server_counted,
        power=written.power,
        readers=written.readers,
        fleet=written.fleet,
        model=job.model,
        interrupted=stop is not None,
        forecast=job.forecast,
    )
    stats = build_stats(record)
    for warning in stats["warnings"]:  # e.g. a backend that sent no usage: tokens_written undercounts
        log.warning("%s", warning)
    _write_stats(job.out_dir, stats, paths)
    paths.update(_write_timeline(job, t_end))
    paths["journal"] = journal_path
    return Draft(book, record, stats, defects, paths, failed, stop, status)


def save_plan(job: JobInfo, written: Written, forecast: Callable[[Outline], dict[str, Any]]) -> Planned:
    """outline.md, outline.json and forecast.json of a plan-only run (`handbook plan`). An outline.md a person
    already edited is kept, never overwritten by a rerun: the forecast is then of the outline as edited."""
    from ..core.outline_md import FILENAME, edits_in, write_outline_md

    planned = written.outline
    if planned is None:  # stopped before the outline was whole: nothing to write
        return Planned(None, None, {}, False, interrupted=written.stop == Stop.INTERRUPT)
    # an unreadable outline.md is kept as it is (`handbook write` will say which line); the forecast is then of the
    # outline as planned
    edited, mine = edits_in(job.out_dir, planned)
    outline = mine if edited and mine is not None else planned
    fc = forecast(outline)
    paths = {
        "outline": job.out_dir / FILENAME if edited else write_outline_md(planned, job.out_dir),
        "outline_json": write_json(job.out_dir / "outline.json", planned.to_json()),  # as planned
        "forecast": write_json(job.out_dir / "forecast.json", fc),
        **_write_timeline(job, time.monotonic()),
    }
    return Planned(outline, fc, paths, True, interrupted=written.stop == Stop.INTERRUPT, kept_edits=edited)


def write_json(path: Path, data: Any) -> Path:
    return atomic_write(path, orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")


async def publish(job: JobInfo, draft: Draft, bus: Callable[[Event], None],
                  background: BackgroundTypesetter | None = None) -> Result:
    """Typeset book.html/book.pdf when asked for (and the book is whole), tell the consumers, return the Result.
    ``background``: what was laid out while writing (typeset/background.py); the caller closes it."""
    stats = draft.stats
    typeset_error = None
    if draft.stop is None and any(f in job.settings.formats for f in ("html", "pdf")):
        record = await _typeset(job, draft.book, draft.paths, draft.record, background)
        typeset_error = record.typeset_error
        stats = build_stats(record)
        _write_stats(job.out_dir, stats, draft.paths)
    bus(JobFinished(stats, draft.complete, time.monotonic()))
    return Result(draft.book.markdown, draft.book.outline, stats, draft.defects, draft.paths, draft.complete,
                  draft.failed, interrupted=draft.stop == Stop.INTERRUPT, typeset_error=typeset_error,
                  book=draft.book)


async def _typeset(job: JobInfo, book: Book, paths: dict[str, Path], record: JobRecord,
                   background: BackgroundTypesetter | None) -> JobRecord:
    """Lay out book.html/book.pdf; the record gains the time and pages, or ``typeset_error``: a one-line message
    saying what broke (book.md, stats, defects and the journal are already written, so nothing is lost)."""
    from ..typeset import typeset
    from ..typeset.background import layout_split

    formats = [f for f in job.settings.formats if f != "md"]
    try:
        info = await anyio.to_thread.run_sync(  # handover joins the background's thread: never on the loop
            lambda: typeset(book.markdown, job.out_dir, formats, job.settings.templates,
                            prepared=None if background is None else background.handover())
        )
    except Exception as e:  # WeasyPrint, a template, a worker: whatever broke, the Markdown book stands
        why = " ".join(str(e).split())[:300] or type(e).__name__
        message = f"typesetting failed ({type(e).__name__}: {why})"
        log.warning("%s; book.md is complete in %s", message, job.out_dir)
        return replace(record, typeset_error=message)
    if info.pdf_pages is not None and info.pdf_path:
        paths["pdf"] = info.pdf_path
    if info.html_path:
        paths["html"] = info.html_path
    return replace(record, typeset_s=info.seconds, pdf_pages=info.pdf_pages, t_pdf=info.pdf_written_at,
                   typeset_cpu_s=layout_split(list(info.layout), record.t_write_end) if info.layout else None)


def _mark_incomplete(markdown: str, reason: Stop, written: int, total: int, planned: bool) -> str:
    why = _WHY[reason]
    what = f"{written} of {total} sections are written" if planned else "the outline was not finished"
    note = (f"> **Incomplete:** {why}; {what}. Rerun the same command to resume from the journal "
            f"(journal.sqlite).\n")
    head, _, rest = markdown.partition("\n")
    return f"{head}\n\n{note}\n{rest.lstrip()}"


_WHY = {Stop.INTERRUPT: "the run was interrupted", Stop.CANCEL: "the run was stopped",
        Stop.ALL_DOWN: "every backend stopped answering", Stop.OUTPUT: "the journal could not be written"}


def _write_outputs(out_dir: Path, book: Book, outline: Outline) -> dict[str, Path]:
    atomic_write(out_dir / "book.md", book.markdown)
    atomic_write(out_dir / "outline.json", orjson.dumps(outline.to_json(), option=orjson.OPT_INDENT_2))
    return {"md": out_dir / "book.md", "outline": out_dir / "outline.json"}


def _write_timeline(job: JobInfo, t_end: float) -> dict[str, Path]:
    """timeline.png and timeline.json (--timeline). A chart that cannot be drawn is a warning: the book is written."""
    if job.timeline is None:
        return {}
    try:
        return job.timeline.write(job.out_dir / "timeline.png", job.out_dir / "timeline.json", t_end=t_end)
    except Exception as e:  # matplotlib missing or failing must not cost the job its exit code
        log.warning("timeline.png not written (%s: %s)", type(e).__name__, e)
        return {}


def _write_stats(out_dir: Path, stats: dict[str, Any], paths: dict[str, Path]) -> None:
    atomic_write(out_dir / "stats.json", orjson.dumps(stats, option=orjson.OPT_INDENT_2))
    paths["stats"] = out_dir / "stats.json"


def _write_defects(out_dir: Path, book: Book, paths: dict[str, Path]) -> dict[str, Any] | None:
    from ..book.defects import find_defects

    d = find_defects(book)
    data = d.to_json()
    atomic_write(out_dir / "defects.json", orjson.dumps(data, option=orjson.OPT_INDENT_2))
    atomic_write(out_dir / "defects.md", d.to_markdown())
    paths["defects"] = out_dir / "defects.json"
    paths["defects_md"] = out_dir / "defects.md"
    return data
