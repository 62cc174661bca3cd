"""Planning replies -> titles: pure parsing, no I/O.

A reply may be JSON (fenced or inside prose; an object with "items" or a bare list), a numbered or bulleted list,
or plain lines among the model's chatter. :func:`extract_titles` finds the titles, :func:`weak_title` is the title
gate every title passes, and :func:`parse_titles` decides whether a reply is usable as a node's list.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..book.checks import norm_title as norm
from ..book.checks import title_debris
from ..book.fences import fenced_code, is_fence_line
from .made import MAX_TITLE_CHARS, filler_titles, qualified
from .made import shorten as _shorten


@dataclass(frozen=True)
class Titles:
    title: str | None
    items: tuple[str, ...]
    filled: int = 0  # of ``items``, the last ones made from the node's own title (:func:`filler_titles`)


# A list line: its indent, its marker ("1." / "1)" / "(1)" or a bullet) and its text.
LIST_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>\d+[.)]|\(\d+\)|[-*•+])\s+(?P<text>.*\S)\s*$")
TITLE_LINE = re.compile(r"^\s*(?:\*\*)?(?:book\s+)?title(?:\*\*)?\s*[:\-–]\s*(.+?)\s*$", re.IGNORECASE)
_COUNT_WORDS = ("one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
                "sixteen|seventeen|eighteen|nineteen|twenty")
_PREFIX = re.compile(
    rf"^(?:part|chapter|section)\s+(?:[\dIVXLC]+|{_COUNT_WORDS})\s*(?:[:.\-–—]\s*|\s+(?=\S))", re.IGNORECASE
)
# "**Alpha**: the basics" / "**Alpha** - the basics": the bold words are the title, the rest describes it.
_BOLD_LEAD = re.compile(r"^(\*\*|__)(?P<title>[^*_].*?)\1\s*(?:[:\-–—]\s*(?P<rest>.*))?$")
# Lines around a list that are the model talking, not titles ("Here are 4 titles:", "Let me know ...").
_CHATTER = re.compile(
    r"^(?:here(?:'s| is| are)|sure\b|certainly|of course|absolutely|okay\b|ok\b|below (?:is|are)|the following|"
    r"these (?:are|titles|sections|chapters|parts)|i hope|i've|i have|hope this|let me|feel free|note\b|"
    r"please\b|if you|would you|do you|this (?:list|outline|structure)|each (?:section|chapter|part))",
    re.IGNORECASE,
)

_LEADING_NUMBER = re.compile(r"^(?:\d+[.)]\s+)+")


def clean_title(t: str) -> str:
    t = t.strip()
    t = re.sub(r"^#+\s*", "", t)
    m = _BOLD_LEAD.match(t)
    if m:
        t = m.group("title")
    t = t.strip("*_` ").strip()
    t = t.strip("\"'“”‘’").strip()
    t = _PREFIX.sub("", t).strip()
    t = _LEADING_NUMBER.sub("", t).strip()  # "1. Basics" inside a JSON string: the list's numbering, not the title
    t = t.strip("\"'“”‘’*_ ").strip()
    t = t.rstrip(":").strip()
    return " ".join(t.split())


def indent_width(s: str) -> int:
    return len(s.expandtabs(4))


def marker_kind(marker: str) -> str:
    return "bullet" if marker in "-*•+" else "number"


def _is_chatter(line: str) -> bool:
    """A line of the model talking: a lead-in ending in ':', a conversational opener, or a whole sentence."""
    s = line.strip().strip("*_").strip()
    if not s:
        return True
    if s.endswith(":") or _CHATTER.match(s):
        return True
    return s[-1] in ".!?" and len(s.split()) >= 8


def _find_json(text: str) -> Any:
    """The list-shaped JSON value a reply holds: a fenced block's, else the first JSON object or array that
    parses where it starts (prose around it is ignored). orjson has no incremental decoder, so this uses the
    standard library's ``raw_decode``, which parses a value and tells where it ended."""
    candidates = [code.strip() for code in fenced_code(text)]
    decoder = json.JSONDecoder()
    for block in [*candidates, text]:
        tries = 0
        for m in re.finditer(r"[\[{]", block):
            tries += 1
            if tries > 20:
                break
            try:
                data, _ = decoder.raw_decode(block, m.start())
            except (ValueError, RecursionError):  # RecursionError: a model's "[[[[..." past the parser's depth
                continue
            if _list_of_titles(data) is not None:
                return data
    return None


