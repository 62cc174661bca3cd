"""The job: plan -> dispatch -> assemble -> typeset -> report, with one stream of events to every consumer."""

from __future__ import annotations

import logging
import math
import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import orjson

from .assemble import Book, SectionText, assemble
from .client import BackendClient, Reply, discover
from .config import Backend, Settings, slugify
from .dispatch import Dispatcher, Fleet
from .errors import BackendError, ConfigError, HandbookError, unwrap
from .events import JobFinished, JobStarted, NodeFinished, OutlineReady
from .outline import Outline, SectionRef
from .plan import Planner
from .prompts import render
from .report import JobRecord, build_stats

log = logging.getLogger("handbook")

FD_RESERVE = 128  # files, the journal, /metrics scrapes, the feed, the typesetter


@dataclass(frozen=True)
class Result:
    """What a job produced. ``complete`` is False when any section failed or came back empty."""

    markdown: str
    outline: Outline
    stats: dict[str, Any]
    defects: dict[str, Any] | None
    paths: dict[str, Path]
    complete: bool
    failed_sections: tuple[str, ...] = field(default=())


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


def default_out(prompt: str) -> Path:
    return Path("handbook-out") / slugify(prompt)


def prepare_out(out: str | os.PathLike | None, prompt: str) -> Path:
    path = Path(out) if out is not None else default_out(prompt)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".handbook-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"cannot write to output directory {path}: {e.strerror or e}") from None
    return path


def ensure_open_files(caps: list[int]) -> list[int]:
    """Raise the open-file soft limit to what the fan-out needs; if the hard limit is lower, shrink the caps
    (and say so) rather than let sockets fail."""
    needed = sum(caps) + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return caps
    room = max(len(caps), soft - FD_RESERVE)
    scale = room / sum(caps)
    new = [max(1, math.floor(c * scale)) for c in caps]
    log.warning(
        "the open-file limit is %d (hard limit %s) but %d concurrent streams need %d; "
        "lowering the per-backend caps to %s so no socket fails",
        soft, hard, sum(caps), needed, new,
    )
    return new


async def agenerate(
    prompt: str,
    backends: Sequence[Backend | str] | None = None,
    settings: Settings | None = None,
    out: str | os.PathLike | None = None,
    on_event: Callable[[Any], None] | Sequence[Callable[[Any], None]] | None = None,
) -> Result:
    """Make a book. See ``generate`` for the arguments; this is the same inside an event loop."""
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

    try:
        if not backends:
            from .engine import LocalEngine  # the embedded default: a real model on the CPU

            async with LocalEngine() as engine:
                return await _job(prompt, [Backend(engine.url, cap=settings.cap)], settings, out_dir, bus)
        bk = [b if isinstance(b, Backend) else Backend(b, cap=settings.cap) for b in backends]
        return await _job(prompt, bk, settings, out_dir, bus)
    except BaseExceptionGroup as group:
        inner = unwrap(group)
        if inner is group:
            raise
        raise inner from None


def generate(
    prompt: str,
    backends: Sequence[Backend | str] | None = None,
    settings: Settings | None = None,
    out: str | os.PathLike | None = None,
    on_event: Callable[[Any], None] | Sequence[Callable[[Any], None]] | None = None,
) -> Result:
    """Make a book from one prompt over ``backends`` (OpenAI-compatible base URLs or Backend values).

    Writes book.md, outline.json, stats.json (and book.pdf/book.html, defects.json/defects.md) into ``out``
    and returns a Result. Raises HandbookError subclasses for bad input (ConfigError), unreachable backends
    (BackendError) or an outline that could not be made (PlanError). Failed sections do not raise: they are
    listed in ``Result.failed_sections`` and ``Result.complete`` is False.
    """
    return anyio.run(partial(agenerate, prompt, backends, settings, out, on_event))


async def _discover_all(backends: list[Backend], settings: Settings) -> list[tuple[Backend, str]]:
    found: list[tuple[Backend, str] | HandbookError] = [None] * len(backends)  # type: ignore[list-item]

    async def one(i: int, b: Backend) -> None:
        try:
            found[i] = (b, await discover(b, settings.api_key, settings.model, timeout=settings.connect_timeout_s))
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


