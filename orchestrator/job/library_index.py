"""``--dedupe reask`` across a resumed library: the books an earlier run finished are in the index of finished books
before any other book is written, so that the books written now (appended lines, changed ones, the unfinished) are
asked against them as against the books finished in this run (job/library.py indexes those as they finish, from
their sections as written). Those carried over are read from the previous sections.parquet (:func:`index_carried`);
those written again from their journals (rows not carried over: a dataset from before a column, a damaged one) are
written first, in a pass of their own (:func:`book_passes`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pyarrow.parquet as pq

from ..book.crossdup import CrossIndex
from ..book.textscan import shingles
from .repairs import first_sentence

__all__ = ["book_passes", "index_carried"]

_COLUMNS = ["book_id", "path", "section", "text"]


def index_carried(index: CrossIndex, sections: Path, ids: set[str]) -> int:
    """Add to ``index`` every written section of the books ``ids`` in the dataset file ``sections`` (keys, titles,
    first sentences and shingles as job/library.py adds a finished book's), a row group at a time; returns how many."""
    added = 0
    for keys, titles, texts in _written(sections, ids):
        index.add(keys, titles, [first_sentence(t) for t in texts], [shingles(t) for t in texts])
        added += len(keys)
    return added


def _written(path: Path, ids: set[str]) -> Iterator[tuple[list[str], list[str], list[str]]]:
    """Per row group: the keys ("<book id>/<path>"), titles and texts of the written sections of the books ``ids``."""
    f = pq.ParquetFile(path)
    for i in range(f.num_row_groups):
        t = f.read_row_group(i, columns=_COLUMNS)
        keys, titles, texts = [], [], []
        for book_id, p, title, text in zip(*(t[c].to_pylist() for c in _COLUMNS), strict=True):
            if book_id in ids and text and text.strip():
                keys.append(f"{book_id}/{p}")
                titles.append(title)
                texts.append(text)
        if keys:
            yield keys, titles, texts


def book_passes(dedupe: CrossIndex | None, finished_before: Collection[str], kept: Collection[str]
                ) -> list[Callable[[str], bool]]:
    """Which book ids each pass over the library's file writes, in order: with ``dedupe`` and books an earlier run
    finished complete whose rows were not ``kept`` (carried over), those first (from their journals, asking nothing:
    each is in the index once its pass ends), then the others; else one pass of every book."""
    again = set(finished_before) - set(kept) if dedupe is not None else set()
    if not again:
        return [lambda book_id: True]
    return [again.__contains__, lambda book_id: book_id not in again]
