"""A library: many books over one fleet, a dataset out (``handbook library FILE``, :func:`generate_library`).

FILE (``library_input``) is checked whole, every line, before the first request. Then one set of backends is
discovered and one :class:`~orchestrator.dispatch.fleet.Fleet` (one set of leases and caps) and one
:class:`~orchestrator.metrics.MetricsSampler` serve every book: each book runs as the single-book job does
(``run.session``: its own folder ``DIR/books/<id>/`` with its journal, book.md, stats.json, defects.json; a PDF
only when ``--format`` asks), given the library's fleet (``run.SharedFleet``). A book's place in the library is
its ``rank``, which the Dispatcher puts between a request's kind and its order, so the fleet serves every book's
planning first, then the oldest book's sections: books finish roughly in order, and the next books are planned
while earlier ones are written, so the fleet never drains between books. ``books_in_flight`` bounds the books
open at once (default :func:`default_books_in_flight`).

Resume and change: ``books/<id>/book.json`` keeps the line's key (``library_input.book_key``: its prompt and the
settings that change its text) and how the book ended. A book whose key is unchanged and that ended complete is
not asked again (its dataset rows are carried over); one that was cut off resumes its own journal; a line whose
prompt or settings changed redoes that book only (its journal is started afresh); appended lines add books. One
journal per book, inside the library's folder, rather than one for the library: a book of a library is then a
book like any other (``handbook write DIR/books/<id>`` works on it), and no book's rows wait on another's.

A book whose planning fails every attempt is reported by id and does not stop the others (``failed_books``; exit 1
at the end). Every backend gone stops the library (BackendError, exit 3) with every finished book kept.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson

from ..book.crossdup import CrossIndex
from ..core.config import Backend, Settings, slugify
from ..core.errors import BackendError, ConfigError, HandbookError, OutputError, PlanError
from ..core.events import Event, NodeFinished
from ..core.osutil import atomic_write, ensure_open_files, prepare_out_dir
from ..core.states import NodeKind
from ..dispatch.fleet import Fleet
from ..dispatch.journal import FILENAME, section_times
from ..dispatch.journal_files import lock_out_dir, unlock
from ..views.library_progress import BookFinished, BookStarted, LibraryStarted, LibraryState
from .connect import backends_up, discover_all, open_clients
from .finish import Result
from .library_dataset import DatasetWriter, book_row, journal_times, section_rows
from .library_index import book_passes, index_carried
from .library_input import LibraryBook, check_file, iter_books
from .library_stats import Totals, book_counts, error_of, library_defects, read_index, write_index
from .options import Mode, Options, SharedFleet
from .repairs import first_sentence
from .run import session

log = logging.getLogger("handbook")

__all__ = ["LibraryResult", "agenerate_library", "default_books_in_flight", "generate_library"]

LIBRARY_LOCK = "library.sqlite"  # the lock file's stem: DIR/library.sqlite.lock, held while a run uses DIR
FILES_PER_BOOK = 6  # open files of a book in flight: its journal (database, WAL, shared memory), its lock
MAX_DEFAULT_BOOKS = 64  # books in flight the default goes to at most (a library of tiny books on a large fleet)
LIBRARY_SETTINGS = {"formats": ("md",), "stream_sections": "auto"}  # a library's defaults where the caller is silent


@dataclass(frozen=True)
class LibraryResult:
    """What a library run produced: ``stats`` (DIR/stats.json), ``defects`` (DIR/defects.json), ``paths`` (the
    dataset's files and the two JSON files), ``failed_books`` ((id, why) of the books that failed: their planning,
    or a section that failed or came back empty), ``books`` in this shard."""

    out: Path
    stats: dict[str, Any]
    defects: dict[str, Any]
    paths: dict[str, Path]
    books: int
    failed_books: tuple[tuple[str, str], ...]
    interrupted: bool = False  # stopped by Ctrl-C: what was finished is written; the same command resumes

    @property
    def complete(self) -> bool:
        return not self.failed_books and not self.interrupted


def default_books_in_flight(caps: Sequence[int], settings: Settings) -> int:
    """Books open at once when not given: enough that their sections fill every backend's cap four times over (a
    book's sections start as its chapters are planned, and its tail runs beside the next books'), at least 2.
    Measured (benchmarks/library_throughput.py, 40 books of 2 x 4 x 8 on 4 cards at cap 64): 8 books in flight (2x)
    gave 0.87 of the bench level's rate, 16 (4x) 0.94, 32 0.94. ``settings``:
    a book's (the library's first: the runner takes its shape for the library's)."""
    per_book = settings.parts * settings.chapters * settings.sections
    return min(MAX_DEFAULT_BOOKS, max(2, math.ceil(4 * sum(caps) / max(1, per_book))))


