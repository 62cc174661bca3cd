"""``--dedupe reask`` across a resumed library: the books carried over from the previous dataset go into the index
of finished books before any book is written, so that the books written now (appended lines, changed ones, the
unfinished) are asked against them as against the books finished in this run (job/library.py indexes those as they
finish, from their sections as written)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from ..book.crossdup import CrossIndex
from ..book.textscan import shingles
from .repairs import first_sentence

__all__ = ["index_carried"]

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
