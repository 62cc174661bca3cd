"""The job: plan -> dispatch -> assemble -> typeset -> report, with one stream of events to every consumer.

``generate``/``agenerate`` are the library's entry points. A job discovers its backends (``orchestrator.connect``),
writes every section (``orchestrator.writing``), then saves and typesets the book (``orchestrator.finish``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ..core.config import Backend, Settings
from ..core.errors import (
    BackendError,
    ConfigError,
    HandbookError,
    InternalError,
    OutputError,
    PlanError,
    internal_error,
    unwrap,
)
from ..core.events import Event, ForecastReady, JobStarted, ProbeStarted
from ..core.osutil import ensure_open_files
from ..core.outline import Outline
from ..core.profiles import resolve_profile
from ..core.states import RunStatus, Stop, status_after
from ..dispatch.dispatcher import Dispatcher
from ..dispatch.fleet import Fleet
from ..dispatch.journal import Journal
from ..forecasting import StepFit
from ..forecasting import forecast as forecast_of
from ..planning import Planner
from ..views.timeline import RunTimeline
from ..wire.sseproto import event_loop_options
from .connect import backends_up, discover_all, open_clients
from .finish import JobInfo, Planned, Result, publish, save_book, save_plan, write_json
from .forecast_file import FORECAST_FILE, Budget, fits_for, forecast_json, job_sections, written_paths
from .options import Bus as _Bus
from .options import Mode, Options, SharedFleet, default_out, prepare_out
from .section_prompt import check_templates
from .writing import Writer, stopped_message

if TYPE_CHECKING:
    from ..core.profiles import Profile
    from ..typeset.background import BackgroundTypesetter

log = logging.getLogger("handbook")

__all__ = ["Mode", "Options", "SharedFleet", "agenerate", "default_out", "generate", "session"]


async def agenerate(
    prompt: str,
    backends: Sequence[Backend | str] | None = None,
    settings: Settings | None = None,
    out: str | os.PathLike | None = None,
    on_event: Callable[[Event], None] | Sequence[Callable[[Event], None]] | None = None,
    *,
    deltas: bool = False,
    fresh: bool = False,
    handle_sigint: bool = False,
) -> Result:
    """Make a book. See ``generate`` for the arguments; this is the same inside an event loop.

    ``handle_sigint``: take over Ctrl-C while sections are written (main thread only): the first stops
    dispatching, lets requests in flight finish for ``settings.interrupt_grace_s`` and returns what exists with
    ``Result.interrupted``; a second raises Interrupted at once. Off by default: a library call inside someone
    else's event loop leaves their signals alone."""
    result = await session(prompt, backends, settings, out, on_event, Mode(),
                           Options(deltas=deltas, fresh=fresh, handle_sigint=handle_sigint))
    assert isinstance(result, Result)
    return result


async def session(
    prompt: str,
    backends: Sequence[Backend | str] | None,
    settings: Settings | None,
    out: str | os.PathLike | None,
    on_event: Callable[[Event], None] | Sequence[Callable[[Event], None]] | None,
    mode: Mode,
    options: Options,
) -> Result | Planned:
    """The one way a job runs, for ``agenerate``, ``aplan`` and ``awrite`` (orchestrator.stepwise)."""
    settings = settings or Settings()
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("the prompt is empty: say what the book should be about")
    prompt = prompt.strip()
    out_dir = prepare_out(out, prompt)
    bus = _bus_of(on_event)
    fresh = options.fresh

    # The journal is opened before any backend is asked: another job's journal is bad input, found at once. Only
    # a budget to fit (--pages, --minutes) waits for the backends: the shape it chooses is part of the journal's key.
    budgeted = bool(settings.pages or settings.minutes) and mode.outline is None  # written from an outline: its shape
    budget = None if fresh or not budgeted else Budget.from_journal(out_dir, prompt, settings)
    if budget is not None:
        settings = budget.settings

    def job_for(settings: Settings, budget: Budget | None) -> _Job:
        journal = Journal.open(out_dir, prompt, settings, fresh=fresh)
        return _Job(prompt, settings, out_dir, bus, journal, mode, budget=budget, options=options)

    job = job_for(settings, budget) if budget is not None or not budgeted else None
    try:
        if options.shared is not None:  # a library's book: its backends are up and discovered already
            job = job or job_for(settings, None)
            job.journal.set_meta("backends", [{"url": b.url, "cap": b.cap} | ({"power": b.power} if b.power else {})
                                              for b, _ in options.shared.usable])  # for `handbook write` of it
            return await job.run([b for b, _ in options.shared.usable], options.shared.usable)
        async with backends_up(backends, settings) as bk:
            usable = None
            if job is None:
                usable = await discover_all(bk, settings)
                budget = await Budget.fit(settings, usable, out_dir, on_probe=_probe_note(bus, usable))
                job = job_for(budget.settings, budget)
            # what `handbook write` uses when given no backend (none recorded: the embedded engine)
            job.journal.set_meta("backends", [{"url": b.url, "cap": b.cap} | ({"power": b.power} if b.power else {})
                                              for b in bk] if backends else [])
            return await job.run(bk, usable)
    except BaseExceptionGroup as group:
        inner = unwrap(group)
        if isinstance(inner, HandbookError | KeyboardInterrupt):
            raise _ended(job, inner) from None
        if isinstance(inner, Exception | BaseExceptionGroup):
            raise _ended(job, internal_error(inner, out_dir)) from None
        raise
    except (HandbookError, KeyboardInterrupt) as e:
        raise _ended(job, e) from None
    except Exception as e:  # a bug of ours: one line, the traceback in OUT/handbook.log, no backend blamed
        raise _ended(job, internal_error(e, out_dir)) from None
    finally:
        if job is not None:
            job.journal.end_run(job.status, job.requests)
            job.journal.close()


