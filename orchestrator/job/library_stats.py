"""A library's stats.json and defects.json.

stats.json: the single book's keys where they apply: what the books hold summed over every book of the library
(those written by this run and those carried over from an earlier one: each book's book.json keeps its counts),
what this run asked for (requests, tokens written) summed over the books it wrote, plus ``books``, ``books_done``,
``carried_over``, ``failed_books`` and ``failed_book_ids``; and the fleet's figures over the library's writing,
read from the one sampler the library ran (``server_counted``, ``energy_j``, ``tokens_per_joule``, ``power``,
``readers``): a book's own stats.json has none of those, since the counters count every book at once.

defects.json: near-duplicate sections across the whole library (``textscan.near_duplicates``, MinHash LSH: linear
in the sections), reported for the library and per book, read back from sections.parquet row group by row group;
and the books that failed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..book.textscan import near_duplicates, shingles
from ..core.osutil import atomic_write
from ..metrics.readers import readers
from .library_input import LibraryBook
from .report import power_keys

BOOK_INDEX = "book.json"  # books/<id>/book.json

# a book's own counts, kept in its book.json (so that a book carried over, or assembled again from its journal with
# no request, counts what it holds, not what its last run asked for)
BOOK_COUNTS = ("sections", "section_tokens", "words", "failed_sections", "empty_sections", "truncated_sections",
               "loop_cut_sections")
# this run's requests, summed over the books it wrote
RUN_COUNTS = ("tokens_written", "requests", "planning_requests", "request_errors", "unusable_replies",
              "resumed_sections", "stopped_answers", "signed_off_answers", "planning_stopped")
PAIRS_LISTED = 200  # pairs named in defects.json (the count is of all of them)


def book_counts(stats: dict[str, Any], tokens: int) -> dict[str, int]:
    """What a finished book holds (its book.json keeps it): ``tokens`` its sections' tokens (the dataset's)."""
    return {"sections": int(stats.get("sections") or 0), "section_tokens": tokens,
            "words": int(stats.get("words") or 0), "failed_sections": int(stats.get("failed_sections") or 0),
            "empty_sections": int(stats.get("empty_sections") or 0),
            "truncated_sections": int(stats.get("truncated_sections") or 0),
            "loop_cut_sections": int(stats.get("loop_cut_sections") or 0)}


@dataclass
class Totals:
    """The sums over the books, and the fleet's figures once the library has run."""

    sums: Counter[str] = field(default_factory=Counter)  # over every book of the library (BOOK_COUNTS)
    run_sums: Counter[str] = field(default_factory=Counter)  # over the books this run wrote (RUN_COUNTS)
    written: int = 0  # books this run wrote
    t_first_request: float | None = None  # the first section request of the run (monotonic)
    fleet_figures: dict[str, Any] = field(default_factory=dict)

    def add(self, stats: dict[str, Any], counts: dict[str, int]) -> None:
        """A book this run wrote: its stats.json (this run's requests) and what it holds (:func:`book_counts`)."""
        self.written += 1
        self.sums.update(counts)
        for key in RUN_COUNTS:
            v = stats.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                self.run_sums[key] += v

    def carried(self, index: dict[str, Any]) -> None:
        """A book finished before this run: the counts its book.json keeps (none when an older one has none)."""
        counts = index.get("counts")
        if isinstance(counts, dict):
            self.sums.update({k: v for k, v in counts.items() if k in BOOK_COUNTS and isinstance(v, int)})

    def fleet(self, sampler: Any, t0: float, t1: float) -> None:
        """The server-counted figures of the whole library's writing, [t0, t1], from the library's sampler."""
        counted = sampler.counted(t0, t1)
        covered = counted.get("covered_backends") if counted.get("available", True) else None
        # the servers' figures only: the library keeps no reply of its books (a million books' replies would not fit)
        each: dict[str, Any] = (
            readers([], t0, t1, sustained_tok_s=counted.get("sustained_tok_s"),
                    series={u: sampler.series[u] for u in covered}, histograms=sampler.histograms_of())
            if covered else {"available": False, "reason": "no server counted the library's tokens"})
        self.fleet_figures = {"write_time_s": round(t1 - t0, 3), "server_counted": counted,
                              **power_keys(sampler.power_over(t0, t1)), "readers": each}

    def stats(self, *, books: int, carried: int, done: int, failed: list[tuple[str, str]], whole_job_s: float,
              run: dict[str, Any]) -> dict[str, Any]:
        """``run``: what the run was (``backends``, ``model``, ``shard``, ``books_in_flight``), kept as given."""
        failed_ids = [i for i, _ in failed]
        return {
            "books": books,
            "books_done": carried + done,  # complete: before this run, or by it
            "books_written": self.written,
            "carried_over": carried,
            "failed_books": len(failed),
            "failed_book_ids": failed_ids,
            "failures": [{"id": i, "why": why} for i, why in failed],
            **{k: self.sums.get(k, 0) for k in BOOK_COUNTS},  # what every book holds, carried-over ones included
            **{k: self.run_sums.get(k, 0) for k in RUN_COUNTS},  # what this run asked for
            "requests_this_run": self.run_sums.get("requests", 0),
            "tokens_written_this_run": self.run_sums.get("tokens_written", 0),
            "whole_job_s": round(whole_job_s, 3),
            **self.fleet_figures,
            "cards": len(run.get("backends") or ()),
            **run,
        }


