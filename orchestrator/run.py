"""The job: plan -> dispatch -> assemble -> typeset -> report, with one stream of events to every consumer.

``generate``/``agenerate`` are the library's entry points. A job discovers its backends, writes every section
(``orchestrator.write``), then saves and typesets the book (``orchestrator.finish``).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from .client import BackendClient, discover
from .config import Backend, Settings, slugify, unique_backends
from .dispatch import Dispatcher
from .errors import BackendError, ConfigError, HandbookError, unwrap
from .events import Event, JobStarted
from .finish import JobInfo, Result, publish, save_book
from .fleet import Fleet
from .journal import Journal
from .osutil import prepare_out_dir, raise_open_file_limit
from .plan import Planner
from .profiles import resolve_profile
from .prompts import render
from .write import Writer, stopped_message

log = logging.getLogger("handbook")

FD_RESERVE = 128  # files, the journal, /metrics scrapes, the feed, the typesetter
DISCOVER_TIMEOUT_S = 7.0  # an unreachable backend is reported within 10 s


class _Bus:
    """Fans events out to consumers; a consumer that raises is reported once and dropped, never kills the job."""

    def __init__(self, consumers: Sequence[Callable[[Event], None]]):
        self.consumers = list(consumers)

    def __call__(self, event: Event) -> None:
        for c in list(self.consumers):
            try:
                c(event)
            except Exception as e:  # a display bug must not lose the book
                log.warning("an event consumer failed and was detached: %s: %s", type(e).__name__, e)
                self.consumers.remove(c)


def _engine_progress(message: str) -> None:
    # The engine takes about a minute to start on 2 cores: say what it is doing rather than stay silent.
    print(f"handbook: local engine: {message}", file=sys.stderr, flush=True)


def default_out(prompt: str) -> Path:
    return Path("handbook-out") / slugify(prompt)


def prepare_out(out: str | os.PathLike | None, prompt: str) -> Path:
    return prepare_out_dir(out if out is not None else default_out(prompt))


def ensure_open_files(caps: list[int]) -> list[int]:
    """Raise the open-file soft limit to what the fan-out needs; if the hard limit is lower, shrink the caps
    (and say so) rather than let sockets fail."""
    needed = sum(caps) + FD_RESERVE
    soft = raise_open_file_limit(needed)
    if soft >= needed:
        return caps
    room = max(len(caps), soft - FD_RESERVE)
    scale = room / sum(caps)
    new = [max(1, math.floor(c * scale)) for c in caps]
    log.warning(
        "the open-file limit is %d (it cannot be raised further) but %d concurrent streams need %d; "
        "lowering the per-backend caps to %s so no socket fails",
        soft, sum(caps), needed, new,
    )
    return new


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
    settings = settings or Settings()
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("the prompt is empty: say what the book should be about")
    prompt = prompt.strip()
    out_dir = prepare_out(out, prompt)
    consumers: list[Callable[[Event], None]] = []
    if callable(on_event):
        consumers.append(on_event)
    elif on_event:
        consumers.extend(on_event)
    bus = _Bus(consumers)

    # The journal is opened before any backend is asked: another job's journal is bad input, found at once.
    journal = Journal.open(out_dir, prompt, settings, fresh=fresh)
    job = _Job(prompt, settings, out_dir, bus, journal, deltas=deltas, handle_sigint=handle_sigint)
    try:
        if not backends:
            from .engine import LocalEngine  # the embedded default: a real model on the CPU

            async with LocalEngine(on_progress=_engine_progress) as engine:
                assert engine.url is not None  # set on entering
                return await job.run([Backend(engine.url, cap=settings.cap)])
        bk = unique_backends([b if isinstance(b, Backend) else Backend(b, cap=settings.cap) for b in backends])
        return await job.run(bk)
    except BaseExceptionGroup as group:
        inner = unwrap(group)
        if inner is group:
            raise
        raise inner from None
    finally:
        journal.end_run(job.status, job.requests)
        journal.close()


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
                handle_sigint=handle_sigint)
    )


async def _discover_all(backends: list[Backend], settings: Settings) -> list[tuple[Backend, str]]:
    found: list[tuple[Backend, str] | HandbookError] = [None] * len(backends)  # type: ignore[list-item]
    timeout = min(settings.connect_timeout_s, DISCOVER_TIMEOUT_S)

    async def one(i: int, b: Backend) -> None:
        try:
            found[i] = (b, await discover(b, settings.api_key, settings.model, timeout_s=timeout))
        except HandbookError as e:
            found[i] = e

    async with anyio.create_task_group() as tg:
        for i, b in enumerate(backends):
            tg.start_soon(one, i, b)
    errors = [e for e in found if isinstance(e, HandbookError)]
    config_errors = [e for e in errors if isinstance(e, ConfigError)]
    if config_errors:
        raise config_errors[0]
    ok = [x for x in found if not isinstance(x, HandbookError)]
    if not ok:
        if len(errors) == 1:
            raise errors[0]
        raise BackendError("no backend reachable: " + "; ".join(str(e) for e in errors))
    for e in errors:
        log.warning("leaving out a backend: %s", e)
    return ok


class _Job:
    """One run of a job: discover the backends, write the sections (``orchestrator.write``), then save and typeset
    the book (``orchestrator.finish``). ``status`` ends up as complete / incomplete / interrupted / aborted (for
    the journal)."""

    def __init__(self, prompt: str, settings: Settings, out_dir: Path, bus: _Bus, journal: Journal, *,
                 deltas: bool, handle_sigint: bool):
        self.prompt = prompt
        self.settings = settings
        self.out_dir = out_dir
        self.bus = bus
        self.journal = journal
        self.deltas = deltas
        self.handle_sigint = handle_sigint
        self.status = "aborted"
        self.requests = 0

    async def run(self, backends: list[Backend]) -> Result:
        from .metrics import MetricsSampler

        settings, bus, journal = self.settings, self.bus, self.journal
        usable = await _discover_all(backends, settings)
        journal.check_model(",".join(sorted({model for _, model in usable})))
        caps = ensure_open_files([b.cap for b, _ in usable])
        urls = tuple(b.url for b, _ in usable)
        t_start = time.monotonic()
        bus(JobStarted(self.prompt, urls, settings.public(), t_start))
        profile = resolve_profile(settings, usable[0][1])
        render(profile.section_template, settings.templates, book="", part="", chapter="", section="", words=1,
               book_phrase="")  # a broken template fails now, not after planning

        writer = Writer(settings, profile, bus, journal, handle_sigint=self.handle_sigint)
        async with _clients(usable, settings) as clients:
            fleet = Fleet(clients, caps, bus, all_down_timeout=settings.all_down_timeout_s)
            dispatcher = Dispatcher(fleet, bus, settings.attempts, self.deltas, journal=journal)
            sampler = MetricsSampler(urls, interval=settings.metrics_interval_s, on_sample=bus)
            planner = Planner(dispatcher, self.prompt, settings, bus, settings.templates, profile=profile)
            try:
                written = await writer.run(fleet, dispatcher, planner, sampler)
            except BaseException:
                if writer.stop == "cancel":  # a second Ctrl-C: Interrupted
                    self.status = "interrupted"
                raise
            self.requests = written.requests
        plan_levels = [n - r for n, r in zip(planner.level_requests, dispatcher.resumed_levels, strict=False)]

        job = JobInfo(self.prompt, settings, self.out_dir, urls, usable[0][1], t_start)
        draft = save_book(job, written, tuple(plan_levels), journal.path)
        self.status = draft.status
        journal.end_run(self.status, self.requests)
        result = await publish(job, draft, bus)
        if written.stop == "all-down":
            raise BackendError(stopped_message(journal, str(written.all_down_error)))
        return result


class _clients:
    def __init__(self, usable: list[tuple[Backend, str]], settings: Settings):
        self.clients = [
            BackendClient(
                b, model, api_key=settings.api_key, connect_timeout=settings.connect_timeout_s,
                first_token_timeout=settings.first_token_timeout_s, chunk_timeout=settings.chunk_timeout_s,
            )
            for b, model in usable
        ]

    async def __aenter__(self) -> list[BackendClient]:
        for c in self.clients:
            await c.__aenter__()
        return self.clients

    async def __aexit__(self, *exc: Any) -> None:
        for c in self.clients:
            await c.__aexit__(*exc)