def _bus_of(on_event: Callable[[Event], None] | Sequence[Callable[[Event], None]] | None) -> _Bus:
    consumers: list[Callable[[Event], None]] = []
    if callable(on_event):
        consumers.append(on_event)
    elif on_event:
        consumers.extend(on_event)
    return _Bus(consumers)


def _ended(job: _Job | None, error: BaseException) -> BaseException:
    """``error``, the job's end: a job that could not make its outline, or hit a bug of ours, failed; one whose
    backends all went away was aborted (the journal's word for the run)."""
    if job is not None and isinstance(error, PlanError | InternalError):
        job.status = RunStatus.FAILED
    return error


def generate(
    prompt: str,
    backends: Sequence[Backend | str] | None = None,
    settings: Settings | None = None,
    out: str | os.PathLike | None = None,
    on_event: Callable[[Event], None] | Sequence[Callable[[Event], None]] | None = None,
    *,
    deltas: bool = False,
    fresh: bool = False,
    handle_sigint: bool = True,
) -> Result:
    """Make a book from one prompt over ``backends`` (OpenAI-compatible base URLs or Backend values).

    Writes book.md, outline.json, stats.json (and book.pdf/book.html, defects.json/defects.md) into ``out``
    and returns a Result. ``out/journal.sqlite`` records every finished node: calling again with the same prompt
    and settings resumes (``fresh=True`` starts over). Raises HandbookError subclasses for bad input
    (ConfigError), unreachable backends (BackendError) or an outline that could not be made (PlanError). Failed
    sections do not raise: they are listed in ``Result.failed_sections`` and ``Result.complete`` is False.
    Ctrl-C stops the job gracefully (see ``agenerate``; ``Result.interrupted``).

    ``on_event``: a callable, or several, called with every event of the job (``orchestrator.events``: JobStarted
    ... JobFinished) on the job's event loop; it must be quick and must not block. One that raises is detached
    with a warning; the job goes on. ``deltas=True`` adds a Delta event for every piece of streamed text (many
    thousands a minute): ask for them only to show the text as it is written, as the live feed does.
    """
    return anyio.run(
        partial(agenerate, prompt, backends, settings, out, on_event, deltas=deltas, fresh=fresh,
                handle_sigint=handle_sigint),
        backend_options=event_loop_options(),  # uvloop where installed: the client's reads cost less
    )


@dataclass(frozen=True)
class _Setup:
    """What ``_Job.run`` set up for the writing: the job as known before it began (its backends' URLs, the model,
    the start, the forecast, the timeline), the backends as discovered with their in-flight caps, the step fits
    (`handbook plan` forecasts its outline with them), the model profile, the writer and the background typesetter
    (None: the PDF is laid out after the writing)."""

    job: JobInfo
    usable: list[tuple[Backend, str]]
    caps: list[int]
    fits: list[StepFit]
    profile: Profile
    writer: Writer
    background: BackgroundTypesetter | None



