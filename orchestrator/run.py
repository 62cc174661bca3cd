"""The job: plan -> dispatch -> assemble -> typeset -> report, with one stream of events to every consumer."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import orjson

from .assemble import INTERRUPTED, Book, SectionText, assemble, normalise_title
from .client import BackendClient, Reply, discover
from .config import Backend, Settings, slugify, unique_backends
from .dispatch import Dispatcher, Fleet
from .errors import BackendError, ConfigError, HandbookError, Interrupted, unwrap
from .events import JobFinished, JobStarted, NodeFinished, OutlineReady
from .journal import Journal, Resuming
from .osutil import prepare_out_dir, raise_open_file_limit
from .outline import Outline, SectionRef
from .plan import Planner
from .profiles import Profile, resolve_profile
from .prompts import book_phrase, render
from .report import JobRecord, build_stats

log = logging.getLogger("handbook")

FD_RESERVE = 128  # files, the journal, /metrics scrapes, the feed, the typesetter
DISCOVER_TIMEOUT_S = 7.0  # an unreachable backend is reported within 10 s
CONTINUATION_TOKENS = 96  # --finish-truncated: enough for the end of a sentence and one more


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


class _Bus:
    """Fans events out to consumers; a consumer that raises is reported once and dropped, never kills the job."""

    def __init__(self, consumers: Sequence[Callable[[Any], None]]):
        self.consumers = list(consumers)
        self.wants_deltas = any(getattr(c, "wants_deltas", True) for c in self.consumers)

    def __call__(self, event: Any) -> None:
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
    on_event: Callable[[Any], None] | Sequence[Callable[[Any], None]] | None = None,
    *,
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
    consumers: list[Callable[[Any], None]] = []
    if callable(on_event):
        consumers.append(on_event)
    elif on_event:
        consumers.extend(on_event)
    bus = _Bus(consumers)

    # The journal is opened before any backend is asked: another job's journal is bad input, found at once.
    journal = Journal.open(out_dir, prompt, settings, fresh=fresh)
    job = _Job(prompt, settings, out_dir, bus, journal, handle_sigint)
    try:
        if not backends:
            from .engine import LocalEngine  # the embedded default: a real model on the CPU

            async with LocalEngine(on_progress=_engine_progress) as engine:
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
    on_event: Callable[[Any], None] | Sequence[Callable[[Any], None]] | None = None,
    *,
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
    """
    return anyio.run(
        partial(agenerate, prompt, backends, settings, out, on_event, fresh=fresh, handle_sigint=handle_sigint)
    )


async def _discover_all(backends: list[Backend], settings: Settings) -> list[tuple[Backend, str]]:
    found: list[tuple[Backend, str] | HandbookError] = [None] * len(backends)  # type: ignore[list-item]
    timeout = min(settings.connect_timeout_s, DISCOVER_TIMEOUT_S)

    async def one(i: int, b: Backend) -> None:
        try:
            found[i] = (b, await discover(b, settings.api_key, settings.model, timeout=timeout))
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


class _Stop:
    """Why the writing stopped early, if it did: "interrupt" (Ctrl-C), "cancel" (a second Ctrl-C) or "all-down"."""

    def __init__(self) -> None:
        self.reason: str | None = None