async def _job(prompt: str, backends: list[Backend], settings: Settings, out_dir: Path, bus: _Bus) -> Result:
    from .metrics import MetricsSampler, server_counted

    usable = await _discover_all(backends, settings)
    caps = ensure_open_files([b.cap for b, _ in usable])
    urls = tuple(b.url for b, _ in usable)
    t_start = time.monotonic()
    bus(JobStarted(prompt, urls, settings.public(), t_start))

    replies: list[tuple[str, Reply]] = []
    sections: dict[str, SectionText] = {}
    write_window = {"start": None, "end": None}

    async with _clients(usable, settings) as clients:
        fleet = Fleet(clients, caps, bus)
        dispatcher = Dispatcher(fleet, bus, settings.attempts, bus.wants_deltas)
        sampler = MetricsSampler(urls, interval=settings.metrics_interval_s, on_sample=bus)
        planner = Planner(dispatcher, prompt, settings, bus, settings.templates)
        section_template_check = render("section", settings.templates, book="", part="", chapter="", section="", words=1)
        del section_template_check  # fail on a broken template before any request is made

        async def write_section(ref: SectionRef, order: int) -> None:
            if write_window["start"] is None:
                write_window["start"] = time.monotonic()
            text = render(
                "section", settings.templates, book=ref.book, part=ref.part, chapter=ref.chapter,
                section=ref.title, words=settings.words,
            )

            def build(client: BackendClient, attempt: int) -> dict:
                return client.body(
                    [{"role": "user", "content": text}], max_tokens=settings.max_tokens,
                    temperature=settings.temperature,
                )

            outcome = await dispatcher.run(ref.path, "section", ref.title, build, priority=(1, order))
            r = outcome.reply
            sections[ref.path] = SectionText(
                ref.path, ref.part, ref.chapter, ref.title,
                r.text if r.ok else "", r.finish_reason, r.completion_tokens, r.backend,
                None if r.ok else f"failed after {outcome.attempts} attempts: {r.error}",
            )
            if r.ok:
                bus(NodeFinished(ref.path, "section", ref.title, r, time.monotonic()))
            write_window["end"] = time.monotonic()

        async with anyio.create_task_group() as bg:
            await bg.start(fleet.run)
            bg.start_soon(sampler.run)
            async with anyio.create_task_group() as work:

                def chapter_ready(book: str, part: str, chapter_path: str, chapter: str, titles) -> None:
                    base = _order_base(chapter_path, settings)
                    for si, title in enumerate(titles, 1):
                        ref = SectionRef(f"{chapter_path}.{si}", book, part, chapter, title)
                        work.start_soon(write_section, ref, base + si)

                outline = await planner.plan(on_sections=chapter_ready)
                bus(OutlineReady(outline, time.monotonic()))
                if not settings.pipeline:
                    for order, ref in enumerate(outline.sections()):
                        work.start_soon(write_section, ref, order)
            await sampler.sample_once()
            bg.cancel_scope.cancel()
        replies = list(dispatcher.replies)

    book = assemble(outline, sections)
    paths = _write_outputs(out_dir, book, outline)
    t_end = time.monotonic()
    counted = None
    if write_window["start"] is not None:
        counted = server_counted(sampler.series, write_window["start"], write_window["end"])

    typeset_s = pdf_pages = None
    if any(f in settings.formats for f in ("html", "pdf")):
        from .typeset import typeset

        info = await anyio.to_thread.run_sync(
            lambda: typeset(book.markdown, out_dir, [f for f in settings.formats if f != "md"], settings.templates)
        )
        typeset_s, pdf_pages = info.seconds, info.pdf_pages
        if info.pdf_pages is not None and info.pdf_path:
            paths["pdf"] = info.pdf_path
        if info.html_path:
            paths["html"] = info.html_path

    defects = _write_defects(out_dir, book, paths)
    stats = build_stats(
        JobRecord(
            backends=urls,
            plan_levels=tuple(planner.level_requests),
            book=book,
            replies=tuple(replies),
            t_start=t_start,
            t_titles_known=planner.t_titles_known or t_end,
            t_write_start=write_window["start"],
            t_write_end=write_window["end"],
            t_end=t_end,
            server_counted=counted,
            typeset_s=typeset_s,
            pdf_pages=pdf_pages,
        )
    )
    stats["model"] = usable[0][1]
    for pb, load in zip(stats["per_backend"], fleet.loads, strict=True):
        pb["max_in_flight"] = load.max_in_flight
        pb["cap"] = load.cap
    (out_dir / "stats.json").write_bytes(orjson.dumps(stats, option=orjson.OPT_INDENT_2))
    paths["stats"] = out_dir / "stats.json"
    failed = tuple(s.path for s in book.sections if s.failed or s.empty)
    complete = not failed
    bus(JobFinished(stats, complete, time.monotonic()))
    return Result(book.markdown, outline, stats, defects, paths, complete, failed)


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


def _write_defects(out_dir: Path, book: Book, paths: dict[str, Path]) -> dict[str, Any] | None:
    try:
        from .defects import find_defects
    except ImportError:  # pragma: no cover - defects land with the typesetting issue
        return None
    d = find_defects(book)
    data = d.to_json()
    (out_dir / "defects.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    (out_dir / "defects.md").write_text(d.to_markdown(), encoding="utf-8")
    paths["defects"] = out_dir / "defects.json"
    paths["defects_md"] = out_dir / "defects.md"
    return data