def _probe_note(bus: Callable[[Event], None], usable: list[tuple[Backend, str]]) -> Callable[[tuple[int, ...]], None]:
    """What a probe calls as it begins: ProbeStarted on the job's bus (its seconds are not the job's)."""
    return lambda levels: bus(ProbeStarted(levels, len(usable), time.monotonic()))

class _Job:
    """One run of a job: discover the backends, write the sections (``orchestrator.writing``), then save and typeset
    the book (``orchestrator.finish``). ``status`` ends up as complete / incomplete / interrupted / aborted (for
    the journal)."""

    def __init__(self, prompt: str, settings: Settings, out_dir: Path, bus: _Bus, journal: Journal, mode: Mode, *,
                 budget: Budget | None, options: Options):
        self.mode = mode
        self.budget = budget
        self.prompt = prompt
        self.settings = settings
        self.out_dir = out_dir
        self.bus = bus
        self.journal = journal
        self.deltas = options.deltas
        self.handle_sigint = options.handle_sigint
        self.shared = options.shared
        self.status: RunStatus = RunStatus.ABORTED
        self.requests = 0
        self.no_forecast: str | None = None

    async def run(self, backends: list[Backend], usable: list[tuple[Backend, str]] | None = None) -> Result | Planned:
        """``usable``: the backends as discovered already (a budget was fitted on them), else discovered here."""
        settings, bus, journal = self.settings, self.bus, self.journal
        if usable is None:
            usable = await discover_all(backends, settings)
        journal.check_model(",".join(sorted({model for _, model in usable})))
        if journal.failure is not None:  # the journal cannot be written: no request is sent for text it cannot keep
            raise journal.failure
        caps = self.shared.caps if self.shared else ensure_open_files([b.cap for b, _ in usable])
        urls = tuple(b.url for b, _ in usable)
        fits: list[StepFit] = []
        forecast = None
        if self.shared is None:  # a library forecasts the library, not each book
            with _output_errors(journal):  # forecast.json
                fits, forecast = await self._forecast(usable)  # a probe's seconds are not the job's: before JobStarted
        timeline = (RunTimeline(caps=dict(zip(urls, caps, strict=True)))  # --timeline
                    if settings.timeline and self.shared is None else None)
        if timeline is not None:
            bus.consumers.append(timeline)
        t_start = time.monotonic()
        bus(JobStarted(self.prompt, urls, settings.public(), t_start))
        if forecast is not None:
            bus(ForecastReady(forecast["whole_job_s"], forecast["pages"], forecast["sections"], forecast["tokens"],
                              forecast, time.monotonic()))
        profile = resolve_profile(settings, usable[0][1])
        check_templates(settings, profile)  # a broken template fails now, not after planning

        if self.mode == Mode() and journal.outline is not None:
            _warn_if_edited(self.out_dir, journal.outline)
        writer = Writer(settings, profile, bus, journal, handle_sigint=self.handle_sigint,
                        shared=self.shared is not None)
        writer.library_index = self.shared.dedupe if self.shared is not None else None
        from ..typeset.background import for_job  # typesetting while writing: None when it cannot help

        # a library's books make no PDF while writing: a pool per book in flight would be dozens of processes
        background = None if self.mode.plan_only or self.shared is not None else for_job(settings)
        if background is not None:
            bus.consumers.append(background)
            writer.on_section = background.section_landed
        job = JobInfo(self.prompt, settings, self.out_dir, urls, usable[0][1], t_start, forecast, timeline)
        try:
            return await self._write_and_publish(_Setup(job, usable, caps, fits, profile, writer, background))
        finally:
            if background is not None:
                bus.consumers.remove(background)
                with anyio.CancelScope(shield=True):  # a second Ctrl-C too: the workers are stopped, not left
                    await anyio.to_thread.run_sync(background.close)

    async def _write_and_publish(self, setup: _Setup) -> Result | Planned:
        settings, bus, journal = self.settings, self.bus, self.journal
        job, writer, background = setup.job, setup.writer, setup.background
        from ..metrics import MetricsSampler

        async with AsyncExitStack() as stack:
            if self.shared is not None:
                fleet, sampler, rank = self.shared.fleet, self.shared.sampler, self.shared.rank
            else:
                clients = await stack.enter_async_context(open_clients(setup.usable, settings))
                fleet = Fleet(clients, setup.caps, bus, all_down_timeout=settings.all_down_timeout_s)
                sampler = MetricsSampler(job.backends, interval=settings.metrics_interval_s, on_sample=bus)
                rank = 0
            dispatcher = Dispatcher(fleet, bus, settings.attempts, self.deltas, journal=journal, rank=rank)
            planner = Planner(dispatcher, self.prompt, settings, bus, settings.templates, profile=setup.profile)
            try:
                written = await writer.run(fleet, dispatcher, planner, sampler, outline=self.mode.outline,
                                           plan_only=self.mode.plan_only)
            except BaseException:
                if writer.stop == Stop.CANCEL:  # a second Ctrl-C: Interrupted
                    self.status = RunStatus.INTERRUPTED
                raise
            self.requests = written.requests
        plan_levels = [n - r for n, r in zip(planner.level_requests, dispatcher.resumed_levels, strict=False)]

        if journal.failure is not None:  # nothing more is written where the journal could not keep what it had
            raise journal.failure
        if self.mode.plan_only:
            self.status = RunStatus.PLANNED if written.outline is not None else status_after(written.stop)
            with _output_errors(journal):
                planned = save_plan(job, written, partial(self._plan_forecast, setup.fits))
            if written.stop == Stop.ALL_DOWN and written.outline is None:
                raise BackendError(stopped_message(journal, str(written.all_down_error)))
            return planned
        with _output_errors(journal):
            if self.shared is not None:  # a library's book: assembly and its defect report off the shared loop
                draft = await anyio.to_thread.run_sync(save_book, job, written, tuple(plan_levels), journal.path)
            else:
                draft = save_book(job, written, tuple(plan_levels), journal.path)
        self.status = draft.status
        journal.end_run(self.status, self.requests)
        with _output_errors(journal):
            result = await publish(job, draft, bus, background)
        if journal.failure is not None:  # the book is on disk, but the journal did not keep how the run ended
            raise journal.failure
        if written.stop == Stop.ALL_DOWN:
            raise BackendError(stopped_message(journal, str(written.all_down_error)))
        return result

    async def _forecast(self, usable: list[tuple[Backend, str]]) -> tuple[list[StepFit], dict[str, Any] | None]:
        """The forecast of this run: of what is left to write when the outline is known (written from outline.md, or
        resumed), else of the whole shape, planning included."""
        settings, journal = self.settings, self.journal
        wanted = settings.wants_forecast or self.mode.plan_only or (
            self.mode.outline is not None and (self.out_dir / FORECAST_FILE).exists())
        if not wanted:
            return [], None
        outline = self.mode.outline or journal.outline
        sections = job_sections(settings, outline, self.budget)
        try:
            fits = await fits_for(usable, settings, self.out_dir, self.budget, sections,
                                  on_probe=_probe_note(self.bus, usable))
        except BackendError as e:
            self.no_forecast = str(e)  # a forecast is a help, not the job: say why there is none, and go on
            log.warning("no forecast: %s", e)
            return [], None
        if self.mode.plan_only:
            return fits, None  # forecast after planning, of the outline it made (save_plan)
        done = set() if outline is None else written_paths(outline, journal, settings,
                                                            resolve_profile(settings, usable[0][1]))
        data = forecast_json(forecast_of(outline, settings, fits, planned=outline is not None, done=done), self.budget)
        write_json(self.out_dir / FORECAST_FILE, data)  # a rerun reads the step times back instead of probing
        return fits, data

    def _plan_forecast(self, fits: list[StepFit], outline: Outline) -> dict[str, Any]:
        """forecast.json of `handbook plan`: what writing ``outline`` will take, or why there is no forecast."""
        if not fits:
            return {"available": False, "reason": self.no_forecast or "no step times"}
        return forecast_json(forecast_of(outline, self.settings, fits, planned=True), self.budget)


@contextmanager
def _output_errors(journal: Journal) -> Iterator[None]:
    """An output file that cannot be written (book.md, stats.json, ...: each is written whole or not at all, see
    osutil.atomic_write) ends the job with OutputError: which file, why, and what the journal keeps."""
    try:
        yield
    except OSError as e:
        why = e.strerror or " ".join(str(e).split()) or type(e).__name__
        raise OutputError(journal.lost_message(str(e.filename or journal.path.parent), why)) from None


def _warn_if_edited(out_dir: Path, outline: Outline) -> None:
    """The main job resumes the journal's outline; an edited outline.md beside it is for `handbook write`."""
    from ..core.outline_md import FILENAME, edits_in

    if edits_in(out_dir, outline)[0]:
        log.warning("%s differs from the outline this job resumes, which it leaves alone; write the edited outline "
                    "with: handbook write %s", out_dir / FILENAME, out_dir)