class _Job:
    """One run of a job: plan (or take the outline from the journal) -> write what is missing -> assemble,
    typeset and report. ``status`` ends up as complete / incomplete / interrupted / aborted (for the journal)."""

    def __init__(self, prompt: str, settings: Settings, out_dir: Path, bus: _Bus, journal: Journal,
                 handle_sigint: bool):
        self.prompt = prompt
        self.settings = settings
        self.out_dir = out_dir
        self.bus = bus
        self.journal = journal
        self.handle_sigint = handle_sigint
        self.status = "aborted"
        self.requests = 0
        self.stop = _Stop()

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

        sections: dict[str, SectionText] = {}
        resumed_sections = 0
        write_window: dict[str, float | None] = {"start": None, "end": None}
        outline: Outline | None = journal.outline
        t_titles: float | None = None

        async with _clients(usable, settings) as clients:
            fleet = Fleet(clients, caps, bus, all_down_timeout=settings.all_down_timeout_s)
            dispatcher = Resuming(Dispatcher(fleet, bus, settings.attempts, bus.wants_deltas), journal)
            sampler = MetricsSampler(urls, interval=settings.metrics_interval_s, on_sample=bus)
            planner = Planner(dispatcher, self.prompt, settings, bus, settings.templates, journal=journal,
                              profile=profile)

            async def write_section(ref: SectionRef, order: int) -> None:
                nonlocal resumed_sections
                text = render(
                    profile.section_template, settings.templates, book=ref.book, part=ref.part,
                    chapter=ref.chapter, section=ref.title, words=settings.words, book_phrase=book_phrase(ref.book),
                )
                messages = profile.messages(text)
                check = SectionCheck(ref.title)

                def build(client: BackendClient, attempt: int) -> dict:
                    if write_window["start"] is None:  # the first section request actually sent
                        write_window["start"] = time.monotonic()
                    if check.loop is not None:  # the one re-ask of a looping section: stronger settings
                        return client.body(messages, max_tokens=settings.max_tokens,
                                           temperature=max(profile.temperature, profile.loop_temperature),
                                           sampling=profile.loop_sampling())
                    return client.body(messages, max_tokens=settings.max_tokens, temperature=profile.temperature,
                                       sampling=profile.sampling())

                # One lookup decides resuming: the journal answers this section only if it was written for this
                # very title (Resuming); anything else is asked again. A stored section is taken as it was
                # accepted (its repair note comes back with it).
                outcome = await dispatcher.run(
                    ref.path, "section", ref.title, build, check, priority=(1, order),
                    restore=lambda stored: stored.value if isinstance(stored.value, dict) else {},
                    keep=lambda value: value,
                )
                r = outcome.reply
                if outcome.attempts == 0:
                    resumed_sections += 1
                elif r.ok and r.finish_reason == "length" and settings.finish_truncated:
                    r = await self._finish(dispatcher, ref, messages, r, profile, outcome.value)
                repaired = (outcome.value or {}).get("repaired_from") if r.ok else None
                sections[ref.path] = SectionText(
                    ref.path, ref.part, ref.chapter, ref.title,
                    r.text if r.ok else "", r.finish_reason, r.completion_tokens, r.backend or None,
                    None if r.ok else f"failed after {outcome.attempts} attempts: {r.error}",
                    repaired_from=repaired,
                )
                if r.ok:
                    bus(NodeFinished(ref.path, "section", ref.title, r, time.monotonic()))
                if outcome.attempts:
                    write_window["end"] = time.monotonic()

            async with anyio.create_task_group() as bg:
                await bg.start(fleet.run)
                bg.start_soon(sampler.run)
                with anyio.CancelScope() as writing:
                    bg.start_soon(self._watch_all_down, fleet, writing)
                    if self.handle_sigint:
                        bg.start_soon(self._watch_sigint, fleet, writing, bg)
                    async with anyio.create_task_group() as work:

                        def section_ready(book: str, part: str, chapter_path: str, chapter: str, si: int,
                                          title: str) -> None:
                            # pipeline: called the moment the title has streamed past in its chapter's list
                            ref = SectionRef(f"{chapter_path}.{si}", book, part, chapter, title)
                            work.start_soon(write_section, ref, _order_base(chapter_path, settings) + si)

                        if outline is None:
                            outline = await planner.plan(on_section=section_ready)
                            journal.store_outline(outline)
                            pipelined = settings.pipeline
                        else:
                            pipelined = False  # the journal's outline: every section can go at once
                        t_titles = planner.t_titles_known or time.monotonic()
                        bus(OutlineReady(outline, time.monotonic()))
                        if not pipelined:
                            for order, ref in enumerate(outline.sections()):
                                work.start_soon(write_section, ref, order)
                if self.stop.reason == "cancel":
                    self.status = "interrupted"
                    raise Interrupted(self._stopped_message("stopped at once (second Ctrl-C)"))
                await sampler.sample_once()
                bg.cancel_scope.cancel()
            replies = list(dispatcher.replies)
            self.requests = dispatcher.requests

        if outline is None:  # stopped while planning: the book has a title at most
            outline = Outline(title=self.prompt)
        book = assemble(outline, sections, INTERRUPTED if self.stop.reason == "interrupt" else "not written")
        if self.stop.reason == "interrupt" and t_titles is not None and len(sections) == len(book.sections):
            self.stop.reason = None  # Ctrl-C came when every section was already in: nothing is missing
        markdown = book.markdown
        if self.stop.reason is not None:
            markdown = _mark_incomplete(markdown, self.stop.reason, len(sections), len(book.sections),
                                        planned=t_titles is not None)
            book = Book(book.outline, book.sections, markdown)
        paths = _write_outputs(self.out_dir, book, outline)
        t_end = time.monotonic()
        counted = None
        if write_window["start"] is not None:
            # names the backends it covers (and why others are not), or says why nothing could be counted
            counted = sampler.counted(write_window["start"], write_window["end"] or t_end)

        failed = tuple(s.path for s in book.sections if s.failed or s.empty)
        complete = not failed and self.stop.reason is None
        self.status = "complete" if complete else ("interrupted" if self.stop.reason else "incomplete")
        if self.stop.reason == "all-down":
            self.status = "aborted"

        # Everything but the PDF is on disk before typesetting starts: a typesetting failure loses nothing.
        defects = _write_defects(self.out_dir, book, paths)
        plan_levels = [n - r for n, r in zip(planner.level_requests, dispatcher.resumed_levels, strict=False)]
        stats = build_stats(
            JobRecord(
                backends=urls,
                plan_levels=tuple(plan_levels),
                book=book,
                replies=tuple(replies),
                t_start=t_start,
                t_titles_known=t_titles or t_end,
                t_write_start=write_window["start"],
                t_write_end=write_window["end"],
                t_end=t_end,
                resumed_sections=resumed_sections,
                server_counted=counted,
                probe_tokens=sum(load.client.probe_tokens for load in fleet.loads),
            )
        )
        for warning in stats["warnings"]:  # e.g. a backend that sent no usage: tokens_written undercounts
            log.warning("%s", warning)
        stats["model"] = usable[0][1]
        stats["interrupted"] = self.stop.reason is not None
        for pb, load in zip(stats["per_backend"], fleet.loads, strict=True):
            pb["max_in_flight"] = load.max_in_flight
            pb["cap"] = load.cap
            pb["left_rotation"] = load.trips
            pb["probe_completions"] = load.client.probe_completions
            pb["probe_failures"] = load.client.probe_failures
            pb["probe_tokens"] = load.client.probe_tokens
        _write_stats(self.out_dir, stats, paths)
        paths["journal"] = journal.path
        journal.end_run(self.status, self.requests)

        typeset_error = None
        if self.stop.reason is None and any(f in settings.formats for f in ("html", "pdf")):
            typeset_error = await self._typeset(book, paths, stats)
            _write_stats(self.out_dir, stats, paths)

        bus(JobFinished(stats, complete, time.monotonic()))
        if self.stop.reason == "all-down":
            raise BackendError(self._stopped_message(str(fleet.all_down_error)))
        return Result(book.markdown, outline, stats, defects, paths, complete, failed,
                      interrupted=self.stop.reason == "interrupt", typeset_error=typeset_error)

    async def _finish(self, dispatcher: Resuming, ref: SectionRef, messages: list[dict[str, str]], first: Reply,
                      profile: Profile, value: Any = None) -> Reply:
        """``--finish-truncated``: one short continuation request for a section stopped by the token cap. The
        section keeps finish_reason "length" (defects count it as truncated, as generated); book.md gets the
        finished text. A failed continuation leaves the section as it was (cut back in book.md)."""
        from dataclasses import replace as dc_replace

        follow = [*messages, {"role": "assistant", "content": first.text},
                  {"role": "user", "content": "Finish the last sentence and end the section in one or two more "
                                              "sentences. Do not repeat anything."}]
        out = await dispatcher.d.run(
            ref.path, "section", ref.title,
            lambda client, attempt: client.body(follow, max_tokens=CONTINUATION_TOKENS,
                                                temperature=profile.temperature, sampling=profile.sampling()),
            priority=(1, 0),
        )
        if not out.reply.ok:
            return first
        joiner = "" if first.text.endswith((" ", "\n")) or out.reply.text.startswith((" ", "\n")) else " "
        done = dc_replace(first, text=first.text + joiner + out.reply.text.strip(),
                          completion_tokens=first.completion_tokens + out.reply.completion_tokens)
        self.journal.record(ref.path, "section", ref.title, done, out.attempts + first.attempt, value)
        return done

    async def _typeset(self, book: Book, paths: dict[str, Path], stats: dict[str, Any]) -> str | None:
        """Lay out book.html/book.pdf; record the time and pages in ``stats``. A failure is returned as a
        one-line message (and recorded as ``stats["typeset_error"]``): book.md, stats, defects and the journal
        are already written, so nothing is lost, and the CLI exits with TYPESET_FAILED_EXIT."""
        from .typeset import typeset

        formats = [f for f in self.settings.formats if f != "md"]
        try:
            info = await anyio.to_thread.run_sync(
                lambda: typeset(book.markdown, self.out_dir, formats, self.settings.templates)
            )
        except Exception as e:  # WeasyPrint, a template, a worker: whatever broke, the Markdown book stands
            why = " ".join(str(e).split())[:300] or type(e).__name__
            message = f"typesetting failed ({type(e).__name__}: {why})"
            stats["typeset_error"] = message
            log.warning("%s; book.md is complete in %s", message, self.out_dir)
            return message
        stats["typeset_s"] = None if info.seconds is None else round(info.seconds, 2)
        stats["pdf_pages"] = info.pdf_pages
        if info.pdf_pages is not None and info.pdf_path:
            paths["pdf"] = info.pdf_path
        if info.html_path:
            paths["html"] = info.html_path
        return None

    def _stopped_message(self, why: str) -> str:
        done = sum(1 for n in self.journal.nodes.values() if n.kind == "section") + self.journal.written_sections
        return (f"{why}; {done} finished section(s) are in {self.journal.path}: "
                "rerun the same command to resume")

    async def _watch_all_down(self, fleet: Fleet, writing: anyio.CancelScope) -> None:
        """Every backend out of rotation for settings.all_down_timeout_s: stop writing (the journal is intact)."""
        await fleet.all_down.wait()
        if self.stop.reason is None:
            self.stop.reason = "all-down"
        fleet.stop()
        writing.cancel()

    async def _watch_sigint(self, fleet: Fleet, writing: anyio.CancelScope, bg: anyio.abc.TaskGroup) -> None:
        """First Ctrl-C: dispatch nothing new, let requests in flight finish (a few seconds at most), then stop
        writing. Second Ctrl-C: stop at once."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            receiver = anyio.open_signal_receiver(signal.SIGINT)
            signals = receiver.__enter__()
        except (NotImplementedError, ValueError, RuntimeError):
            return
        try:
            async for _ in signals:
                if self.stop.reason is None:
                    self.stop.reason = "interrupt"
                    log.warning(
                        "interrupted: no new requests; waiting up to %g s for %d in flight, then writing what "
                        "exists (Ctrl-C again to stop at once)", self.settings.interrupt_grace_s, fleet.in_flight,
                    )
                    fleet.stop()
                    bg.start_soon(self._drain, fleet, writing)
                else:
                    self.stop.reason = "cancel"
                    writing.cancel()
                    return
        finally:
            receiver.__exit__(None, None, None)

    async def _drain(self, fleet: Fleet, writing: anyio.CancelScope) -> None:
        with anyio.move_on_after(self.settings.interrupt_grace_s):
            while fleet.in_flight:
                await anyio.sleep(0.05)
        writing.cancel()


def _mark_incomplete(markdown: str, reason: str, written: int, total: int, planned: bool) -> str:
    why = {"interrupt": "the run was interrupted", "all-down": "every backend stopped answering"}.get(reason, reason)
    what = f"{written} of {total} sections are written" if planned else "the outline was not finished"
    note = (f"> **Incomplete:** {why}; {what}. Rerun the same command to resume from the journal "
            f"(journal.sqlite).\n")
    head, _, rest = markdown.partition("\n")
    return f"{head}\n\n{note}\n{rest.lstrip()}"


class SectionCheck:
    """Validates a section reply (the Dispatcher retries what raises ValueError).

    * A reply that holds nothing but headings repeating its own title (a small model printing the heading and
      stopping) is empty: asked again like an empty answer.
    * A reply caught in a repetition loop (repair.loop_reason) is asked again once, with the profile's stronger
      anti-repetition settings (``build`` sees ``loop`` set); what the re-ask gives is kept even if it loops
      too, and defects.json reports it. The value is ``{"repaired_from": why}`` (journaled with the section)."""

    def __init__(self, title: str):
        self.want = normalise_title(title)
        self.loop: str | None = None  # why the first answer looped, once it did

    def __call__(self, reply: Reply) -> dict[str, str | None]:
        from .repair import loop_reason

        if not any(s and normalise_title(s) != self.want
                   for s in (line.strip().strip("#*_=- ").strip() for line in reply.text.splitlines())):
            raise ValueError("the reply only repeats the section heading")
        if self.loop is None:
            why = loop_reason(reply.text)
            if why:
                self.loop = why
                raise ValueError(f"repetition loop ({why}): asked again with stronger anti-repetition settings")
        return {"repaired_from": self.loop}


def _order_base(chapter_path: str, settings: Settings) -> int:
    pi, ci = (int(x) for x in chapter_path.split("."))
    return ((pi - 1) * settings.chapters + (ci - 1)) * (settings.sections + 1)


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


def _write_outputs(out_dir: Path, book: Book, outline: Outline) -> dict[str, Path]:
    (out_dir / "book.md").write_text(book.markdown, encoding="utf-8")
    (out_dir / "outline.json").write_bytes(orjson.dumps(outline.to_json(), option=orjson.OPT_INDENT_2))
    return {"md": out_dir / "book.md", "outline": out_dir / "outline.json"}


def _write_stats(out_dir: Path, stats: dict[str, Any], paths: dict[str, Path]) -> None:
    (out_dir / "stats.json").write_bytes(orjson.dumps(stats, option=orjson.OPT_INDENT_2))
    paths["stats"] = out_dir / "stats.json"


def _write_defects(out_dir: Path, book: Book, paths: dict[str, Path]) -> dict[str, Any] | None:
    from .defects import find_defects

    d = find_defects(book)
    data = d.to_json()
    (out_dir / "defects.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    (out_dir / "defects.md").write_text(d.to_markdown(), encoding="utf-8")
    paths["defects"] = out_dir / "defects.json"
    paths["defects_md"] = out_dir / "defects.md"
    return data


