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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson

from ..core.config import Backend, Settings, slugify
from ..core.errors import BackendError, ConfigError, PlanError
from ..core.events import Event, NodeFinished
from ..core.osutil import atomic_write, ensure_open_files, prepare_out_dir
from ..core.states import NodeKind
from ..dispatch.fleet import Fleet
from ..views.library_progress import BookFinished, BookStarted, LibraryStarted, LibraryState
from .connect import backends_up, discover_all, open_clients
from .finish import Result
from .library_dataset import DatasetWriter, book_row, section_rows
from .library_input import LibraryBook, check_file, iter_books
from .library_stats import Totals, library_defects
from .options import Mode, Options, SharedFleet
from .run import session

log = logging.getLogger("handbook")

__all__ = ["LibraryResult", "agenerate_library", "default_books_in_flight", "generate_library"]

BOOK_INDEX = "book.json"
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

    @property
    def complete(self) -> bool:
        return not self.failed_books


def default_books_in_flight(caps: Sequence[int], settings: Settings) -> int:
    """Books open at once when not given: enough that their sections fill every backend's cap four times over (a
    book's sections start as its chapters are planned, and its tail runs beside the next books'), at least 2.
    Measured (benchmarks/library_throughput.py, 40 books of 2 x 4 x 8 on 4 cards at cap 64): 8 books in flight (2x)
    gave 0.87 of the bench level's rate, 16 (4x) 0.94, 32 0.94. ``settings``:
    a book's (the library's first: the runner takes its shape for the library's)."""
    per_book = settings.parts * settings.chapters * settings.sections
    return max(2, math.ceil(4 * sum(caps) / max(1, per_book)))


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
    deltas: bool = False,
    fresh: bool = False,
) -> LibraryResult:
    """Make every book of ``file`` (JSONL, a book a line, or plain text, a prompt a line) into ``out``.

    ``settings``: the run's (a line's own settings apply to its book; default: md only and unstreamed sections,
    :data:`LIBRARY_SETTINGS`); ``shard`` (i, n): only the books whose id hashes to shard i of n; ``dataset``:
    "parquet" and optionally "jsonl"; ``on_event``: called with :class:`~orchestrator.views.library_progress.
    BookStarted`/``BookFinished`` and the fleet's events; ``deltas``: the books' text as it streams (to the
    ``on_event`` of each book through :class:`LibraryState`). Raises ConfigError (a bad line: ``FILE:LINE: ...``)
    before any request, BackendError when no backend answers."""
    settings = settings or Settings(**LIBRARY_SETTINGS)  # type: ignore[arg-type]
    if books_in_flight is not None and (not isinstance(books_in_flight, int) or books_in_flight < 1):
        raise ConfigError(f"books_in_flight must be a whole number of books, 1 or more; got {books_in_flight!r}")
    summary = check_file(Path(file), settings, shard)
    out_dir = prepare_out_dir(out if out is not None else Path("handbook-out") / f"library-{slugify(Path(file).stem)}")
    prepare_out_dir(out_dir / "books")
    run = _Library(Path(file), settings, out_dir, shard, dataset, deltas, fresh)
    run.books = summary.in_shard
    run.consumers.extend([on_event] if on_event is not None else [])
    async with backends_up(backends, settings) as bk:
        usable = await discover_all(bk, settings)
        caps = ensure_open_files([b.cap for b, _ in usable])
        async with open_clients(usable, settings) as clients:
            first = next(iter_books(Path(file), settings, shard), None)  # the library's shape: its first book's
            limit = books_in_flight or default_books_in_flight(caps, first.settings if first else settings)
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
        self.all_down: BackendError | None = None
        self.forecast: dict[str, Any] | None = None
        self.model = ""

    async def run(self, usable: list[tuple[Backend, str]], caps: list[int], clients: list[Any],
                  books_in_flight: int) -> LibraryResult:
        from ..metrics import MetricsSampler

        settings = self.settings
        self.model = ",".join(sorted({m for _, m in usable}))
        fleet = Fleet(clients, caps, self.bus, all_down_timeout=settings.all_down_timeout_s)
        sampler = MetricsSampler([b.url for b, _ in usable], interval=settings.metrics_interval_s, on_sample=self.bus)
        if any(b.power for b, _ in usable):
            sampler.set_power({b.url: b.power for b, _ in usable})
        t_start = time.monotonic()
        with DatasetWriter(self.out_dir, self.dataset) as writer:
            kept = writer.carry_over(self._finished_before())
            self.forecast = await self._forecast(usable, kept)
            self.bus(LibraryStarted(self.books, len(kept), time.monotonic(), self.forecast))
            async with anyio.create_task_group() as bg:
                await bg.start(fleet.run)
                bg.start_soon(sampler.run)
                shared = SharedFleet(usable, caps, fleet, sampler)
                await self._books(shared, writer, kept, books_in_flight)
                await sampler.sample_once()
                bg.cancel_scope.cancel()
            if self.all_down is not None:
                raise self.all_down
            t_end = time.monotonic()
            self.totals.fleet(sampler, self.totals.t_first_request or t_start, t_end)
            paths = writer.close()
        stats = self.totals.stats(books=self.books, carried=len(kept), done=self.state.done,
                                  failed=self.failed, whole_job_s=t_end - t_start,
                                  run={"backends": [b.url for b, _ in usable], "model": self.model,
                                       "shard": list(self.shard) if self.shard else None,
                                       "books_in_flight": books_in_flight})
        if self.forecast is not None:
            stats["forecast"] = {**self.forecast, "error": _error_of(self.forecast, stats)}
        defects = await anyio.to_thread.run_sync(library_defects, self.out_dir, self.failed)
        paths["stats"] = atomic_write(self.out_dir / "stats.json", orjson.dumps(stats, option=orjson.OPT_INDENT_2))
        paths["defects"] = atomic_write(self.out_dir / "defects.json",
                                        orjson.dumps(defects, option=orjson.OPT_INDENT_2))
        return LibraryResult(self.out_dir, stats, defects, paths, self.books, tuple(self.failed))

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
            index = _read_index(self.out_dir / "books" / book.id)
            if index.get("key") == book.key and index.get("status") == "complete":
                done[book.id] = book.key
        return done

    async def _books(self, shared: SharedFleet, writer: DatasetWriter, kept: set[str], limit: int) -> None:
        slots = anyio.Semaphore(limit)
        async with anyio.create_task_group() as books:
            for rank, book in enumerate(iter_books(self.file, self.settings, self.shard)):
                folder = self.out_dir / "books" / book.id
                if book.id in kept:  # finished before, its rows carried over: its figures only
                    self.totals.carried(folder)
                    continue
                await slots.acquire()
                if self.all_down is not None:
                    slots.release()
                    break
                books.start_soon(self._book, replace(shared, rank=rank), writer, book, slots)

    async def _book(self, shared: SharedFleet, writer: DatasetWriter, book: LibraryBook,
                    slots: anyio.Semaphore) -> None:
        folder = prepare_out_dir(self.out_dir / "books" / book.id)
        try:
            await self._write_book(shared, writer, book, folder)
        finally:
            slots.release()

    async def _write_book(self, shared: SharedFleet, writer: DatasetWriter, book: LibraryBook, folder: Path) -> None:
        index = _read_index(folder)
        fresh = self.fresh or (bool(index) and index.get("key") != book.key)  # a changed line: that book afresh
        _write_index(folder, book, "started")
        times: dict[str, tuple[float, float]] = {}
        attempts: dict[str, int] = {}
        offset = time.time() - time.monotonic()  # the replies' monotonic times -> Unix times for the dataset

        watchers = [w for c in self.consumers if (w := getattr(c, "book_event", None)) is not None]

        def consumer(event: Event) -> None:
            for watch in watchers:
                watch(book.id, event)
            if isinstance(event, NodeFinished) and event.kind == NodeKind.SECTION:
                r = event.reply
                times[event.path] = (r.t_start + offset, r.t_end + offset)
                attempts[event.path] = r.attempt
                if self.totals.t_first_request is None or r.t_start < self.totals.t_first_request:
                    self.totals.t_first_request = r.t_start

        self.bus(BookStarted(book.id, book.prompt, shared.rank, time.monotonic()))
        try:
            result = await session(book.prompt, None, book.settings, folder, consumer, Mode(),
                                   Options(deltas=self.deltas, fresh=fresh, shared=shared))
        except PlanError as e:  # its planning failed every attempt: reported by id, the others go on
            self._book_failed(book, folder, f"planning failed: {e}")
            return
        except BackendError as e:  # every backend gone: the library stops, every finished book kept
            self.all_down = self.all_down or e
            self._book_failed(book, folder, str(e), status="incomplete")
            return
        except ConfigError as e:  # this book's folder cannot be used (held by another run, a foreign journal)
            self._book_failed(book, folder, str(e))
            return
        assert isinstance(result, Result) and result.book is not None
        row = book_row(book.id, book.key, book.prompt, result.book, folder=f"books/{book.id}",
                       files=sorted(p.name for p in result.paths.values() if p.parent == folder))
        rows = section_rows(book.id, book.prompt, result.book, model=self.model, attempts=attempts, times=times)
        await anyio.to_thread.run_sync(writer.add_book, row, rows)
        self.totals.add(result.stats)
        if row.status != "complete":
            self.failed.append((book.id, f"{len(result.failed_sections)} section(s) failed or came back empty"))
        _write_index(folder, book, row.status)
        self.bus(BookFinished(book.id, row.status, row.sections, row.tokens, time.monotonic()))

    def _book_failed(self, book: LibraryBook, folder: Path, why: str, *, status: str = "failed") -> None:
        self.failed.append((book.id, why))
        _write_index(folder, book, status, why)
        self.bus(BookFinished(book.id, status, 0, 0, time.monotonic(), why))


def _error_of(forecast: dict[str, Any], stats: dict[str, Any]) -> dict[str, float | None]:
    """The forecast's relative errors against what the run did: whole job (its time) and tokens (written by it)."""
    def rel(actual: Any, expected: Any) -> float | None:
        return round((actual - expected) / expected, 4) if expected else None

    return {"whole_job_s": rel(stats["whole_job_s"], forecast["whole_job_s"]),
            "tokens": rel(stats["tokens_written_this_run"], forecast["tokens"])}


def _read_index(folder: Path) -> dict[str, Any]:
    try:
        data = orjson.loads((folder / BOOK_INDEX).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_index(folder: Path, book: LibraryBook, status: str, error: str | None = None) -> None:
    """books/<id>/book.json: the line the book came from, its key and how it ended ("started" while it runs)."""
    data = {"id": book.id, "line": book.line, "prompt": book.prompt, "key": book.key, "settings": book.overrides,
            "status": status, "error": error}
    atomic_write(folder / BOOK_INDEX, orjson.dumps(data, option=orjson.OPT_INDENT_2))