def generate_library(file: str | os.PathLike[str], backends: Sequence[Backend | str] | None = None,
                     settings: Settings | None = None, out: str | os.PathLike[str] | None = None,
                     on_event: Callable[[Any], None] | None = None, **options: Any) -> LibraryResult:
    """Make every book of ``file`` over ``backends`` into ``out``; :func:`agenerate_library`'s arguments."""
    from ..wire.sseproto import event_loop_options

    async def main() -> LibraryResult:
        return await agenerate_library(file, backends, settings, out, on_event, **options)

    return anyio.run(main, backend_options=event_loop_options())


async def agenerate_library(
    file: str | os.PathLike[str],
    backends: Sequence[Backend | str] | None = None,
    settings: Settings | None = None,
    out: str | os.PathLike[str] | None = None,
    on_event: Callable[[Any], None] | None = None,
    *,
    books_in_flight: int | None = None,
    shard: tuple[int, int] | None = None,
    dataset: Sequence[str] = ("parquet",),
    dedupe: str = "report",
    deltas: bool = False,
    fresh: bool = False,
    handle_sigint: bool = False,
) -> LibraryResult:
    """Make every book of ``file`` (JSONL, a book a line, or plain text, a prompt a line) into ``out``.

    ``settings``: the run's (a line's own settings apply to its book; default: md only and unstreamed sections,
    :data:`LIBRARY_SETTINGS`); ``shard`` (i, n): only the books whose id hashes to shard i of n; ``dataset``:
    "parquet" and optionally "jsonl"; ``dedupe``: "report" (near-duplicates across books in defects.json) or
    "reask" (also each book's sections that nearly repeat a finished book's asked again once, job/repairs.py);
    ``on_event``: called with :class:`~orchestrator.views.library_progress.
    BookStarted`/``BookFinished`` and the fleet's events; ``deltas``: the books' text as it streams (to the
    ``on_event`` of each book through :class:`LibraryState`). ``handle_sigint``: the first Ctrl-C starts no more
    books and lets requests in flight finish for ``settings.interrupt_grace_s``; the dataset and stats.json are then
    written with what is finished (``LibraryResult.interrupted``); a second stops at once. Raises ConfigError (a bad
    line: ``FILE:LINE: ...``)
    before any request, BackendError when no backend answers."""
    settings = settings or Settings(**LIBRARY_SETTINGS)  # type: ignore[arg-type]
    if dedupe not in ("report", "reask"):
        raise ConfigError(f"dedupe must be report or reask; got {dedupe!r}")
    if books_in_flight is not None and (not isinstance(books_in_flight, int) or books_in_flight < 1):
        raise ConfigError(f"books_in_flight must be a whole number of books, 1 or more; got {books_in_flight!r}")
    summary = check_file(Path(file), settings, shard)
    out_dir = prepare_out_dir(out if out is not None else Path("handbook-out") / f"library-{slugify(Path(file).stem)}")
    prepare_out_dir(out_dir / "books")
    run = _Library(Path(file), settings, out_dir, shard, dataset, deltas, fresh)
    run.handle_sigint, run.dedupe = handle_sigint, CrossIndex() if dedupe == "reask" else None
    lock = lock_out_dir(out_dir / LIBRARY_LOCK)  # one run per library folder (a ConfigError when another holds it)
    try:
        return await _run(run, summary.in_shard, on_event, backends, books_in_flight)
    finally:
        unlock(lock)


