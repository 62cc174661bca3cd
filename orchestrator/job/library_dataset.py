"""A library's dataset: ``sections.parquet`` (a row per section) and ``books.parquet`` (a row per book), written
with pyarrow as books finish, in row groups, never the whole dataset in memory; ``jsonl`` mirrors both.

Rows go to ``NAME.part``, renamed over ``NAME`` on :meth:`DatasetWriter.close`: a crash leaves the previous complete
dataset. A closed parquet file cannot be appended to, so a resumed run writes the files again: ``carry_over`` copies
the previous dataset's rows of the books the journal says are finished (same id and key), row group by row group;
the runner adds (``add_book``) the finished books that file lacks (finished after its last close) from the
journal, then each book as it finishes. :func:`rebuild` makes a dataset from rows alone;
``library_merge.merge`` joins a library's shards.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..book.assemble import Book, count_words
from ..core.errors import ConfigError

__all__ = ["BOOK_SCHEMA", "SECTION_SCHEMA", "BookRow", "DatasetWriter", "SectionRow", "book_row", "journal_times",
           "rebuild", "section_rows", "section_texts"]

ROWS_PER_GROUP = 1000  # sections a row group holds: ~1,000 x 2 KB of text, a few MB of buffer
FORMATS = ("parquet", "jsonl")
TABLES = ("sections", "books")


@dataclass(frozen=True)
class SectionRow:
    """One section of one book. ``text``: the answer as generated (its ``words`` and ``tokens`` count it); ``printed``:
    the section as book.md prints it under its heading (``assemble.section_body``: without the model's talk to whoever
    asked, cut back where the token cap or word salad stopped it, a note under code that does not parse; None where
    ``library merge`` read a shard written before the column was); a failed section has ``text`` and ``printed`` '' and
    ``error`` set. ``t_start`` and ``t_end``: Unix time in seconds of its answering attempt (None: not known)."""

    book_id: str
    prompt: str
    book_title: str
    part: str
    chapter: str
    section: str
    path: str  # "3.7.12": part, chapter, section, 1-based
    text: str
    words: int
    tokens: int
    finish_reason: str | None = None
    backend: str | None = None
    model: str | None = None
    attempts: int = 1
    t_start: float | None = None
    t_end: float | None = None
    error: str | None = None
    printed: str | None = None  # last, so that a reader of the columns by position reads the older ones as before


@dataclass(frozen=True)
class BookRow:
    """One book. ``shape``: (parts, chapters, sections) counted over its outline; ``status``: "complete", "failed"
    (a section failed or came back empty) or "incomplete" (:func:`book_row`); ``folder``: books/<id>, relative to
    the library's folder (so it stays true after a merge); ``files``: the names in it; ``key``: the line's book key
    (library_input.book_key)."""

    id: str
    key: str
    prompt: str
    title: str
    shape: tuple[int, ...]
    sections: int
    words: int
    tokens: int
    status: str
    folder: str
    files: tuple[str, ...] = ()


SECTION_SCHEMA = pa.schema([
    ("book_id", pa.string()), ("prompt", pa.string()), ("book_title", pa.string()), ("part", pa.string()),
    ("chapter", pa.string()), ("section", pa.string()), ("path", pa.string()), ("text", pa.string()),
    ("words", pa.int64()), ("tokens", pa.int64()), ("finish_reason", pa.string()), ("backend", pa.string()),
    ("model", pa.string()), ("attempts", pa.int64()), ("t_start", pa.float64()), ("t_end", pa.float64()),
    ("error", pa.string()), ("printed", pa.string()),
])
BOOK_SCHEMA = pa.schema([
    ("id", pa.string()), ("key", pa.string()), ("prompt", pa.string()), ("title", pa.string()),
    ("shape", pa.list_(pa.int64())), ("sections", pa.int64()), ("words", pa.int64()), ("tokens", pa.int64()),
    ("status", pa.string()), ("folder", pa.string()), ("files", pa.list_(pa.string())),
])
_SCHEMAS = {"sections": SECTION_SCHEMA, "books": BOOK_SCHEMA}
# Columns added since the first dataset, by table: a file without them is read with nulls there (library merge), and
# a resumed library does not carry over a file without them or with nulls there (a merge of such shards): its books
# are added again from their journals, which hold what the new columns need.
_ADDED = {"sections": frozenset({"printed"}), "books": frozenset()}
_ID_COLUMN = {"sections": "book_id", "books": "id"}
_TEXT_COLUMNS = ["book_id", "path", "section", "text"]


def section_rows(book_id: str, prompt: str, book: Book, *, model: str | None = None,
                 attempts: Mapping[str, int] | None = None,
                 times: Mapping[str, tuple[float, float]] | None = None,
                 models: Mapping[str, str] | None = None) -> tuple[SectionRow, ...]:
    """The rows of a finished book, in outline order; ``attempts`` and ``times`` by section path (the journal's);
    each row's model is its backend's (``models``: url -> the model it served), else ``model``."""
    rows = []
    for s in book.sections:
        t0, t1 = (times or {}).get(s.path, (None, None))
        served = (models or {}).get(s.backend or "", model)
        written = s.error is None and s.text.strip() != ""
        rows.append(SectionRow(book_id, prompt, book.outline.title, s.part, s.chapter, s.title, s.path, s.text,
                               count_words(s.text), s.completion_tokens, s.finish_reason, s.backend, served,
                               (attempts or {}).get(s.path, 1), t0, t1, None if s.error is None else str(s.error),
                               s.body if written else ""))
    return tuple(rows)


def journal_times(book: Book, stored: Mapping[str, tuple[str, float, float]]) -> dict[str, tuple[float, float]]:
    """The start and end of a book's written sections as its journal holds them (``journal.section_times``: path ->
    title, start, end), for :func:`section_rows`'s ``times`` where the journal answered a section (a Reply read from
    it is timed as it is read); a path the journal holds for another title is another section's."""
    return {s.path: (t[1], t[2]) for s in book.sections
            if s.error is None and (t := stored.get(s.path)) is not None and t[0] == s.title}


