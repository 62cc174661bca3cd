"""Loops and title debris: the judgements the runner, the planner and our checks make about model output.

Pure: no I/O, no clock. Two questions:

- :func:`loop_reason`: is a section caught in a repetition loop (a small model at temperature 0 writing the same
  line until the token cap)? The runner keeps what it said before the loop when that is enough
  (:mod:`.loopcut`), else asks again once; defects count what still loops.
- :func:`title_debris`: is an outline title debris (the prompt echoed back, markup, numbering, a date, a file
  name, a copy of a parent) rather than a title?

(A section the token cap stopped is cut back to its last complete sentence by ``orchestrator.cutback``.)

Every threshold below was calibrated on the simulator's published-take book (8 x 12 x 16 sections, 250 words,
520-token cap; tests/book/test_checks.py regenerates it): none of its 1,536 sections loops and none of its 1,641
titles is debris (nor any of the 1.3 million titles its banks can make), while the loops and debris reported from
SmolLM2-135M on the embedded engine are caught (tests/book/test_checks.py has them).
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .fences import FENCE_OPEN, closer

__all__ = ["LoopWatch", "loop_reason", "norm_title", "title_debris"]

# ---------------------------------------------------------------------------------------------------------------
# loops

# A prose line of 4+ words seen 3 times is a loop: sentences do not recur verbatim in prose (the simulator's
# book never repeats one; its most repeated line is a code lead-in, twice).
LINE_REPEATS = 3
LINE_MIN_WORDS = 4
# Shorter lines and lead-ins ("For example:", "##### Pros", "Output:") recur legitimately; a loop runs to the
# cap, so a 1-word heading loop ("##### 2023") repeats dozens of times and 6 still catches it early.
SHORT_LINE_REPEATS = 6
# The same line with its numbers ignored ("Handbook. 6.3", "Handbook. 6.4", ...): a numbered loop. Six, since a
# legitimate list can differ only in its numbers ("- Version 1.0 released in 2019") three or four times.
NUMBERED_LINE_REPEATS = 6
# Code repeats short lines by nature (`}`, `return None`, `@property`): only lines of 3+ words count, from 4.
CODE_LINE_REPEATS = 4
CODE_LINE_MIN_WORDS = 3
# A paragraph (one line, 25+ words) written twice: a long unit loops only 2-3 times before the 520-token cap. The
# simulator's repeated lines are code lead-ins of at most 14 words.
PARAGRAPH_WORDS = 25
# "A 6-word run repeated 4+ times" (the rule) fires on 66 of the simulator's 1,536 sections: a section
# names its own title (up to 9 words in the simulator) in prose 4-6 times. A loop repeats its whole unit with the
# same continuation, so the run must be 12 words: the simulator's most repeated 12-word run occurs twice.
RUN_WORDS = 12
RUN_REPEATS = 4
# zlib compressed/raw size, prose and code apart (prose would hide a code loop). Book prose compresses to
# 0.43-0.58 (the simulator's: 0.46 at least), terse reference documentation (Node's API docs) to 0.20-0.35; the
# looping examples of tests/book/test_checks.py to 0.03-0.19, but a long paragraph looping 2-3 times only to 0.3 (the
# paragraph rule catches it). Real source code reaches 0.12 in 2,000-character windows of the standard library
# (0.37 typical), hence a lower bound for code; code looping to the cap: 0.02-0.06. Below RATIO_MIN_CHARS zlib's
# own overhead dominates.
PROSE_RATIO = 0.2
CODE_RATIO = 0.1
RATIO_MIN_CHARS = 400

_WORDS = re.compile(r"\w+")
_ALNUM = re.compile(r"[^\W_]")
_LINE_MARKUP = re.compile(r"^(?:\s*(?:#{1,6}|>|[-*+•]|\d+[.)]))+\s*")  # headings, quotes, list markers
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class _Split:
    """A section's lines sorted by what they are: prose, or code-like (fenced code and table rows)."""

    prose: tuple[str, ...]
    code: tuple[str, ...]