def library_defects(out_dir: Path, failed: list[tuple[str, str]]) -> dict[str, Any]:
    """defects.json of the library (see the module docstring)."""
    from .library_dataset import section_texts  # pyarrow, only once a library has run

    keys: list[tuple[str, str, str]] = []  # (book id, path, section title) of each text, in file order
    sets = []
    path = out_dir / "sections.parquet"
    if path.is_file():
        for book_id, p, title, text in section_texts(path):
            keys.append((book_id, p, title))
            sets.append(shingles(text))
    pairs = near_duplicates([""] * len(sets), sets)
    across = [(i, j, jac, con) for i, j, jac, con in pairs if keys[i][0] != keys[j][0]]
    per_book: Counter[str] = Counter()
    for i, j, _, _ in pairs:
        per_book[keys[i][0]] += 1
        if keys[j][0] != keys[i][0]:
            per_book[keys[j][0]] += 1
    return {
        "books_failed": [{"id": i, "why": why} for i, why in failed],
        "near_duplicate_sections": {
            "count": len(pairs),
            "across_books": len(across),
            "within_books": len(pairs) - len(across),
            "sections_checked": len(sets),
            "per_book": dict(per_book.most_common()),
            "pairs": [{"a": {"book": keys[i][0], "path": keys[i][1], "title": keys[i][2]},
                       "b": {"book": keys[j][0], "path": keys[j][1], "title": keys[j][2]},
                       "jaccard": round(jac, 3), "containment": round(con, 3)}
                      for i, j, jac, con in pairs[:PAIRS_LISTED]],
        },
    }


def error_of(forecast: dict[str, Any], stats: dict[str, Any]) -> dict[str, float | None]:
    """The forecast's relative errors against what the run did: whole job (its time) and tokens (written by it)."""
    def rel(actual: Any, expected: Any) -> float | None:
        return round((actual - expected) / expected, 4) if expected else None

    return {"whole_job_s": rel(stats["whole_job_s"], forecast["whole_job_s"]),
            "tokens": rel(stats["tokens_written_this_run"], forecast["tokens"])}


def read_index(folder: Path) -> dict[str, Any]:
    try:
        data = orjson.loads((folder / BOOK_INDEX).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def write_index(folder: Path, book: LibraryBook, status: str, error: str | None = None, *,
                 counts: dict[str, int] | None = None) -> None:
    """books/<id>/book.json: the line the book came from, its key, how it ended ("started" while it runs) and what
    it holds (``counts``, library_stats.book_counts)."""
    data = {"id": book.id, "line": book.line, "prompt": book.prompt, "key": book.key, "settings": book.overrides,
            "status": status, "error": error, "counts": counts}
    atomic_write(folder / BOOK_INDEX, orjson.dumps(data, option=orjson.OPT_INDENT_2))