def _list_of_titles(data: Any) -> list[str] | None:
    """The titles in a JSON value: an object's "items" (or its first list), or a bare list; items may be
    strings or objects with a "title"/"name"."""
    raw = None
    if isinstance(data, dict):
        raw = data.get("items")
        if not isinstance(raw, list):
            raw = next((v for v in data.values() if isinstance(v, list)), None)
    elif isinstance(data, list):
        raw = data
    if raw is None:
        return None
    out = []
    for x in raw:
        if isinstance(x, dict):
            x = next((x[k] for k in ("title", "name", "heading") if isinstance(x.get(k), str)), None)
        if isinstance(x, str | int | float) and not isinstance(x, bool):
            out.append(str(x))
    return out if out else None


def _top_list(lines: list[str]) -> list[str]:
    """The titles of a text reply's list: the lines at the outermost indent. Where numbered lines and bullets
    mix at that indent, a bullet is a title only where it fills a gap in the numbering ("1.", "2.", "- x", "4.");
    bullets between consecutive numbers are notes under the numbered titles, not titles."""
    found = [(m, indent_width(m.group("indent"))) for ln in lines if (m := LIST_LINE.match(ln))]
    if not found:
        return []
    top = min(ind for _, ind in found)
    level = [m for m, ind in found if ind == top]
    numbers = [_number(m.group("marker")) for m in level]
    if all(k is None for k in numbers) or all(k is not None for k in numbers):
        return [m.group("text") for m in level]
    out: list[str] = []
    expected = 1
    for i, (m, k) in enumerate(zip(level, numbers, strict=True)):
        if k is not None:
            out.append(m.group("text"))
            expected = k + 1
            continue
        after = next((x for x in numbers[i + 1:] if x is not None), None)
        if after is not None and after > expected:  # the bullet stands where a number is missing
            out.append(m.group("text"))
            expected += 1
    return out


def _number(marker: str) -> int | None:
    digits = marker.strip("().")
    return int(digits) if digits.isdigit() else None


def extract_titles(text: str) -> tuple[str | None, list[str]]:
    """Every (cleaned, non-empty) title a planning reply holds, untrimmed, and its book title if it names one.

    JSON anywhere in the reply (fenced or inside prose; an object with "items" or another list, or a bare list),
    else the outermost numbered or bulleted list, else the lines that are not the model talking. Prose around a
    list is never taken as titles."""
    title: str | None = None
    items: list[str] = []
    stripped = text.strip()
    data = _find_json(stripped)
    if data is not None:
        items = [clean_title(x) for x in _list_of_titles(data) or []]
        if isinstance(data, dict) and isinstance(data.get("title"), str):
            title = clean_title(data["title"])
    else:
        lines = [ln for ln in stripped.splitlines() if ln.strip() and not is_fence_line(ln)]
        for ln in lines:
            tm = TITLE_LINE.match(ln)
            if tm and title is None:
                title = clean_title(tm.group(1))
        body = [ln for ln in lines if not TITLE_LINE.match(ln)]
        listed = _top_list(body)
        if listed:
            items = [clean_title(x) for x in listed]
        else:
            items = [clean_title(ln) for ln in body if not _is_chatter(ln)]
    return title or None, [x for x in items if x]


_WORDLIKE = re.compile(r"[^\W\d_]")  # at least one letter
_DEBRIS = re.compile(r'[{}\[\]"]|\d+(?:\.\d+){3,}')  # JSON fragments, "1.1.1.1" chains


def weak_title(title: str, avoid: frozenset[str], taken: frozenset[str] | set[str] = frozenset()) -> str | None:
    """Why a title is no use as an outline node, or None: the title gate every reply passes, for every model.

    Debris (repair.title_debris: prompt words echoed back, markup and JSON fragments, numbering like "5.5",
    dates and stamps, file names, placeholders, over-long lines), a copy of an ancestor's or the book's title
    (``avoid``: their normalised forms) or a near copy of one (see :func:`_near_copy`), or a title already used
    elsewhere in the outline (``taken``, normalised; only for profiles that want a distinct outline)."""
    if len(title) > MAX_TITLE_CHARS:
        return f"title too long ({len(title)} characters): {title[:60]!r}..."
    why = title_debris(title, avoid)
    if why:
        return why
    if not _WORDLIKE.search(title) or _DEBRIS.search(title):
        return f"not a title: {title[:60]!r}"
    k = norm(title)
    if k in taken:
        return f"title {title!r} is already used elsewhere in the outline"
    words = _content_words(k)
    if any(_near_copy(words, _content_words(a)) for a in avoid):
        return f"title {title!r} nearly repeats a parent's title"
    return None


