"""Word salad: where a section's prose stops reading as language.

Pure: no I/O, no clock. A small model that runs past what it has to say, or that is pushed off a repetition loop by a
heavy repetition penalty (the small profile's loop re-ask), writes strings of content words with no grammar left:
"allowed think differently way jobs mandate companies alot more responsibilites than governments allow too ...". No
repetition rule sees it (nothing repeats), and it reads as nonsense. What gives it away is the glue: English prose
is about 40% function words (the, of, and, to, is, ...); in the run of any 60 words of the 333 sections of nine
SmolLM2-135M books, prose never fell under 17%, and salad (every loop re-ask's reply that went wrong, the bracketed
placeholder lists a 135M model signs off with) stayed under 13%. Nor does salad stop: its "sentences" run on for
100 to 480 words, where the prose of those books never ran past 54 words without a sentence end.

:func:`salad_at` is where the first such run starts. Only paragraph prose is read: fenced code, headings, list
items, table rows and quoted lines are left out (a list of tool names or a table of terms is not salad), and a text
with fewer than :data:`WINDOW` prose words is never salad. book.md prints a section cut back before it
(``assemble.section_body``), and ``defects.json`` counts it (``word_salad``).
"""

from __future__ import annotations

import re

from .fences import FENCE_OPEN, closer

__all__ = ["FUNCTION_WORDS", "RUN_ON", "SHARE", "WINDOW", "salad_at"]

WINDOW = 60  # words of prose judged together
STEP = 10  # how far each window starts after the last
SHARE = 0.12  # a window with fewer function words than this is salad
RUN_ON = 90  # a "sentence" of more words than this is salad (the nine books' prose: at most 54)

FUNCTION_WORDS = frozenset("""
a an the and or but if of in on at to for with by from as is are was were be been being it its this that these
those there here which who whom whose what when where why how not no nor so than too very can will would should
could may might must do does did has have had having i you he she we they me him her us them my your his our their
into over under about after before between through during up down out off then also such each other more most some
any all both few many much only own same just i'm it's you're we're they're don't can't isn't
""".split())

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_BREAK = re.compile(r"[.!?;:\n]")
_NOT_PROSE = re.compile(r"^\s*(?:#|[-*+•]\s|\d+[.)]\s|\||>)")


def _prose_words(text: str) -> list[tuple[int, str]]:
    """(offset in ``text``, word) of every word of paragraph prose, in order."""
    out: list[tuple[int, str]] = []
    fence: re.Pattern[str] | None = None
    offset = 0
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\r\n")
        if fence is not None:
            if fence.match(stripped):
                fence = None
        elif (m := FENCE_OPEN.match(stripped)) is not None:
            fence = closer(m.group(2))
        elif not _NOT_PROSE.match(stripped):
            out.extend((offset + m.start(), m.group()) for m in _WORD.finditer(stripped))
        offset += len(line)
    return out


def salad_at(text: str) -> int | None:
    """The offset in ``text`` where its word salad starts, or None when its prose reads as language throughout:
    the earlier of the first run of :data:`WINDOW` prose words with under :data:`SHARE` function words, and the
    first sentence of more than :data:`RUN_ON` words."""
    words = _prose_words(text)
    found = [at for at in (_first_thin_window(words), _first_run_on(text, words)) if at is not None]
    return min(found, default=None)


def _first_thin_window(words: list[tuple[int, str]]) -> int | None:
    if len(words) < WINDOW:
        return None
    glue = [w.lower() in FUNCTION_WORDS for _, w in words]
    need = SHARE * WINDOW
    held = sum(glue[:WINDOW])
    for start in range(len(words) - WINDOW + 1):
        if start:
            held += glue[start + WINDOW - 1] - glue[start - 1]
        if (start % STEP == 0 or start == len(words) - WINDOW) and held < need:
            return words[start][0]
    return None


def _first_run_on(text: str, words: list[tuple[int, str]]) -> int | None:
    """Where the first sentence of more than RUN_ON words starts: words with no sentence end, colon, semicolon or
    line break between them."""
    run_start, run = 0, 0
    prev_end: int | None = None
    for offset, word in words:
        if prev_end is None or _BREAK.search(text, prev_end, offset):
            run_start, run = offset, 0
        run += 1
        if run > RUN_ON:
            return run_start
        prev_end = offset + len(word)
    return None