async def _run(run: _Library, books: int, on_event: Callable[[Any], None] | None,
               backends: Sequence[Backend | str] | None, books_in_flight: int | None) -> LibraryResult:
    settings, file, shard = run.settings, run.file, run.shard
    run.books = books
    run.consumers.extend([on_event] if on_event is not None else [])
    async with backends_up(backends, settings) as bk:
        usable = await discover_all(bk, settings)
        first = next(iter_books(file, settings, shard), None)  # the library's shape: its first book's
        caps = [b.cap for b, _ in usable]
        limit = books_in_flight or default_books_in_flight(caps, first.settings if first else settings)
        # each book in flight holds its journal open (the database, its WAL and shared memory, its lock)
        caps = ensure_open_files([*caps, FILES_PER_BOOK * limit])[:len(usable)]
        async with open_clients(usable, settings) as clients:
            return await run.run(usable, caps, clients, limit)


class _Library:
    """One run of a library over one fleet."""

    def __init__(self, file: Path, settings: Settings, out_dir: Path, shard: tuple[int, int] | None,
                 dataset: Sequence[str], deltas: bool, fresh: bool):
        self.file, self.settings, self.out_dir, self.shard = file, settings, out_dir, shard
        self.dataset, self.deltas, self.fresh = tuple(dataset), deltas, fresh
        self.state = LibraryState()  # the library's own count of books done and failed
        self.books = 0
        self.consumers: list[Callable[[Any], None]] = [self.state]
        self.totals = Totals()
        self.failed: list[tuple[str, str]] = []
        self.forecast: dict[str, Any] | None = None
        self.model = ""
        self.models: dict[str, str] = {}
        self.handle_sigint = False
        self.dedupe: CrossIndex | None = None  # --dedupe reask: the finished books' sections
        self.finished_before: dict[str, str] = {}  # id -> key of the books an earlier run finished complete
        self.lines: dict[str, int] = {}  # the line of each book that failed
        self.stopped_by: HandbookError | None = None  # every backend gone, or the output cannot be written
        self.interrupted = False
        self.books_scope = anyio.CancelScope()

    async def run(self, usable: list[tuple[Backend, str]], caps: list[int], clients: list[Any],
                  books_in_flight: int) -> LibraryResult:
        from ..metrics import MetricsSampler

        settings = self.settings
        self.model = ",".join(sorted({m for _, m in usable}))
        self.models = {b.url: m for b, m in usable}  # a section's row names its own backend's model
        fleet = Fleet(clients, caps, self.bus, all_down_timeout=settings.all_down_timeout_s)
        sampler = MetricsSampler([b.url for b, _ in usable], interval=settings.metrics_interval_s, on_sample=self.bus)
        if any(b.power for b, _ in usable):
            sampler.set_power({b.url: b.power for b, _ in usable})
        t_start = time.monotonic()
        with DatasetWriter(self.out_dir, self.dataset) as writer:
            self.finished_before = self._finished_before()
            kept = writer.carry_over(self.finished_before)
            if self.dedupe is not None and kept:  # the books written now are asked against those carried over too
                n = await anyio.to_thread.run_sync(index_carried, self.dedupe, self.out_dir / "sections.parquet", kept)
                log.info("--dedupe reask: %d sections of %d books carried over indexed", n, len(kept))
            self.forecast = await self._forecast(usable, kept)
            self.bus(LibraryStarted(self.books, len(kept), time.monotonic(), self.forecast))
            async with anyio.create_task_group() as bg:
                await bg.start(fleet.run)
                bg.start_soon(sampler.run)
                if self.handle_sigint:
                    bg.start_soon(self._watch_sigint, fleet)
                shared = SharedFleet(usable, caps, fleet, sampler, dedupe=self.dedupe)
                with self.books_scope:
                    await self._books(shared, writer, kept, books_in_flight)
                with anyio.CancelScope(shield=True):
                    await sampler.sample_once()
                bg.cancel_scope.cancel()
            t_end = time.monotonic()
            self.failed.sort(key=lambda f: self.lines.get(f[0], 0))  # in FILE's order, not the order they ended in
            self.totals.fleet(sampler, self.totals.t_first_request or t_start, t_end)
            paths = writer.close()  # published however the run ended: every finished book is in it
        stats = self.totals.stats(books=self.books, carried=len(kept), done=self.state.done,
                                  failed=self.failed, whole_job_s=t_end - t_start,
                                  run={"backends": [b.url for b, _ in usable], "model": self.model,
                                       "shard": list(self.shard) if self.shard else None,
                                       "books_in_flight": books_in_flight, "interrupted": self.interrupted})
        if self.forecast is not None:
            stats["forecast"] = {**self.forecast, "error": error_of(self.forecast, stats)}
        paths["stats"] = atomic_write(self.out_dir / "stats.json", orjson.dumps(stats, option=orjson.OPT_INDENT_2))
        if self.stopped_by is not None:  # exit 3 or 5, with the dataset and stats of what was finished written
            raise self.stopped_by
        defects = await anyio.to_thread.run_sync(library_defects, self.out_dir, self.failed)
        paths["defects"] = atomic_write(self.out_dir / "defects.json",
                                        orjson.dumps(defects, option=orjson.OPT_INDENT_2))
        return LibraryResult(self.out_dir, stats, defects, paths, self.books, tuple(self.failed), self.interrupted)

    async def _watch_sigint(self, fleet: Fleet) -> None:
        """Ctrl-C: start no more books, let requests in flight finish for interrupt_grace_s, then stop the books (their
        journals keep what was finished); a second Ctrl-C stops them at once."""
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                if self.interrupted:
                    self.books_scope.cancel()
                    return
                self.interrupted = True
                fleet.stop()
                self.books_scope.deadline = min(self.books_scope.deadline,
                                                anyio.current_time() + self.settings.interrupt_grace_s)

    def _stop(self, error: HandbookError) -> None:
        """Every backend gone, or an output that cannot be written: no more books; those in flight are stopped."""
        if self.stopped_by is None:
            self.stopped_by = error
        self.books_scope.cancel()

    def bus(self, event: Any) -> None:
        """The library's events (books started and finished, the fleet's) to its consumers; one that raises is
        detached with a warning, as a book's are (options.Bus)."""
        for c in list(self.consumers):
            try:
                c(event)
            except Exception as e:
                log.warning("a library event consumer failed and was detached: %s: %s", type(e).__name__, e)
                self.consumers.remove(c)

    async def _forecast(self, usable: list[tuple[Backend, str]], kept: set[str]) -> dict[str, Any] | None:
        """DIR/forecast.json of the library when asked (--forecast, --ladder): what is left to write, how long."""
        if not self.settings.wants_forecast:
            return None
        from .forecast_file import fits_for
        from .library_forecast import FORECAST_FILE, library_forecast

        try:
            fits = await fits_for(usable, self.settings, self.out_dir)
        except BackendError as e:  # a forecast is a help, not the job: say why there is none, and go on
            log.warning("no forecast: %s", e)
            return None
        books = iter_books(self.file, self.settings, self.shard)
        data = await anyio.to_thread.run_sync(lambda: library_forecast(books, fits, skip=frozenset(kept)))
        atomic_write(self.out_dir / FORECAST_FILE, orjson.dumps(data, option=orjson.OPT_INDENT_2))
        return data

    def _finished_before(self) -> dict[str, str]:
        """id -> key of the books this file still holds that an earlier run finished complete, with that key."""
        done: dict[str, str] = {}
        if self.fresh:
            return done
        for book in iter_books(self.file, self.settings, self.shard):
            index = read_index(self.out_dir / "books" / book.id)
            if index.get("key") == book.key and index.get("status") == "complete":
                done[book.id] = book.key
        return done

    async def _books(self, shared: SharedFleet, writer: DatasetWriter, kept: set[str], limit: int) -> None:
        slots = anyio.Semaphore(limit)
        for take in book_passes(self.dedupe, self.finished_before, kept):
            async with anyio.create_task_group() as books:
                for rank, book in enumerate(iter_books(self.file, self.settings, self.shard)):
                    folder = self.out_dir / "books" / book.id
                    if not take(book.id):
                        continue
                    if book.id in kept:  # finished before, its rows carried over: its counts only
                        self.totals.carried(read_index(folder))
                        continue
                    await slots.acquire()
                    if self.stopped_by is not None or self.interrupted:
                        slots.release()
                        return
                    books.start_soon(self._book, replace(shared, rank=rank), writer, book, slots)

    async def _book(self, shared: SharedFleet, writer: DatasetWriter, book: LibraryBook,
                    slots: anyio.Semaphore) -> None:
        folder = prepare_out_dir(self.out_dir / "books" / book.id)
        try:
            await self._write_book(shared, writer, book, folder)
        finally:
            slots.release()

    async def _write_book(self, shared: SharedFleet, writer: DatasetWriter, book: LibraryBook, folder: Path) -> None:
        index = read_index(folder)
        fresh = self.fresh or (bool(index) and index.get("key") != book.key)  # a changed line: that book afresh
        write_index(folder, book, "started")
        times: dict[str, tuple[float, float]] = {}
        attempts: dict[str, int] = {}
        offset = time.time() - time.monotonic()  # the replies' monotonic times -> Unix times for the dataset

        watchers = [w for c in self.consumers if (w := getattr(c, "book_event", None)) is not None]

        def consumer(event: Event) -> None:
            if isinstance(event, NodeFinished) and event.kind == NodeKind.SECTION:
                r = event.reply
                if r.t_end > r.t_start:  # a section answered from the journal carries no time of its own
                    times[event.path] = (r.t_start + offset, r.t_end + offset)
                    if self.totals.t_first_request is None or r.t_start < self.totals.t_first_request:
                        self.totals.t_first_request = r.t_start
                attempts[event.path] = r.attempt
            for watch in watchers:
                try:
                    watch(book.id, event)
                except Exception as e:  # a display's bug: that watcher goes, the book and its figures go on
                    log.warning("a library event consumer failed and was detached: %s: %s", type(e).__name__, e)
                    watchers.remove(watch)

        self.bus(BookStarted(book.id, book.prompt, shared.rank, time.monotonic()))
        try:
            result = await session(book.prompt, None, book.settings, folder, consumer, Mode(),
                                   Options(deltas=self.deltas, fresh=fresh, shared=self._session_fleet(shared, book)))
        except PlanError as e:  # its planning failed every attempt: reported by id, the others go on
            self._book_failed(book, folder, f"planning failed: {e}")
            return
        except (BackendError, OutputError) as e:  # every backend gone, or no room: the library stops
            self._book_failed(book, folder, str(e), status="incomplete")
            self._stop(e)
            return
        except HandbookError as e:  # this book's alone: its folder held by another run, a bug of ours in it (its
            self._book_failed(book, folder, str(e))  # traceback in books/<id>/handbook.log), a foreign journal
            return
        assert isinstance(result, Result) and result.book is not None
        timed = {**journal_times(result.book, await anyio.to_thread.run_sync(section_times, folder)), **times}
        row = book_row(book.id, book.key, book.prompt, result.book, folder=f"books/{book.id}",
                       files=sorted(p.name for p in result.paths.values() if p.parent == folder))
        rows = section_rows(book.id, book.prompt, result.book, model=self.model, attempts=attempts, times=timed,
                            models=self.models)
        await anyio.to_thread.run_sync(writer.add_book, row, rows)
        if shared.dedupe is not None:  # --dedupe reask: the books finished after this one are asked against it
            done = [s for s in result.book.sections if not s.error and s.text.strip()]
            shared.dedupe.add([f"{book.id}/{s.path}" for s in done], [s.title for s in done],
                              [first_sentence(s.text) for s in done], [s.shingles for s in done])
        counts = book_counts(result.stats, row.tokens)
        self.totals.add(result.stats, counts)
        if row.status != "complete":
            self.lines[book.id] = book.line
            self.failed.append((book.id, f"{len(result.failed_sections)} section(s) failed or came back empty"))
        write_index(folder, book, row.status, counts=counts)
        self.bus(BookFinished(book.id, row.status, row.sections, row.tokens, time.monotonic()))

    def _session_fleet(self, shared: SharedFleet, book: LibraryBook) -> SharedFleet:
        """A book finished complete before, written again from its journal (asking nothing), is not checked against
        the other books again: it was when written (docs/architecture.md, "A library")."""
        again = book.id in self.finished_before and (self.out_dir / "books" / book.id / FILENAME).is_file()
        return replace(shared, dedupe=None) if again else shared

    def _book_failed(self, book: LibraryBook, folder: Path, why: str, *, status: str = "failed") -> None:
        self.lines[book.id] = book.line
        self.failed.append((book.id, why))
        write_index(folder, book, status, why)
        self.bus(BookFinished(book.id, status, 0, 0, time.monotonic(), why))
