"""A section caught in a repetition loop, kept as what it said before the loop began.

Pure: no I/O, no clock. A small model at temperature 0 writes its section, runs out of things to say, and starts
writing the same lines again. :func:`loop_start` finds where the repetition begins (the second time a repeated unit
is written); :func:`loop_cut` says whether what comes before it stands as a section: it is cut back to its last
complete sentence, list item, table row or code block (:func:`.cutback.complete_part`), no longer loops
(:func:`.checks.loop_reason`) and holds enough words. The section is then kept as that (``SectionCheck``), where it
would have been asked again: the re-ask, at the profile's loop temperature, is a whole new answer sent when the
first one is already long under way, which on the embedded engine made it the last section of 7 of 12 books
(3.6-28 s, 12 of 16 to the token cap; benchmarks/context_quality.py at stop 43).

Why not a library: the unit that loops is the checks' own (a prose line, a paragraph, a code line, a 12-word run),
and where it starts is a by-product of counting them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import accumulate

# the checks' own reading of a line (its markers, lead-ins, words), so that a loop starts where loop_reason counts it
from .checks import (
    _ALNUM,
    _DIGITS,
    _WORDS,
    CODE_LINE_MIN_WORDS,
    CODE_LINE_REPEATS,
    LINE_MIN_WORDS,
    LINE_REPEATS,
    NUMBERED_LINE_REPEATS,
    PARAGRAPH_WORDS,
    RUN_REPEATS,
    RUN_WORDS,
    SHORT_LINE_REPEATS,
    _is_lead_in,
    _norm_line,
    _read_lines,
    loop_reason,
)
from .cutback import complete_part
from .talk import words

__all__ = ["kept_before_loop", "loop_cut", "loop_start"]


def _lines(text: str) -> list[tuple[int, str, bool]]:
    """(offset, line, is code) of each line of ``text`` but the fences, read as the checks read them."""
    lines = text.split("\n")
    offsets = [0, *accumulate(len(line) + 1 for line in lines)]
    return [(offsets[i], line, code) for i, line, code in _read_lines(lines)]


def loop_start(text: str) -> int | None:
    """The offset in ``text`` where its repetition begins, None when nothing in it repeats as a loop does.

    Only a unit written as often as :func:`.checks.loop_reason` needs to call it a loop counts, and the loop starts
    where it is written the second time (the first is the section's own): the earliest of the second occurrence of a
    paragraph written twice; of a prose line of 4+ words (not a lead-in) written 3+ times; of a shorter line written
    6+ times; of a line written 6+ times with only its numbers changed; of a code or table line of 3+ words written
    4+ times; of a 12-word run of prose written 4+ times. A unit the section legitimately writes twice (a list item
    restated in a summary, a title named again, "Here is a small example that puts X into practice:") is no loop's
    start."""
    lines = _lines(text)
    prose = [(at, _norm_line(line)) for at, line, code in lines if not code]
    prose = [(at, n) for at, n in prose if _ALNUM.search(n)]
    code = [(at, " ".join(line.split())) for at, line, c in lines if c]
    counts = Counter(n for _, n in prose)
    numbered = Counter(_DIGITS.sub("0", n) for _, n in prose)
    code_counts = Counter(n for _, n in code)
    starts: list[int] = []

    def second(items: list[tuple[int, str]], key: Callable[[str], str], loops: Callable[[str, str], bool]) -> None:
        seen: set[str] = set()
        for at, n in items:
            k = key(n)
            if loops(n, k):
                if k in seen:
                    starts.append(at)
                    return
                seen.add(k)

    def prose_loops(n: str, _k: str) -> bool:
        w = len(_WORDS.findall(n))
        if w >= PARAGRAPH_WORDS:
            return counts[n] >= 2
        if w >= LINE_MIN_WORDS and not _is_lead_in(n):
            return counts[n] >= LINE_REPEATS
        return counts[n] >= SHORT_LINE_REPEATS

    second(prose, lambda n: n, prose_loops)
    second(prose, lambda n: _DIGITS.sub("0", n),
           lambda n, k: len(_WORDS.findall(n)) >= LINE_MIN_WORDS and numbered[k] >= NUMBERED_LINE_REPEATS)
    second(code, lambda n: n,
           lambda n, _k: len(_WORDS.findall(n)) >= CODE_LINE_MIN_WORDS and code_counts[n] >= CODE_LINE_REPEATS)
    if (run := _run_start(text, [at for at, _ in prose])) is not None:
        starts.append(run)
    return min(starts, default=None)


def _run_start(text: str, prose_lines: list[int]) -> int | None:
    """Where a 12-word run of prose written 4+ times is written the second time (a sentence looping within one
    paragraph)."""
    found: list[tuple[int, str]] = []  # (offset, word) over the prose lines
    for at in prose_lines:
        end = text.find("\n", at)
        line = text[at : len(text) if end < 0 else end]
        found.extend((at + m.start(), m.group().lower()) for m in _WORDS.finditer(line))
    keys = [w for _, w in found]
    runs = [tuple(keys[i : i + RUN_WORDS]) for i in range(len(keys) - RUN_WORDS + 1)]
    counts = Counter(runs)
    seen: set[tuple[str, ...]] = set()
    for i, run in enumerate(runs):
        if counts[run] >= RUN_REPEATS:
            if run in seen:
                return found[i][0]
            seen.add(run)
    return None


def kept_before_loop(text: str, at: int) -> str:
    """What a section cut at offset ``at`` (:func:`loop_cut`) prints: ``text[:at]`` to its last complete sentence,
    list item, table row or code block; "" when it holds none."""
    return complete_part(text[:at]) or ""


def loop_cut(text: str, min_words: int) -> int | None:
    """The offset to cut ``text`` at, before its loop, when what it said before stands as a section: at least
    ``min_words`` words once cut back to a complete sentence, item, row or block, and no loop left in it; else
    None (the section is asked again, or printed as written)."""
    at = loop_start(text)
    if at is None:
        return None
    kept = kept_before_loop(text, at)
    if words(kept) < min_words or loop_reason(kept) is not None:
        return None
    return at