def book_row(book_id: str, key: str, prompt: str, book: Book, *, folder: str, files: Sequence[str] = ()) -> BookRow:
    """A finished book's row; its status "failed" when a section failed or came back empty, "incomplete" when one
    was never written (interrupted: a finished book has none), else "complete"."""
    status = ("failed" if any(s.failed or s.empty for s in book.sections)
              else "incomplete" if any(s.error is not None for s in book.sections) else "complete")
    return BookRow(book_id, key, prompt, book.outline.title, book.outline.shape, len(book.sections), book.words,
                   sum(s.completion_tokens for s in book.sections), status, folder, tuple(files))


def _table(rows: Sequence[Any], schema: pa.Schema) -> pa.Table:
    return pa.table({name: [getattr(r, name) for r in rows] for name in schema.names}, schema=schema)


class _Sink:
    """One table of the dataset: rows buffered, written a row group of ``rows_per_group`` at a time to NAME.part
    (and its jsonl mirror), renamed over NAME by :meth:`close`."""

    def __init__(self, out_dir: Path, name: str, jsonl: bool, rows_per_group: int):
        self.schema = _SCHEMAS[name]
        self.final = [out_dir / f"{name}.parquet"] + ([out_dir / f"{name}.jsonl"] if jsonl else [])
        self.parts = [p.with_name(p.name + ".part") for p in self.final]
        self.rows_per_group = rows_per_group
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.writer = pq.ParquetWriter(self.parts[0], self.schema, compression="zstd")
        self.jsonl = open(self.parts[1], "wb") if jsonl else None  # closed in close/abort

    def add(self, table: pa.Table) -> None:
        if table.num_rows:
            self.buffer.append(table)
            self.buffered += table.num_rows
        while self.buffered >= self.rows_per_group:
            self._flush(self.rows_per_group)

    def _flush(self, rows: int) -> None:
        """Write the first ``rows`` buffered rows as one row group; keep the rest."""
        table = pa.concat_tables(self.buffer)
        head, rest = table.slice(0, rows), table.slice(rows)
        self.writer.write_table(head, row_group_size=max(rows, 1))
        if self.jsonl is not None:
            for batch in head.to_batches(max_chunksize=256):
                self.jsonl.write(b"".join(orjson.dumps(r) + b"\n" for r in batch.to_pylist()))
        self.buffer, self.buffered = ([rest] if rest.num_rows else []), rest.num_rows

    def finish(self) -> None:
        """Write what is buffered and close the .part files, on disk (fsync)."""
        if self.buffered:
            self._flush(self.buffered)
        self.writer.close()
        if self.jsonl is not None:
            self.jsonl.close()
        for part in self.parts:
            with open(part, "rb+") as fh:
                os.fsync(fh.fileno())

    def publish(self) -> None:
        for part, final in zip(self.parts, self.final):
            os.replace(part, final)
        if self.jsonl is None:  # a mirror an earlier run asked for, and this one not: it would go stale
            self.final[0].with_suffix(".jsonl").unlink(missing_ok=True)

    def abort(self) -> None:
        with contextlib.suppress(OSError, pa.ArrowException):  # a full disk may fail the close too
            self.writer.close()
            if self.jsonl is not None:
                self.jsonl.close()
        for part in self.parts:
            part.unlink(missing_ok=True)


