"""``--dedupe reask`` across a resumed library: the books an earlier run finished are in the index of finished books
before any other book is written, so that the books written now (appended lines, changed ones, the unfinished) are
asked against them as against the books finished in this run (job/library.py indexes those as they finish, from
their sections as written). Those carried over are read from the previous sections.parquet (:func:`index_carried`);
those written again from their journals (rows not carried over: a dataset from before a column, a damaged one) are
written first, in a pass of their own (:func:`book_passes`)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from itertools import islice
from pathlib import Path

from ..book.crossdup import CrossIndex
from ..book.textscan import shingles
from .library_dataset import section_texts
from .repairs import first_sentence

__all__ = ["book_passes", "index_carried"]

BATCH = 1000  # sections signed at once: one vectorised batch, a few MB of text


def index_carried(index: CrossIndex, sections: Path, ids: set[str]) -> int:
    """Add to ``index`` every written section of the books ``ids`` in the dataset file ``sections`` (keys, titles,
    first sentences and shingles as job/library.py adds a finished book's), :data:`BATCH` at a time; returns how
    many."""
    rows = ((f"{book_id}/{path}", title, text) for book_id, path, title, text in section_texts(sections)
            if book_id in ids and text.strip())
    added = 0
    while batch := list(islice(rows, BATCH)):
        keys, titles, texts = zip(*batch, strict=True)
        index.add(keys, titles, [first_sentence(t) for t in texts], [shingles(t) for t in texts])
        added += len(batch)
    return added


def book_passes(dedupe: CrossIndex | None, finished_before: Collection[str], kept: Collection[str]
                ) -> list[Callable[[str], bool]]:
    """Which book ids each pass over the library's file writes, in order: with ``dedupe`` and books an earlier run
    finished complete whose rows were not ``kept`` (carried over), those first (from their journals, asking nothing:
    each is in the index once its pass ends), then the others; else one pass of every book."""
    again = set(finished_before) - set(kept) if dedupe is not None else set()
    if not again:
        return [lambda book_id: True]
    return [again.__contains__, lambda book_id: book_id not in again]
