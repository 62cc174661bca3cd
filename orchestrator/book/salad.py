"""Word salad: where a section's prose stops reading as language.

Pure: no I/O, no clock. A small model that runs past what it has to say, or that is pushed off a repetition loop by a
heavy repetition penalty (the small profile's loop re-ask before stop 40: core/profiles.py), writes strings of content
words with no grammar left: "allowed think differently way jobs mandate companies alot more responsibilites than
governments allow too ...". No repetition rule sees it (nothing repeats), and it reads as nonsense. What gives it away
is the glue: English prose is about 40% function words (the, of, and, to, is, ...); in the run of any 60 words of the
333 sections of nine SmolLM2-135M books, prose never fell under 17%, and salad (every loop re-ask's reply that went
wrong) stayed under 13%. Nor does salad stop: its "sentences" run on for 100 to 480 words, where the prose of those
books never ran past 54 words without a sentence end.

:func:`salad_at` is where the first such run starts. Only paragraph prose is read: fenced code, headings, list
items, table rows, quotes, labelled lines ("Step 1: ...", "**Term**: ..."), bracketed references and display math are
left out, and the function-word share is judged within one line of at least :data:`WINDOW` words (salad runs on in
one paragraph; a glossary, a list of steps or a table is many short lines), written mostly in ASCII letters, with the
function words of the commonest Latin-script languages counted too (a quoted French passage is prose). book.md prints
a section cut back before it (``assemble.section_body``), and ``defects.json`` counts it (``word_salad``).
"""

from __future__ import annotations

import re

from .fences import FENCE_OPEN, closer

__all__ = ["FUNCTION_WORDS", "RUN_ON", "SHARE", "WINDOW", "salad_at"]


WINDOW = 60  # words of one paragraph line judged together
SHARE = 0.12  # a window with fewer function words than this is salad
RUN_ON = 90  # a "sentence" of more words than this is salad (the nine books' prose: at most 54)
LATIN = 0.9  # a line is judged by its function words only when this share of its letters is ASCII

# English's, and the commonest of the Latin-script languages a book may quote (French, German, Spanish, Italian,
# Portuguese, Dutch): a passage in one of them is prose, not salad.
FUNCTION_WORDS = frozenset("""
a an the and or but if of in on at to for with by from as is are was were be been being it its this that these
those there here which who whom whose what when where why how not no nor so than too very can will would should
could may might must do does did has have had having i you he she we they me him her us them my your his our their
into over under about after before between through during up down out off then also such each other more most some
any all both few many much only own same just i'm it's you're we're they're don't can't isn't
le la les l' un une des du de d' et est sont dans pour par sur avec qui que qu' ce cette ces il elle ils ne pas au aux
se sa son ses leur plus ou mais comme der die das den dem des ein eine einen einem einer und ist sind im in zu mit
von für auf nicht sich es auch als wie bei aus dass el los las del y en con por para una unos es son lo al se su
sus que il lo gli della delle di da e è per con non che o os um uma do da dos das em no na nos com por para é
het een en van op te dat die niet met zijn voor
""".split())

_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")
_BREAK = re.compile(r"[.!?;:\n。！？]")
# Lines that are not paragraph prose: headings, list items, table rows, quotes, labelled lines ("Step 1: ...",
# "**Term**: ...", "Note:"), bracketed references ("[1] ..."), links, display math, and lines indented 4 spaces or
# a tab (indented code, or a fence inside a list item, which book/fences.py leaves to a full parse).
_NOT_PROSE = re.compile(
    r"^(?: {4}|\t)|^\s*(?:#|[-*+•]\s|\d+[.)]\s|\||>|\[|\$\$|\\\[|\*\*|__|[^\s:]{1,30}(?:\s[^\s:]+){0,3}:\s)"
)


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(offset in ``text``, line) of every line of paragraph prose, in order. Lines are split at "\\n" as
    book/fences.py and cut-back split them; a fence indented inside a list item holds only short lines, which no
    window judges."""
    out: list[tuple[int, str]] = []
    fence: re.Pattern[str] | None = None
    offset = 0
    for line in text.split("\n"):
        if fence is not None:
            if fence.match(line):
                fence = None
        elif (m := FENCE_OPEN.match(line)) is not None:
            fence = closer(m.group(2))
        elif not _NOT_PROSE.match(line):
            out.append((offset, line))
        offset += len(line) + 1
    return out


def salad_at(text: str) -> int | None:
    """The offset in ``text`` where its word salad starts, or None when its prose reads as language throughout:
    the earlier of the first run of :data:`WINDOW` words of one paragraph line with under :data:`SHARE` function
    words, and the first sentence of more than :data:`RUN_ON` words."""
    lines = _prose_lines(text)
    found = [at for at in (_first_thin_window(lines), _first_run_on(text, lines)) if at is not None]
    return min(found, default=None)


def _first_thin_window(lines: list[tuple[int, str]]) -> int | None:
    """Within one line: salad runs on in one paragraph, where a list, a glossary or a table is many short lines."""
    need = SHARE * WINDOW
    for offset, line in lines:
        words = [(offset + m.start(), m.group()) for m in _WORD.finditer(line)]
        if len(words) < WINDOW or not _latin(line):
            continue
        glue = [w.lower() in FUNCTION_WORDS for _, w in words]
        held = sum(glue[:WINDOW])
        for start in range(len(words) - WINDOW + 1):
            if start:
                held += glue[start + WINDOW - 1] - glue[start - 1]
            if held < need:  # every start: the first thin window, so a text cut before it holds none
                return words[start][0]
    return None


def _latin(line: str) -> bool:
    if line.isascii():
        return True
    letters = [c for c in line if c.isalpha()]
    return sum(c.isascii() for c in letters) >= LATIN * len(letters)


def _first_run_on(text: str, lines: list[tuple[int, str]]) -> int | None:
    """Where the first sentence of more than RUN_ON words starts: words with no sentence end, colon, semicolon or
    line break between them."""
    run_start, run = 0, 0
    prev_end: int | None = None
    for offset, line in lines:
        for m in _WORD.finditer(line):
            at = offset + m.start()
            if prev_end is None or _BREAK.search(text, prev_end, at):
                run_start, run = at, 0
            run += 1
            if run > RUN_ON:
                return run_start
            prev_end = offset + m.end()
    return None
