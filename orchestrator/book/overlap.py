"""Chapters -> each section's share of word 5-grams held by a sibling, and the book's summary of those shares.

Pure: no I/O, no clock. A section's siblings are the other sections of its chapter; its share is the fraction of
its distinct word 5-grams that occur in at least one sibling (0.0: nothing in common; 1.0: every 5-gram it has is
written elsewhere in the chapter). It measures how much of the chapter repeats itself, which fan-out writing (each
section by its own request, none seeing the others) is prone to.

- Words: ``\\w+`` tokens of the lower-cased text outside fenced code (:func:`.fences.fenced_blocks`, the fence
  lines included) and outside ATX headings (``#`` to ``######`` at the margin; a setext heading's words count).
  A 5-gram never spans a dropped line: the prose between two code blocks or headings is a run of its own.
- Titles (``titles``: the book's own, of every level, as the outline holds them) of at least :data:`NAME_WORDS` words
  are names, not prose: where a run's words spell one out, the run stops there too, so "as *The Danube's Role in
  Climate Change* shows" shares nothing with the section of that title nor with another that names it. A section
  that points to a sibling by its title knows the sibling (what ``--context outline`` asks for); it does not repeat
  it. Shorter titles ("Testing", "Best Practices") are left in: they are the words prose uses anyway. Without
  ``titles`` every 5-gram counts; ``defects.json`` gives both (``sibling_overlap`` and its ``with_titles``).
- A section with no 5-gram (fewer than 5 words in every run) has share 0.0, as has a chapter's only section; both
  are counted in the summary.
- Cost: linear in the text. Each chapter is one pass: every section's distinct 5-grams, a Counter of how many of
  the chapter's sections hold each, then a section's share is the part of its 5-grams held more than once.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from .fences import fenced_blocks

__all__ = ["GRAM", "NAME_WORDS", "grams", "share_summary", "sibling_share", "title_words"]

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


def title_words(titles: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    """The titles a run stops at, as lower-cased word sequences: those of at least :data:`NAME_WORDS` words, each
    once, longest first."""
    seqs = {tuple(_WORD.findall(t.lower())) for t in titles}
    return tuple(sorted((q for q in seqs if len(q) >= NAME_WORDS), key=lambda q: (-len(q), q)))


def _unnamed(words: list[str], names: tuple[tuple[str, ...], ...]) -> Iterator[list[str]]:
    """``words`` split where a name of ``names`` is spelled out, the names' words dropped. A name is looked for
    from each word it may start at (its first word indexes it), so a run costs its length times the names sharing
    a first word."""
    if not names:
        yield words
        return
    by_first: dict[str, list[tuple[str, ...]]] = {}
    for q in names:
        by_first.setdefault(q[0], []).append(q)
    start = i = 0
    while i < len(words):
        hit = next((q for q in by_first.get(words[i], ()) if tuple(words[i:i + len(q)]) == q), None)
        if hit is None:
            i += 1
            continue
        yield words[start:i]
        i = start = i + len(hit)
    yield words[start:]


def grams(text: str, names: tuple[tuple[str, ...], ...] = ()) -> set[_Gram]:
    """The distinct word 5-grams of ``text``'s prose (module docstring); ``names``: :func:`title_words`."""
    out: set[_Gram] = set()
    for run in _prose_runs(text):
        for words in _unnamed(_WORD.findall("\n".join(run).lower()), names):
            out.update(zip(*(words[k:] for k in range(GRAM))))
    return out


def sibling_share(chapters: Mapping[str, Mapping[str, str]], titles: Iterable[str] = ()) -> dict[str, float]:
    """Section path -> the share of its distinct 5-grams that some sibling also holds. ``chapters``: chapter key ->
    {section path -> text}; section paths are unique across the book (a path in two chapters is a ValueError).
    ``titles``: the book's titles, whose spelled-out names no 5-gram spans (module docstring)."""
    names = title_words(titles)
    shares: dict[str, float] = {}
    for sections in chapters.values():
        held = {path: grams(text, names) for path, text in sections.items()}
        holders = Counter(g for own in held.values() for g in own)
        for path, own in held.items():
            if path in shares:
                raise ValueError(f"section path {path!r} is in more than one chapter")
            shares[path] = sum(holders[g] > 1 for g in own) / len(own) if own else 0.0
    return shares


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
