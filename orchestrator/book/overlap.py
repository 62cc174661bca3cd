"""Chapters -> each section's share of word 5-grams held by a sibling, and the book's summary of those shares.

Pure: no I/O, no clock. A section's siblings are the other sections of its chapter; its share is the fraction of
its distinct word 5-grams that occur in at least one sibling (0.0: nothing in common; 1.0: every 5-gram it has is
written elsewhere in the chapter). It measures how much of the chapter repeats itself, which fan-out writing (each
section by its own request, none seeing the others) is prone to.

- Words: ``\\w+`` tokens of the lower-cased text outside fenced code (:func:`.fences.fenced_blocks`, the fence
  lines included) and outside ATX headings (``#`` to ``######`` at the margin; a setext heading's words count).
  A 5-gram never spans a dropped line: the prose between two code blocks or headings is a run of its own.
- Titles (``titles``: the book's own, of every level, as the outline holds them) of at least :data:`NAME_WORDS`
  whitespace-separated words are names, not prose: where a run's words spell one out, the run stops there too.
  That applies to any title of the book, the section's own, its chapter's and its siblings' among them, so "as *The
  Danube's Role in Climate Change* shows" shares nothing with the section of that title nor with another that names
  it, and two sections restating the same title share nothing by it. A section that points to a sibling by its
  title knows the sibling (what ``--context outline`` asks for); it does not repeat it. Shorter titles ("Testing",
  "Best Practices") are left in: they are the words prose uses anyway. Without ``titles`` every 5-gram counts;
  ``defects.json`` gives both (``sibling_overlap``, and its ``every_gram``).
- A section with no 5-gram (fewer than 5 words in every run) has share 0.0, as has a chapter's only section; both
  are counted in the summary.
- Cost: linear in the text (times, at a word some name starts with, the number of distinct name lengths), plus
  indexing the titles once. Each chapter is one pass: every section's distinct 5-grams (with names set apart and
  without), a Counter of how many of the chapter's sections hold each, then a section's share is the part of its
  5-grams held more than once.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .fences import fenced_blocks

__all__ = ["GRAM", "NAME_WORDS", "Names", "grams", "overlap_line", "overlap_report", "share_summary", "sibling_share",
           "sibling_shares", "title_words"]

GRAM = 5  # words a gram
NAME_WORDS = 3  # a title of this many words or more is a name a run stops at
_WORD = re.compile(r"\w+")
_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|\r?$)")

_Gram = tuple[str, ...]


def _prose_runs(text: str) -> Iterator[list[str]]:
    """The runs of prose lines of ``text``: the lines between fenced blocks and headings, in order."""
    dropped: set[int] = set()  # 0-based line indices of code and fence lines
    for block in fenced_blocks(text):
        dropped.update(range(block.line - 1, block.end))
    run: list[str] = []
    for i, line in enumerate(text.split("\n")):
        if i in dropped or _HEADING.match(line):
            if run:
                yield run
            run = []
        else:
            run.append(line)
    if run:
        yield run


@dataclass(frozen=True)
class Names:
    """The titles a run stops at (:func:`title_words`), indexed once for the whole book: a name is looked for only at a
    word some name starts with, one set lookup per distinct name length, the longest first."""

    seqs: tuple[tuple[str, ...], ...]  # lower-cased word sequences, longest first
    by_len: Mapping[int, frozenset[tuple[str, ...]]]
    firsts: frozenset[str]

    def match(self, keys: list[str], i: int) -> int:
        """The length of the longest name spelled out from ``keys[i]`` on, 0 for none."""
        if keys[i] not in self.firsts:
            return 0
        for n, seqs in self.by_len.items():  # longest first
            if i + n <= len(keys) and tuple(keys[i:i + n]) in seqs:
                return n
        return 0


def title_words(titles: Iterable[str]) -> Names:
    """The titles a run stops at: those of at least :data:`NAME_WORDS` words (whitespace-separated, so "What's Next"
    and "Step-by-Step" are short titles and stay prose), as lower-cased ``\\w+`` sequences, each once."""
    seqs = {tuple(w.strip("_") for w in _WORD.findall(t.lower())) for t in titles if len(t.split()) >= NAME_WORDS}
    ordered = tuple(sorted((q for q in seqs if q), key=lambda q: (-len(q), q)))
    by_len: dict[int, set[tuple[str, ...]]] = {}
    for q in ordered:
        by_len.setdefault(len(q), set()).add(q)
    return Names(ordered, {n: frozenset(v) for n, v in by_len.items()}, frozenset(q[0] for q in ordered))


_NO_NAMES = title_words(())


def _unnamed(words: list[str], names: Names) -> Iterator[list[str]]:
    """``words`` split where a name of ``names`` is spelled out, the name's words dropped. Scanning left to right, the
    longest name starting at a word wins, and a name found first is not cut for one that overlaps it from a later
    word. Matching ignores ``_`` around a word (``_The Danube's Role_`` names the title as ``*...*`` does). Cost: the
    run's length times, at a word some name starts with, the number of distinct name lengths."""
    keys = [w.strip("_") for w in words]
    start = i = 0
    while i < len(words):
        n = names.match(keys, i)
        if not n:
            i += 1
            continue
        yield words[start:i]
        i = start = i + n
    yield words[start:]


def _gram_sets(text: str, names: Names, every_gram: bool = True) -> tuple[set[_Gram], set[_Gram]]:
    """``text``'s distinct 5-grams with ``names`` set apart, and with every 5-gram counted (left empty where names
    are set apart and ``every_gram`` is False): one pass over its words."""
    named: set[_Gram] = set()
    every: set[_Gram] = set()
    for run in _prose_runs(text):
        words = _WORD.findall("\n".join(run).lower())
        if every_gram or not names.seqs:
            every.update(zip(*(words[k:] for k in range(GRAM))))
        if names.seqs:
            for part in _unnamed(words, names):
                named.update(zip(*(part[k:] for k in range(GRAM))))
    return (named if names.seqs else every), every


def grams(text: str, names: Names = _NO_NAMES) -> set[_Gram]:
    """The distinct word 5-grams of ``text``'s prose (module docstring); ``names``: :func:`title_words`."""
    return _gram_sets(text, names)[0]


def sibling_shares(chapters: Mapping[str, Mapping[str, str]], titles: Iterable[str] = ()
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """Section path -> the share of its distinct 5-grams that some sibling also holds, with the book's ``titles`` set
    apart as names (module docstring), and the same with every 5-gram counted; one pass over the text.
    ``chapters``: chapter key -> {section path -> text}; section paths are unique across the book (a path in two
    chapters is a ValueError)."""
    return _shares(chapters, title_words(titles))


def _shares(chapters: Mapping[str, Mapping[str, str]], names: Names, every_gram: bool = True
            ) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`sibling_shares` with the titles indexed; ``every_gram`` False: the second is left empty."""
    named: dict[str, float] = {}
    every: dict[str, float] = {}
    for sections in chapters.values():
        if (twice := next((path for path in sections if path in named), None)) is not None:
            raise ValueError(f"section path {twice!r} is in more than one chapter")
        held = {path: _gram_sets(text, names, every_gram) for path, text in sections.items()}
        for k, out in enumerate((named, every) if every_gram else (named,)):
            holders = Counter(g for sets in held.values() for g in sets[k])
            for path, sets in held.items():
                own = sets[k]
                out[path] = sum(holders[g] > 1 for g in own) / len(own) if own else 0.0
    return named, every


def sibling_share(chapters: Mapping[str, Mapping[str, str]], titles: Iterable[str] = ()) -> dict[str, float]:
    """The first of :func:`sibling_shares`: the shares with ``titles`` set apart (every 5-gram counted without)."""
    return sibling_shares(chapters, titles)[0]


def share_summary(shares: Mapping[str, float]) -> dict[str, float | int]:
    """The book's summary of :func:`sibling_share`: the mean share, the 90th percentile (nearest rank: the smallest
    share at least 90% of the sections have at most), the largest, and how many sections; shares are rounded to 4
    decimals, and all are 0 for no sections."""
    values = sorted(shares.values())
    n = len(values)
    if not n:
        return {"mean": 0.0, "p90": 0.0, "max": 0.0, "sections": 0}
    return {
        "mean": round(math.fsum(values) / n, 4),
        "p90": round(values[math.ceil(0.9 * n) - 1], 4),
        "max": round(values[-1], 4),
        "sections": n,
    }


def overlap_report(chapters: Mapping[str, Mapping[str, str]], titles: Iterable[str],
                   printed: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """``defects.json`` ``sibling_overlap``: the :func:`share_summary` of the shares with the book's ``titles`` set
    apart as names, and ``every_gram``: its mean, p90 and max with every 5-gram counted (the measure before names).
    ``printed``: the same sections as book.md prints them (the model's talk to whoever asked left out, salad and a
    capped end cut): ``printed`` gives their mean, p90 and max, names set apart, what a reader of the book meets."""
    names = title_words(titles)
    named, every = _shares(chapters, names)
    out: dict[str, Any] = dict(share_summary(named))
    plain = share_summary(every)
    out["every_gram"] = {k: plain[k] for k in ("mean", "p90", "max")}
    if printed is not None:
        shown = share_summary(_shares(printed, names, every_gram=False)[0])  # the book's titles indexed once
        out["printed"] = {k: shown[k] for k in ("mean", "p90", "max")}
    return out


def overlap_line(report: Mapping[str, Any]) -> str:
    """``defects.md``'s words for an :func:`overlap_report`."""
    line = f"mean {report['mean']:.1%}, p90 {report['p90']:.1%}, max {report['max']:.1%}"
    plain, shown = report.get("every_gram"), report.get("printed")
    line += f"; every 5-gram counted: mean {plain['mean']:.1%}" if plain else ""
    return line + (f"; as book.md prints them: mean {shown['mean']:.1%}" if shown else "")