class DatasetWriter:
    """The dataset of one library folder, written as books finish. ``formats``: "parquet" (always written: it is
    what a resume carries over from) and optionally "jsonl". Use as a context manager, or call :meth:`close`
    (publish) or :meth:`abort` (leave the previous dataset as it was); leaving ``with`` on an exception aborts."""

    def __init__(self, out_dir: str | Path, formats: Sequence[str] = ("parquet",), *,
                 rows_per_group: int = ROWS_PER_GROUP):
        bad = [f for f in formats if f not in FORMATS]
        if bad or not formats:
            raise ConfigError(f"--dataset: expected any of {','.join(FORMATS)}; got {','.join(formats) or 'nothing'}")
        if rows_per_group < 1:
            raise ValueError(f"rows_per_group must be at least 1, got {rows_per_group}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        jsonl = "jsonl" in formats
        self.sinks = {"sections": _Sink(self.out_dir, "sections", jsonl, rows_per_group),
                      "books": _Sink(self.out_dir, "books", jsonl, rows_per_group)}
        self.ids: set[str] = set()
        self.closed = False
        # one caller at a time: a library adds its books from worker threads (pyarrow's writer is not thread-safe)
        self._lock = threading.Lock()

    def add_book(self, book: BookRow, sections: Sequence[SectionRow]) -> None:
        """Append one finished book: its row and its sections' rows (thread-safe)."""
        with self._lock:
            self._add_book(book, sections)

    def _add_book(self, book: BookRow, sections: Sequence[SectionRow]) -> None:
        if book.id in self.ids:
            raise ValueError(f"book {book.id!r} is in the dataset already")
        if any(s.book_id != book.id for s in sections):
            raise ValueError(f"a section row of book {book.id!r} names another book")
        self.ids.add(book.id)
        self.sinks["sections"].add(_table(sections, SECTION_SCHEMA))
        self.sinks["books"].add(_table([book], BOOK_SCHEMA))

    def carry_over(self, keep: Mapping[str, str]) -> set[str]:
        """Copy from the folder's previous complete dataset the books of ``keep`` (id -> key) whose key still is
        that one; returns their ids. Nothing (an empty set) when there is no previous dataset or it cannot be read:
        the runner then adds those books from the journal."""
        try:  # only a complete book's rows: a book that failed then (or was cut off) is rebuilt from its journal
            if any(_lacks_added(self.out_dir / f"{name}.parquet", name) for name in TABLES):
                return set()  # rows from before a column was added: the books are added again, whole, from journals
            found = {i for i, k, status in _ids_and_keys(self.out_dir / "books.parquet")
                     if keep.get(i) == k and status == "complete"} - self.ids
        except (OSError, pa.ArrowException, KeyError):
            return set()
        if found:  # a file whose ids and columns could be read but not its rows is damaged beyond a rebuild: raised
            self.copy_from(self.out_dir, found)
        self.ids |= found
        return found

    def copy_from(self, source: Path, only: set[str] | None = None) -> None:
        """Every row group of ``source``'s two tables (of the books in ``only``, when given), in file order."""
        ids = pa.array(sorted(only), pa.string()) if only is not None else None
        for name in TABLES:
            for table in _row_groups(source / f"{name}.parquet", name):
                if ids is not None:
                    table = table.filter(pc.is_in(table[_ID_COLUMN[name]], value_set=ids))
                self.sinks[name].add(table)

    def close(self) -> dict[str, Path]:
        """Write what is buffered, then publish the files by rename (sections before books: a crash between the two
        renames leaves sections.parquet a superset of books.parquet). Returns them by name."""
        with self._lock:
            return self._close()

    def _close(self) -> dict[str, Path]:
        if not self.closed:
            for sink in self.sinks.values():
                sink.finish()
            for name in TABLES:
                self.sinks[name].publish()
            self.closed = True
        return {p.name: p for s in self.sinks.values() for p in s.final}

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            for sink in self.sinks.values():
                sink.abort()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
            return
        try:
            self.close()
        except BaseException:
            self.abort()
            raise


def _lacks_added(path: Path, name: str) -> bool:
    """Whether the dataset file lacks a column added to its table since the first dataset (:data:`_ADDED`), or holds a
    null in one (rows ``library merge`` read from a shard written before it): from the row groups' statistics, a
    column read only where a row group has none."""
    f = pq.ParquetFile(path)
    leaves = {f.metadata.schema.column(k).path: k for k in range(f.metadata.num_columns)}
    for column in _ADDED[name]:
        if column not in leaves:
            return True
        for i in range(f.num_row_groups):
            stats = f.metadata.row_group(i).column(leaves[column]).statistics
            nulls = (stats.null_count if stats is not None and stats.has_null_count
                     else f.read_row_group(i, columns=[column]).column(0).null_count)
            if nulls:
                return True
    return False


def _row_groups(path: Path, name: str) -> Iterator[pa.Table]:
    """The row groups of a dataset file of table ``name`` one at a time, in our schema (columns in order, types cast);
    a column added since the first dataset (:data:`_ADDED`) that the file lacks is read as nulls; any other column
    missing is an ArrowInvalid, and a column that does not cast to our type another ArrowException (a file of another
    schema)."""
    schema = _SCHEMAS[name]
    f = pq.ParquetFile(path)
    have = set(f.schema_arrow.names)
    absent = [n for n in schema.names if n not in have]
    if unknown := [n for n in absent if n not in _ADDED[name]]:
        raise pa.ArrowInvalid(f"{path.name} has no column {unknown[0]!r}")
    for i in range(f.num_row_groups):
        table = f.read_row_group(i, columns=[n for n in schema.names if n in have])
        for n in absent:
            table = table.append_column(schema.field(n), pa.nulls(table.num_rows, schema.field(n).type))
        yield table.select(schema.names).cast(schema)


def section_texts(path: Path) -> Iterator[tuple[str, str, str, str]]:
    """(book id, path, section title, text) of every section with text in a sections.parquet, in file order, a row
    group at a time (the library's near-duplicate report, and ``--dedupe reask``'s index of carried-over books)."""
    f = pq.ParquetFile(path)
    for i in range(f.num_row_groups):
        t = f.read_row_group(i, columns=_TEXT_COLUMNS)
        for row in zip(*(t[c].to_pylist() for c in _TEXT_COLUMNS), strict=True):
            if row[3]:
                yield row


def _ids_and_keys(path: Path) -> Iterator[tuple[str, str, str]]:
    f = pq.ParquetFile(path)
    for i in range(f.num_row_groups):
        t = f.read_row_group(i, columns=["id", "key", "status"])
        yield from zip(t["id"].to_pylist(), t["key"].to_pylist(), t["status"].to_pylist(), strict=True)


def rebuild(out_dir: str | Path, books: Iterable[tuple[BookRow, Sequence[SectionRow]]],
            formats: Sequence[str] = ("parquet",), *, rows_per_group: int = ROWS_PER_GROUP) -> dict[str, Path]:
    """The dataset of ``out_dir`` made again from its books' rows (streamed: one book at a time is enough)."""
    with DatasetWriter(out_dir, formats, rows_per_group=rows_per_group) as w:
        for book, sections in books:
            w.add_book(book, sections)
    return w.close()