def _read_lines(lines: Iterable[str]) -> Iterable[tuple[int, str, bool]]:
    """(index, line, is code) of each line but the fences themselves: fenced code, and table rows (their cells repeat,
    "| Yes | No |", as code lines do), are code; the rest prose. book/loopcut.py reads lines the same way."""
    close: re.Pattern[str] | None = None  # the open block's closing line
    for i, line in enumerate(lines):
        if close is None:
            if m := FENCE_OPEN.match(line):
                close = closer(m.group(2))
            else:
                yield i, line, line.lstrip().startswith("|")
        elif close.match(line):
            close = None
        else:
            yield i, line, True


def _split(text: str) -> _Split:
    prose: list[str] = []
    code: list[str] = []
    for _, line, is_code in _read_lines(text.splitlines()):
        (code if is_code else prose).append(line)
    return _Split(tuple(prose), tuple(code))


def _norm_line(line: str) -> str:
    return " ".join(_LINE_MARKUP.sub("", line).split()).lower()


def _quote(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _is_lead_in(norm: str) -> bool:
    return norm.rstrip("*_ ").endswith(":")


def _line_loop(split: _Split) -> str | None:
    raw: dict[str, str] = {}  # normalised line -> its first occurrence, to quote
    for line in split.prose:
        raw.setdefault(_norm_line(line), line.strip())
    prose = Counter(n for n in map(_norm_line, split.prose) if _ALNUM.search(n))
    for line, k in prose.most_common():
        words = len(_WORDS.findall(line))
        if words >= PARAGRAPH_WORDS and k >= 2:
            return f"paragraph repeated {k} times: {_quote(raw[line])}"
        long_line = words >= LINE_MIN_WORDS and not _is_lead_in(line)
        if k >= (LINE_REPEATS if long_line else SHORT_LINE_REPEATS):
            return f"line repeated {k} times: {_quote(raw[line])}"
    numbered = Counter(_DIGITS.sub("0", n) for n in prose.elements()
                       if len(_WORDS.findall(n)) >= LINE_MIN_WORDS and _DIGITS.search(n))
    for line, k in numbered.most_common(1):
        if k >= NUMBERED_LINE_REPEATS:
            first = next(raw[n] for n in prose if _DIGITS.sub("0", n) == line)
            return f"line repeated {k} times with only its numbers changed: {_quote(first)}"
    code = Counter(n for n in (" ".join(c.split()) for c in split.code)
                   if len(_WORDS.findall(n)) >= CODE_LINE_MIN_WORDS)
    for line, k in code.most_common(1):
        if k >= CODE_LINE_REPEATS:
            return f"code line repeated {k} times: {_quote(line)}"
    return None


def _run_loop(split: _Split) -> str | None:
    words = _WORDS.findall("\n".join(split.prose).lower())
    if len(words) < RUN_WORDS * RUN_REPEATS:
        return None
    runs = Counter(tuple(words[i : i + RUN_WORDS]) for i in range(len(words) - RUN_WORDS + 1))
    run, k = runs.most_common(1)[0]
    if k >= RUN_REPEATS:
        return f"{RUN_WORDS}-word run repeated {k} times: {_quote(' '.join(run))}"
    return None


def _ratio(text: str) -> float | None:
    raw = text.encode()
    if len(raw) < RATIO_MIN_CHARS:
        return None
    return len(zlib.compress(raw, 9)) / len(raw)


def _compression_loop(split: _Split) -> str | None:
    prose = _ratio("\n".join(split.prose))
    if prose is not None and prose < PROSE_RATIO:
        return f"prose compresses to {prose:.3f} of its size (prose: {PROSE_RATIO} or more)"
    code = _ratio("\n".join(split.code))
    if code is not None and code < CODE_RATIO:
        return f"code compresses to {code:.3f} of its size (code: {CODE_RATIO} or more)"
    return None


def loop_reason(text: str) -> str | None:
    """Why ``text`` is caught in a repetition loop, or None when it is not.

    The reason reads like "line repeated 40 times: '##### 2023'" (the runner keeps it as the re-asked section's
    ``repaired_from``). Rules, the first that fires wins:

    - a prose line repeated: 3+ times for a line of 4+ words, 6+ times for a shorter line or a lead-in ending in
      ":"; 6+ times with only its numbers changed; a paragraph of 25+ words twice. Lines are compared without
      heading, quote and list markers, case or spacing; lines with no letter or digit are ignored;
    - a fenced code or table line of 3+ words repeated 4+ times (code legitimately repeats `}` or `return x`);
    - a 12-word run of prose repeated 4+ times (a sentence looping inside one paragraph);
    - text that compresses far better than prose: prose to under 0.2 of its size, or code (fenced and table
      lines) to under 0.1 (zlib), from 400 characters on.
    """
    split = _split(text)
    return _line_loop(split) or _run_loop(split) or _compression_loop(split)


# A streamed answer is checked whole (loop_reason) when a completed line recurs as often as a line rule needs, and
# when the last WATCH_WINDOW characters, looked at every WATCH_EVERY, compress to under WATCH_RATIO (zlib, ~9 µs): a
# loop's window compresses to 0.09-0.19, and of 7,884 windows of 1,728 sections of SmolLM2-135M books on the embedded
# engine 1% fell under 0.43 and 0.1% under 0.27 (a run of "[feature7], [feature8], ..." placeholders: 0.19).
WATCH_EVERY = 400
WATCH_WINDOW = 800
WATCH_RATIO = 0.35


class LoopWatch:
    """:func:`loop_reason` of an answer as it streams in, fed one delta at a time (``BackendClient.chat``'s
    ``stop_when``): the reason as soon as the text so far loops, else None. A section caught in a loop is then kept
    cut before it (:mod:`.loopcut`) or asked again at once, where waiting for its token cap would spend the rest of
    the cap on the loop (on the embedded engine, the 12 of 18 jobs of benchmarks/context_quality.py that had a loop
    re-ask all ended with one, 69-86 s in, where the six without ended at 46-68 s).

    A whole check costs about 0.25 ms for a 2,000-character section, so it runs only where a loop can have begun:
    when a completed prose line has recurred as often as a line rule needs (3 times, or twice for a paragraph of
    :data:`PARAGRAPH_WORDS` words), or when the text's last :data:`WATCH_WINDOW` characters compress far better than
    prose does (a sentence looping within one paragraph). Whatever prompts it, the reason is :func:`loop_reason`'s on
    the whole text so far: an answer stopped here is one the check after it refuses."""

    __slots__ = ("_counts", "_line", "_next", "_parts", "_size")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._size = 0
        self._next = WATCH_WINDOW  # size at which the window is looked at next
        self._line: list[str] = []  # the deltas of the line being written
        self._counts: Counter[str] = Counter()

    def __call__(self, delta: str) -> str | None:
        self._parts.append(delta)
        self._size += len(delta)
        if "\n" not in delta:
            self._line.append(delta)
            if self._size < self._next:
                return None
            due = False
        else:
            due = self._lines(delta)
            if not due and self._size < self._next:
                return None
        text = "".join(self._parts)
        if not due:
            self._next = self._size + WATCH_EVERY
            window = text[-WATCH_WINDOW:].encode()
            if len(zlib.compress(window)) >= WATCH_RATIO * len(window):
                return None
        return loop_reason(text)

    def _lines(self, delta: str) -> bool:
        """Count the lines ``delta`` completes; True when one just reached a count a line rule fires at (the
        paragraph rule's 2, the line rule's 3, the code line rule's 4, the short line rule's 6: each once)."""
        *done, rest = ("".join(self._line) + delta).split("\n")
        self._line = [rest]
        due = False
        for line in done:
            norm = _norm_line(line)
            if _ALNUM.search(norm):
                self._counts[norm] += 1
                k = self._counts[norm]
                if k in _LINE_COUNTS or (k == 2 and len(_WORDS.findall(norm)) >= PARAGRAPH_WORDS):
                    due = True
        return due


_LINE_COUNTS = frozenset({LINE_REPEATS, CODE_LINE_REPEATS, SHORT_LINE_REPEATS})


# ---------------------------------------------------------------------------------------------------------------
# title debris

MAX_TITLE_WORDS = 12  # a longer "title" is a sentence: the longest of the simulator's 1,641 has 9 words

# Words of our planning prompts a small model echoes back as if they were titles (templates/prompts/*.j2).
_PROMPT_ECHOES = frozenset({
    "items", "item", "title", "titles", "json", "book", "book title", "part", "parts", "chapter", "chapters",
    "section", "sections", "section titles", "chapter titles", "part titles", "in reading order",
    "reading order", "numbered list", "nothing else", "none", "null", "n a", "untitled", "string", "array",
    "object", "example", "name", "topic", "heading", "subtitle", "request", "outline",
})
_PROMPT_PHRASES = re.compile(r"\bin reading order\b|\bexactly \d+\b|\bone per line\b|\bnumbered list\b", re.I)
_LABEL = re.compile(r"^\W*(?:book\s+)?(?:title|items?|titles|book|name|part|chapter|section|heading|subtitle|"
                    r"topic)s?\s*(?:\[\d*\]|\d+)?\s*[:=]", re.I)
_PLACEHOLDER = re.compile(r"^(?:part|chapter|section|item|title|topic|heading|subtitle|name)"
                          r"(?:\s+(?:\d+(?:\.\d+)*|[ivxlc]+|[a-z]))?$", re.I)
_NUMBERED_LABEL = re.compile(r"^(?:part|chapter|section)\s+(?:\d+|[ivxlc]+)\s*[:.\-–—]", re.I)
# JSON and Markdown syntax; not "__init__", "C#" or "->", which are topics' own spelling
_MARKUP = re.compile(r"[{}\[\]\"\\]|\*\*|</?[A-Za-z][^>]*>|^\s*(?:#|[-*+•]\s|>)|`{3}")
# "1. Basics", "5.5 Caching", "(2) Logs" but not "10 Habits of ..." or "2023 in Review"
_LEADING_NUMBER = re.compile(r"^\s*(?:\d+(?:\.\d+)+\.?|\d+[.)]|\(\d+\))(?:\s|$)")
_TRAILING_NUMBER = re.compile(r"(?:[.:;,]\s*\d+(?:\.\d+)*|\(\d+\))\s*$")
_DATE = re.compile(r"\b\d{4}-\d{1,2}-\d{1,3}\b|\b\d{1,2}:\d{2}(?::\d{2})?\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b")
_DOCUMENT = re.compile(r"\.(?:pdf|docx?|epub|txt|odt|rtf)\b", re.I)
# A whole title that is a data or document file; not source or configuration files, which are topics of their own
# ("pyproject.toml", "setup.py", "Node.js").
_URL = re.compile(r"\b(?:https?|ftp)://|\bwww\.\w", re.I)  # "Use color effectively (https://...)" (SmolLM2-135M)
_FILE_NAME = re.compile(r"^[\w.-]+\.(?:md|json|csv|html?|xml|png|jpe?g|gif|svg|zip|gz|tar|log)$", re.I)
_LETTER = re.compile(r"[^\W\d_]")
# 25 Latin letters or more without a break, of one case after the first: no word of a title
# ("abcdmccgjhx8lqwz700eakriwfpliksbzdxcpfaaliyafognircprrr", "AbcdMCCGJHQRYZDRIDDULFF...", SmolLM2-135M's chapter list
# in a software handbook); the other words of 672 titles in 14 of its books had at most 15 letters ("Vulnerabilities"),
# the simulator's word banks 20 ("Internationalization"). An identifier in camel case is words
# ("ConcurrentModificationException"), and a script written without spaces is not Latin.
_RUN_ON = re.compile(r"[A-Za-z][a-z]{24,}|[A-Z]{25,}")
# One word three times in a row after another word ("The Nile: Its Sacred Sacred Sacred Mosi_Mine", SmolLM2-135M's
# chapter list): a model caught in a loop. A title that opens with it says it on purpose ("Location Location
# Location", "Ho Ho Ho: Holiday Cookies"), as one with punctuation between does ("Tora! Tora! Tora!").
_STUTTER = re.compile(r"\w\W*\s+([^\W\d_]{2,})(?:\s+\1\b){2}", re.IGNORECASE)
# A title that stops on a lone dash or joining sign, an opening bracket, or a dash right after a word: the rest of the
# line is missing ("What is it (and other) -", the same model's section list). "Britain Since 1945–", "Inside /proc/"
# and "C++" end as titles do.
_DANGLING = re.compile(r"(?:\s[-–—&/+]|\(|[^\W\d_][–—])$")


def norm_title(title: str) -> str:
    """The one normal form titles are compared in (the planner's, the assembler's and the checker's)."""
    return re.sub(r"[^\w]+", " ", title.lower()).strip()


def title_debris(title: str, ancestors: Iterable[str] = (), siblings: Iterable[str] = ()) -> str | None:
    """Why ``title`` is debris rather than an outline title, or None when it is a title.

    ``ancestors`` are the titles above it (the book's, its part's, its chapter's); ``siblings`` the titles before
    it under the same parent, in reading order. Debris: prompt words echoed back ("Title: ...", "items", "JSON",
    "in reading order"), markup and JSON fragments, numbering ("5.5", "Handbook. 6.3", "(2)"), dates and
    timestamps, file names ("book.pdf"), web addresses, a copy of an ancestor's title, a line of more than 12 words, a
    placeholder ("Section 3"), a title with no letter, a run of letters too long for a word, and a repeat of an
    earlier sibling. Titles that merely contain digits, slashes or a version ("HTTP/2 and gRPC", "Python 3.12
    Features", "The 12-Factor App") pass.

    Stricter than :func:`orchestrator.planning.weak_title` (the planner's gate, which must also salvage a book from a
    small model's replies): this one is the quality checker's, applied to the finished outline.
    """
    t = " ".join(title.split())
    n = norm_title(t)
    checks = (
        (not t or not _LETTER.search(t), "no letters: not a title"),
        (bool(_DATE.search(t)), "a date or a time"),
        (bool(_LEADING_NUMBER.search(t) or _TRAILING_NUMBER.search(t) or _NUMBERED_LABEL.match(t)), "numbering"),
        (n in _PROMPT_ECHOES or bool(_PROMPT_PHRASES.search(t)) or bool(_LABEL.match(t)), "prompt words echoed"),
        (bool(_MARKUP.search(t)), "markup or JSON fragment"),
        (bool(_DOCUMENT.search(t) or _FILE_NAME.match(t)), "a file name"),
        (bool(_URL.search(t)), "a web address"),
        (bool(_PLACEHOLDER.match(t)), "a placeholder"),
        (len(t.split()) > MAX_TITLE_WORDS, f"over {MAX_TITLE_WORDS} words"),
        (bool(_RUN_ON.search(t)), "letters that make no word"),
        (t.endswith((":", ",", ";")) or bool(_DANGLING.search(t)) or t.startswith((":", ",", ";")), "a fragment"),
        (bool(_STUTTER.search(t)), "a word three times over"),
        (n in {norm_title(a) for a in ancestors}, "a copy of a parent's or the book's title"),
        (n in {norm_title(s) for s in siblings}, "a repeat of an earlier title under the same parent"),
    )
    for hit, why in checks:
        if hit:
            return f"{why}: {_quote(t)}"
    return None