_STOPWORDS = frozenset("a an the and or of in on for to with by at from as its your our vs".split())


def _content_words(normalised: str) -> set[str]:
    return {w for w in normalised.split() if w not in _STOPWORDS}


def _near_copy(child: set[str], parent: set[str]) -> bool:
    """A child title that only rewords its parent's: most of it ("Web Apps Testing" under "Testing Web Apps
    Quickly"), or the same words with one swapped ("...a Fast-Paying Career" under "...a Fast-Paced Career",
    as small models do when they cannot think of a child). A child that adds words to its parent's ("Version
    Control Basics" under "Version Control") is a real subtopic."""
    if len(child) < 2 or not child & parent:
        return False
    if child <= parent:
        return len(child) >= 0.75 * len(parent)  # "Continuous Integration" under "... CI/CD" is a subtopic
    # one word swapped in a long title; shorter ones sharing three words are often real subtopics ("Caches in
    # Long-Term Maintenance" under "Long-Term Maintenance for Working Engineers")
    return len(child - parent) <= 1 and len(parent - child) == 1 and len(child & parent) >= 4


def spare_count(n: int) -> int:
    """How many titles beyond ``n`` a node asks for when titles must be distinct across the book (a quarter more, at
    least 2: 16 sections ask 20). Measured on the simulator's 8 x 12 x 16 book, whose section titles repeat as the
    reference's do (~6.5% drawn from one pool of 50): four spares leave about one chapter in a hundred with more
    repeats than spares, which is then asked again."""
    return max(2, -(-n // 4))


def parse_titles(
    text: str,
    n: int,
    want_title: bool,
    fixed: tuple[str, ...] = (),
    fixed_title: str | None = None,
    avoid: frozenset[str] = frozenset(),
    *,
    strict: bool = True,
    pool: tuple[str, ...] = (),
    pool_title: str | None = None,
    taken: frozenset[str] = frozenset(),
    qualify: str | None = None,
    own: str | None = None,
) -> Titles:
    """Parse a planning reply (JSON, numbered, bulleted or plain lines). Raises ValueError when unusable.

    ``fixed`` are titles already committed (children were started from them; see :class:`.stream.Expansion`):
    they are the first titles of the result whatever the reply says. A reply that begins with them is judged exactly as
    without them; one that does not (a re-asked reply that changed its mind) contributes its titles that are not
    already fixed, in its order. ``fixed_title`` likewise wins over the reply's book title.

    Strict (every attempt but a node's last): fewer than ``n`` titles, a repeated title, a title that repeats an
    ancestor in ``avoid`` or the book title, a placeholder ("Section 1") or a rambling title make the reply
    unusable, so it is asked again. The last attempt keeps the book rather than lose it: it drops repeats, tops
    the list up from the titles of the node's earlier replies (``pool``, ``pool_title``), prefers strong titles
    to weak ones, and shortens rambling ones; only too few distinct titles still fail. With ``qualify`` (the node's
    own title, given when titles must be distinct across the book), a title that is strong but ``taken`` elsewhere
    fills a place the strong ones left empty as :func:`qualified` by it, before the list is kept short.
    """
    title, items = extract_titles(text)
    if fixed and items[: len(fixed)] != list(fixed):
        fixed_norms = {norm(x) for x in fixed}
        items = list(fixed) + [x for x in items if norm(x) not in fixed_norms]
    if fixed_title:
        title = fixed_title
    if not strict:
        title = _shorten(title) if title else (_shorten(pool_title) if pool_title else None)
        items, filled = _salvage(items, pool, fixed, avoid | ({norm(title)} if title else set()), n, taken,
                                 qualify, own)
        if not items:
            raise ValueError(f"expected {n} titles, got none")
        # Without ``own`` (the book node), fewer than asked is a smaller book, not a lost one (the reply and the
        # node's earlier ones offered no more distinct titles).
        return Titles(title, tuple(items[:n]), filled)
    if len(items) < n:
        raise ValueError(f"expected {n} titles, got {len(items)}")
    # A reply with more titles than asked may carry a repeat or a weak one among them: the distinct strong
    # titles, in order, are enough when there are n of them. Fewer is unusable, and the first reason is given.
    avoid = avoid | ({norm(title)} if title else set())
    out = list(fixed)
    seen = {norm(x) for x in out}
    why: str | None = None
    for x in items[len(fixed):]:
        if len(out) >= n:
            break
        k = norm(x)
        reason = f"duplicate title {x!r}" if k in seen else weak_title(x, avoid, taken)
        if reason:
            why = why or reason
            continue
        seen.add(k)
        out.append(x)
    if len(out) < n:
        raise ValueError(why or f"expected {n} titles, got {len(out)}")
    # A reply without a book title is not a failure: the planner falls back to one made from the prompt.
    return Titles(title, tuple(out))


def _salvage(
    items: list[str], pool: tuple[str, ...], fixed: tuple[str, ...], avoid: frozenset[str], n: int,
    taken: frozenset[str] = frozenset(), qualify: str | None = None, own: str | None = None,
) -> tuple[list[str], int]:
    """Distinct titles for a node's last attempt, and how many of them are fillers: fixed ones first, then strong
    ones, then (``qualify``) strong ones taken elsewhere, qualified by the node's title. Weak ones (debris, a copy
    of a parent) only when there is no strong one at all (with ``qualify``, those that repeat no title of the book
    first): a node with no title at all would lose its part of the book. With ``own``, before those,
    :func:`~.made.filler_titles` up to ``n``: plain headings read better than a short chapter, debris, or a title
    the book already holds. They pass the title gate (no near copy of a parent, no title the book holds), save that
    one made from a long parent title may be long. Fillers come only where the node's replies named some title,
    good or not: a model that answers a node with prose alone fails it rather than hide behind a book of fillers."""
    out = list(fixed)
    seen = {norm(x) for x in out}
    candidates = [_shorten(x) for x in [*items[len(fixed):], *pool]]
    # A line over the title length is a sentence, and cut to the length it reads as one cut off ("Design Patterns: I
    # have designed 50 different design pattern varieties using Javadoc", "Regression (X-Y): This link provides more
    # detail on the concept but should"): it comes after the fillers, which read as headings.
    lines = [*items[len(fixed):], *pool]
    whole = [x for x, line in zip(candidates, lines, strict=True) if x == " ".join(line.split())]
    cut = [x for x in candidates if x not in whole]
    _fill(out, seen, whole, avoid, n, taken)
    if qualify and len(out) < n:
        again = [qualified(x, qualify) for x in whole if norm(x) in taken and not weak_title(x, avoid)]
        _fill(out, seen, again, avoid, n, taken)
    if not own:  # the book node has no fillers: a cut title before a weak one
        _fill(out, seen, cut, avoid, n, taken)
    no_strong = len(out) == len(fixed)
    filled = 0
    if own and len(out) < n and (candidates or fixed):  # a model that named no title at all fails the node
        before = len(out)
        made = filler_titles(own)
        _fill(out, seen, made, avoid, n, taken)  # through the title gate: no near copy of a parent, no repeat
        # then those whose only fault is length (a long parent title): still no near copy and no repeat
        _fill(out, seen, [x for x in made if not weak_title(_shorten(x), avoid, taken)], avoid, n, taken,
              allow_weak=True)
        filled = len(out) - before
        if len(out) < n:  # fillers ran out (the book holds them): cut lines, before the fillers (made ones come last)
            extra: list[str] = []
            _fill(extra, seen, cut, avoid, n - len(out), taken)
            out[before:before] = extra
    if no_strong and len(out) < n:  # no strong title at all: weak ones rather than lose the node's part of the book
        if qualify:
            # the book's titles must be distinct: weak ones (a near copy, debris) that repeat no title of the book
            # (its ancestors' in ``avoid``, another node's in ``taken``) come first, then the rest as before
            fresh = [x for x in candidates if norm(x) not in avoid and norm(x) not in taken]
            _fill(out, seen, fresh, avoid, n, taken, allow_weak=True)
        _fill(out, seen, candidates, avoid, n, taken, allow_weak=True)
    return out, filled


def _fill(out: list[str], seen: set[str], candidates: list[str], avoid: frozenset[str], n: int,
          taken: frozenset[str], allow_weak: bool = False) -> None:
    """Append to ``out`` the ``candidates`` not yet ``seen`` (and, unless ``allow_weak``, passing the title gate),
    in order, until it holds ``n``."""
    for x in candidates:
        k = norm(x)
        if len(out) >= n:
            return
        if not k or k in seen or (not allow_weak and weak_title(x, avoid, taken)):
            continue
        seen.add(k)
        out.append(x)
