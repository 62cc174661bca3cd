"""Prompt -> Outline, one request per outline node.

Strict mode (``pipeline=False``, the reference run's order): the book node, then every part at once, then every
chapter at once, each level waiting for the previous one, and no section before the whole outline is known.

Pipeline mode (default): *streaming outline expansion*. A planning reply is parsed while it streams
(:class:`TitleStream`, fed by the Dispatcher's per-call ``on_delta``); the moment one child title is complete, that
child starts: a part's chapter list is requested while the book's reply is still naming later parts, and a
section is handed to the runner (``on_section``) while its chapter's list is still streaming. Planning overlaps
writing from the first seconds; ``plan_time_s`` is still the time until the last section title is known.

Both modes send the same prompts, so against a deterministic server they make the same outline: a child's prompt
names only the siblings *before* it (the ones a streamed reply has already produced), never the later ones.

Every reply must hold exactly N distinct titles: too many are trimmed, too few or duplicates are asked again
(as a retry). How that stays consistent with children already started is :class:`_Expansion`'s rule: a title
that started a child is *committed* and is in the final outline whatever happens to the reply it came from.
"""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import orjson

from ..client import BackendClient, Reply
from ..dispatch import Dispatcher
from ..errors import PlanError
from ..events import LevelPlanned, NodeFinished
from ..outline import Chapter, Outline, Part
from ..profiles import PROFILES, Profile
from ..prompts import book_phrase, few_shot_messages, list_schema, render
from ..repair import MAX_TITLE_WORDS, title_debris
from ..repair import norm_title as norm

MAX_TITLE_CHARS = 160  # a longer "title" is a model rambling, and its children's prompts would overflow
RETRY_TEMPERATURE = 0.7  # planning re-asks after an unusable reply (see Planner._temperature)


@dataclass(frozen=True)
class Titles:
    title: str | None
    items: tuple[str, ...]


# A list line: its indent, its marker ("1." / "1)" / "(1)" or a bullet) and its text.
_LIST_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>\d+[.)]|\(\d+\)|[-*•+])\s+(?P<text>.*\S)\s*$")
_TITLE_LINE = re.compile(r"^\s*(?:\*\*)?(?:book\s+)?title(?:\*\*)?\s*[:\-–]\s*(.+?)\s*$", re.IGNORECASE)
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


def _indent(s: str) -> int:
    return len(s.expandtabs(4))


def _marker_kind(marker: str) -> str:
    return "bullet" if marker in "-*•+" else "number"


def _is_chatter(line: str) -> bool:
    """A line of the model talking: a lead-in ending in ':', a conversational opener, or a whole sentence."""
    s = line.strip().strip("*_").strip()
    if not s:
        return True
    if s.endswith(":") or _CHATTER.match(s):
        return True
    return s[-1] in ".!?" and len(s.split()) >= 8


_FENCE = re.compile(r"```[a-zA-Z]*\s*\n(.*?)```", re.DOTALL)


def _find_json(text: str) -> Any:
    """The list-shaped JSON value a reply holds: a fenced block's, else the first JSON object or array that
    parses where it starts (prose around it is ignored). orjson has no incremental decoder, so this uses the
    standard library's ``raw_decode``, which parses a value and tells where it ended."""
    candidates = [m.group(1).strip() for m in _FENCE.finditer(text)]
    decoder = json.JSONDecoder()
    for block in [*candidates, text]:
        tries = 0
        for m in re.finditer(r"[\[{]", block):
            tries += 1
            if tries > 20:
                break
            try:
                data, _ = decoder.raw_decode(block, m.start())
            except ValueError:
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
    found = [(m, _indent(m.group("indent"))) for ln in lines if (m := _LIST_LINE.match(ln))]
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
        lines = [ln for ln in stripped.splitlines() if ln.strip() and not ln.strip().startswith("```")]
        for ln in lines:
            tm = _TITLE_LINE.match(ln)
            if tm and title is None:
                title = clean_title(tm.group(1))
        body = [ln for ln in lines if not _TITLE_LINE.match(ln)]
        listed = _top_list(body)
        if listed:
            items = [clean_title(x) for x in listed]
        else:
            items = [clean_title(ln) for ln in body if not _is_chatter(ln)]
    return title or None, [x for x in items if x]


def book_title_from_prompt(prompt: str) -> str:
    """A book title made from the request, for a reply that names none ("Write me a complete software
    engineering handbook. Every topic..." -> "Software Engineering Handbook")."""
    first = re.split(r"(?<=[.!?])\s", prompt.strip(), maxsplit=1)[0].strip().rstrip(".!?")
    t = re.sub(
        r"^(?:please\s+)?(?:write|create|make|generate|produce|draft|compose|give)\s+(?:me\s+|us\s+)?"
        r"(?:a|an|the)?\s*(?:(?:complete|comprehensive|full|thorough|detailed|long|short|small|whole)\s+)*",
        "", first, flags=re.IGNORECASE,
    ).strip()
    t = t or first or "Handbook"
    words = t.split()[:12]
    small = {"a", "an", "the", "and", "or", "of", "for", "in", "on", "to", "with", "about"}
    return " ".join(w if (i and w.lower() in small) or not w.islower() else w.capitalize()
                    for i, w in enumerate(words))


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
) -> Titles:
    """Parse a planning reply (JSON, numbered, bulleted or plain lines). Raises ValueError when unusable.

    ``fixed`` are titles already committed (children were started from them; see :class:`_Expansion`): they are
    the first titles of the result whatever the reply says. A reply that begins with them is judged exactly as
    without them; one that does not (a re-asked reply that changed its mind) contributes its titles that are not
    already fixed, in its order. ``fixed_title`` likewise wins over the reply's book title.

    Strict (every attempt but a node's last): fewer than ``n`` titles, a repeated title, a title that repeats an
    ancestor in ``avoid`` or the book title, a placeholder ("Section 1") or a rambling title make the reply
    unusable, so it is asked again. The last attempt keeps the book rather than lose it: it drops repeats, tops
    the list up from the titles of the node's earlier replies (``pool``, ``pool_title``), prefers strong titles
    to weak ones, and shortens rambling ones; only too few distinct titles still fail.
    """
    title, items = extract_titles(text)
    if fixed and items[: len(fixed)] != list(fixed):
        fixed_norms = {norm(x) for x in fixed}
        items = list(fixed) + [x for x in items if norm(x) not in fixed_norms]
    if fixed_title:
        title = fixed_title
    if not strict:
        title = _shorten(title) if title else (_shorten(pool_title) if pool_title else None)
        items = _salvage(items, pool, fixed, avoid | ({norm(title)} if title else set()), n, taken)
        if not items:
            raise ValueError(f"expected {n} titles, got none")
        # Fewer than asked is a smaller chapter, not a lost book (the reply and the node's earlier ones offered
        # no more distinct titles).
        return Titles(title, tuple(items[:n]))
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
    taken: frozenset[str] = frozenset(),
) -> list[str]:
    """Distinct titles for a node's last attempt: fixed ones first, then strong ones. Weak ones (debris, a copy
    of a parent) only when there is no strong one at all: a chapter with fewer sections reads better than one
    padded with debris, but a node with no title at all would lose its part of the book."""
    out = list(fixed)
    seen = {norm(x) for x in out}
    candidates = [_shorten(x) for x in [*items[len(fixed):], *pool]]
    for allow_weak in (False, True):
        if allow_weak and len(out) > len(fixed):
            break
        for x in candidates:
            k = norm(x)
            if len(out) >= n:
                return out
            if not k or k in seen or (not allow_weak and weak_title(x, avoid, taken)):
                continue
            seen.add(k)
            out.append(x)
    return out


def _shorten(title: str) -> str:
    words = title.split()[:MAX_TITLE_WORDS]
    out = " ".join(words)
    return out if len(out) <= MAX_TITLE_CHARS else out[: MAX_TITLE_CHARS - 1].rstrip() + "…"


# --------------------------------------------------------------------------------------------------------------
# Incremental parsing of a streamed planning reply.


class TitleStream:
    """Feed it a planning reply chunk by chunk; ``title`` and ``items`` grow as titles become *complete*.

    A JSON string counts once its closing quote has arrived; a numbered or bulleted line once its newline has
    (so the last line of a text reply only counts when the reply ends, through :func:`parse_titles`). Titles are
    cleaned exactly as :func:`extract_titles` cleans them, so for a reply that ends up usable, ``items`` is a
    prefix of the final list. Understood shapes: an object whose "title" is a string and whose "items" is an
    array of strings (keys in any order, other keys skipped), a bare array of strings, or text lines ("Title: X",
    "1. A"). Anything else sets ``stalled``: no more titles from this reply until it is complete.
    """

    __slots__ = ("_key", "_level", "_line_start", "_stack", "_want_key", "buf", "i", "items", "mode", "stalled",
                 "title")

    def __init__(self) -> None:
        self.buf = ""
        self.i = 0  # next unread character of buf
        self.mode: str | None = None  # None (not yet known), "json" or "text"
        self.title: str | None = None
        self.items: list[str] = []
        self.stalled = False
        self._stack: list[str] = []  # JSON containers: "o" object, "a" array
        self._key: list[str | None] = []  # per container: the key whose value comes next (objects)
        self._want_key: list[bool] = []  # per container: an object expects a key (not a value) next
        self._line_start = 0
        self._level: tuple[int, str] | None = None  # text mode: (indent, marker kind) of the list's lines

    def feed(self, text: str) -> None:
        if self.stalled:
            return
        self.buf += text
        while self.mode is None:
            rest = self.buf.lstrip()
            if not rest:
                return
            if rest.startswith("```"):  # a code fence opening: skip its whole line
                nl = rest.find("\n")
                if nl < 0:
                    return
                self.buf = rest[nl + 1:]
                continue
            self.mode = "json" if rest[0] in "{[" else "text"
            self.i = self._line_start = len(self.buf) - len(rest)
        if self.mode == "json":
            self._json()
        else:
            self._text()

    # -- text: one complete line at a time ---------------------------------------------------------------------
    def _text(self) -> None:
        buf = self.buf
        while True:
            nl = buf.find("\n", self._line_start)
            if nl < 0:
                return
            line = buf[self._line_start:nl]
            self._line_start = nl + 1
            s = line.strip()
            if not s or s.startswith("```"):
                continue
            tm = _TITLE_LINE.match(line)
            if tm:
                if self.title is None:
                    self.title = clean_title(tm.group(1)) or None
                continue
            m = _LIST_LINE.match(line)
            if m:
                indent, kind = _indent(m.group("indent")), _marker_kind(m.group("marker"))
                if kind == "bullet":
                    # Bullets may be notes around a numbered list (the final parse decides): never commit one
                    # while streaming; a bulleted list's children start when its reply is complete.
                    if self._level is None or indent <= self._level[0]:
                        self.stalled = True
                        return
                    continue
                if self._level is None:
                    self._level = (indent, kind)  # the first list line sets the list's indent and marker
                if indent > self._level[0]:
                    continue  # a sub-bullet under a title: not a title
                if (indent, kind) != self._level:
                    self.stalled = True  # a list of another shape: leave it to the final parse
                    return
                t = clean_title(m.group("text"))
                if t:
                    self.items.append(t)
            elif self.items:
                # prose after the list: the final parse still takes the list; nothing more to start
                self.stalled = True
                return

    # -- JSON: a small tokenizer that only ever consumes complete tokens ---------------------------------------
    def _json(self) -> None:
        buf = self.buf
        n = len(buf)
        i = self.i
        stack, keys, want_key = self._stack, self._key, self._want_key
        while i < n:
            c = buf[i]
            if c in " \t\r\n,:":
                if c == ":" and stack and stack[-1] == "o":
                    want_key[-1] = False
                i += 1
                continue
            if c == '"':
                j = i + 1
                while True:
                    j = buf.find('"', j)
                    if j < 0:
                        self.i = i
                        return  # incomplete string: wait for more
                    k = j - 1
                    while buf[k] == "\\":
                        k -= 1
                    if (j - 1 - k) % 2 == 0:
                        break
                    j += 1
                try:
                    value = orjson.loads(buf[i:j + 1])
                except orjson.JSONDecodeError:
                    self.stalled = True
                    return
                i = j + 1
                self._string(value)
                if self.stalled:
                    return
                continue
            if c in "{[":
                self._open("o" if c == "{" else "a")
                i += 1
                continue
            if c in "}]":
                if not stack:
                    self.stalled = True
                    return
                stack.pop()
                keys.pop()
                want_key.pop()
                self._value_done()
                i += 1
                if not stack:  # the top-level value is complete
                    self.stalled = True
                    self.i = i
                    return
                continue
            # a bare literal (number, true, false, null): complete once a delimiter follows it
            j = i
            while j < n and buf[j] not in " \t\r\n,:}]":
                j += 1
            if j >= n:
                self.i = i
                return
            if self._in_items():
                self.stalled = True  # a non-string title: positions would no longer be certain
                return
            self._value_done()
            i = j
        self.i = i

    def _in_items(self) -> bool:
        st = self._stack
        if st == ["a"]:
            return True
        return len(st) == 2 and st[0] == "o" and st[1] == "a" and self._key[0] == "items"

    def _open(self, kind: str) -> None:
        if self._stack and self._in_items():
            self.stalled = True  # nested containers inside items: not a list of titles
            return
        self._stack.append(kind)
        self._key.append(None)
        self._want_key.append(kind == "o")

    def _string(self, value: str) -> None:
        st = self._stack
        if not st:
            self.stalled = True
            return
        if st[-1] == "o" and self._want_key[-1]:
            self._key[-1] = value
            return
        if self._in_items():
            t = clean_title(value)
            if t:
                self.items.append(t)
        elif len(st) == 1 and st[0] == "o" and self._key[0] == "title":
            self.title = clean_title(value) or None
        self._value_done()

    def _value_done(self) -> None:
        if self._stack and self._stack[-1] == "o":  # the value of an object's key is complete: a key comes next
            self._want_key[-1] = True
            self._key[-1] = None


class _Expansion:
    """One planning node's streamed expansion: commits titles from its reply as they complete and starts children.

    The consistency rule (why early children are never wrong):

    * A title is *committed* when a child is started from it. Committed titles are final: :func:`parse_titles`
      puts them first in the node's list whatever a later reply says, and the node's book title is committed with
      its first child (children's prompts carry it).
    * Titles are committed strictly in order, only while the reply is still plausible: index < N, not a duplicate
      of a committed title (a duplicate makes the reply unusable, so we stop there), and, in a re-asked reply, only
      after that reply has repeated every committed title in place. Anything else stops early starts for that
      attempt; the remaining children start when the node's final list is known.
    * A re-asked reply is asked to keep the committed titles. If it changes its mind anyway, its new titles fill
      the positions after the committed ones (dropping any that repeat them), so a started child is never
      cancelled, renamed or duplicated.

    When every reply is usable at the first attempt (the normal case), this is just "start each child the moment
    its title streams past", and the outline is exactly what strict mode makes from the same prompts.
    """

    def __init__(
        self,
        n: int,
        want_title: bool,
        start_child: Callable[[int, str, str | None], None] | None,
        avoid: frozenset[str] = frozenset(),
        on_commit: Callable[[str | None, list[str]], None] | None = None,
    ):
        self.n = n
        self.on_commit = on_commit  # (book title, committed titles) -> None: journals them before the child starts
        self.avoid = avoid  # normalised ancestor titles: a child repeating one is not started (see parse_titles)
        # Titles used anywhere in the outline so far (shared by every node of a planner whose profile wants a
        # distinct outline; empty otherwise): a small model offers the same few titles at every level.
        self.taken: set[str] = set()
        self.attempts = 0
        self.want_title = want_title
        self.start_child = start_child  # (index, title, book title) -> None; None in strict mode
        self.committed: list[str] = []
        self.norms: set[str] = set()
        self.title: str | None = None
        self.stream: TitleStream | None = None
        self.matched = 0
        self.following = False
        self.t_first_child: float | None = None
        self.unusable = 0  # replies of this node that failed validation
        self.pool: list[str] = []  # every title its replies offered, for the last attempt (see parse_titles)
        self.pool_title: str | None = None

    def new_attempt(self) -> None:
        self.attempts += 1
        self.stream = TitleStream()
        self.matched = 0
        self.following = self.start_child is not None and len(self.committed) < self.n

    def on_delta(self, text: str) -> None:
        if not self.following:
            return
        try:
            self._advance(text)
        except Exception:
            self.following = False

    def _advance(self, text: str) -> None:
        s = self.stream
        assert s is not None
        s.feed(text)
        if self.want_title and self.title is None and s.title is None:
            return  # children need the book title first
        items = s.items
        while self.matched < len(items):
            idx = self.matched
            t = items[idx]
            if idx < len(self.committed):
                if t != self.committed[idx]:
                    self.following = False
                    return
                self.matched += 1
                continue
            if idx >= self.n:
                self.following = False
                return
            k = norm(t)
            if k in self.norms:
                self.following = False
                return
            if self.want_title and self.title is None:
                self.title = s.title
            if weak_title(t, self.avoid | ({norm(self.title)} if self.title else set()), self.taken - self.norms):
                self.following = False
                return
            self.committed.append(t)
            self.norms.add(k)
            self.taken.add(k)
            self.matched += 1
            if self.on_commit is not None:
                self.on_commit(self.title, self.committed)
            if self.t_first_child is None:
                self.t_first_child = time.monotonic()
            assert self.start_child is not None
            self.start_child(idx, t, self.title)
        if s.stalled:
            self.following = False

    def restore(self, title: str | None, items: tuple[str, ...]) -> None:
        """Take the titles an earlier run committed for this node: they are final (their children exist)."""
        self.title = title
        self.committed = list(items[: self.n])
        self.norms = {norm(t) for t in self.committed}

    def retry_note(self) -> str:
        if not self.committed:
            return ""
        keep = "; ".join(f"{i}. {t}" for i, t in enumerate(self.committed, 1))
        book = f' Keep the book title "{self.title}".' if self.title else ""
        return f"Keep these first {len(self.committed)} titles unchanged, in this order: {keep}.{book}"


def _keep(titles: Titles) -> dict[str, Any]:
    return {"title": titles.title, "items": list(titles.items)}


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


SectionCallback = Callable[[str, str, str, str, int, str], None]


class Planner:
    """``journal`` (optional): where titles committed while a reply streams are recorded, and where a rerun finds
    them, so a node re-planned after a kill keeps the titles whose children (sections) already exist."""

    def __init__(self, dispatcher: Dispatcher, prompt: str, settings, emit, templates: str | None = None,
                 journal: Any = None, profile: Profile | None = None):
        self.d = dispatcher
        self.journal = journal
        # How the model is asked (sampling, system message, JSON or few-shot lists); without one, the reference
        # profile at the job's temperature.
        self.p = profile or replace(PROFILES["reference"], temperature=settings.temperature or 0.0)
        self.prompt = prompt
        self.fallback_title = book_title_from_prompt(prompt)
        self.taken: set[str] = {norm(self.fallback_title)}  # see _Expansion.taken
        self.s = settings
        self.emit = emit
        self.templates = templates
        self.level_requests = [0, 0, 0]
        self.t_titles_known: float | None = None
        self.t_first_section: float | None = None  # when the first section was handed to the runner
        # A dispatcher wrapper without the per-call on_delta hook still works: children then start when their
        # parent's reply is complete (node-level pipelining) instead of as its titles stream.
        self._streams = _accepts(dispatcher.run, "on_delta")

    def _temperature(self, exp: _Expansion) -> float:
        """The job's temperature, raised to RETRY_TEMPERATURE once a reply was unusable: at temperature 0 a
        model answers a re-ask with the same reply (a small model repeating a title would fail every attempt),
        so a re-ask must be allowed to differ. Transient errors (connection, 5xx) keep the job's temperature."""
        base = self.p.temperature if self.p.plan_temperature is None else self.p.plan_temperature
        if exp.unusable:
            return max(base, min(1.0, RETRY_TEMPERATURE + 0.1 * (exp.unusable - 1)))
        return base

    def _request(self, name: str, n: int, want_title: bool, exp: _Expansion, **values):
        def build(client: BackendClient, attempt: int) -> dict:
            exp.new_attempt()  # called at the start of every attempt: the stream parser starts afresh
            if self.p.planning == "list":
                return self._list_request(client, name, n, exp, values)
            use_json = client.json_schema_ok is not False
            note = ""
            keep = exp.retry_note()
            if attempt > 1:
                note = f"Give exactly {n} distinct titles."
            if keep:  # a re-ask, or a rerun resuming a node whose first titles were committed before a kill
                note = f"{note} {keep}".strip()
            text = render(name, self.templates, json=use_json, n=n, retry_note=note, **values)
            return client.body(
                self.p.messages(text),
                max_tokens=self.s.plan_max_tokens,
                temperature=self._temperature(exp),
                schema=list_schema(n, want_title) if use_json else None,
                sampling=self.p.sampling(),
            )

        def validate(reply: Reply) -> Titles:
            # The last attempt (or, with the profile's bounded re-asks, the reply after them) takes the reply as
            # well as it can — weak titles, fewer titles — rather than lose the book or spend more requests.
            strict = exp.attempts < self.s.attempts and (
                self.p.plan_reasks is None or exp.unusable < self.p.plan_reasks
            )
            offered_title, offered = extract_titles(reply.text)
            try:
                return parse_titles(
                    reply.text, n, want_title, tuple(exp.committed), exp.title, exp.avoid, strict=strict,
                    taken=frozenset(exp.taken - exp.norms),
                    pool=tuple(exp.pool), pool_title=exp.pool_title,
                )
            except ValueError:
                exp.unusable += 1
                exp.pool.extend(offered)
                exp.pool_title = exp.pool_title or offered_title
                raise

        return build, validate

    def _list_request(self, client: BackendClient, name: str, n: int, exp: _Expansion, values: dict) -> dict:
        """A few-shot plain-list request (profile planning "list"): one worked example, then this node's request.
        The list's length bounds max_tokens, so a model looping on one line stops early."""
        kind = {"book": "book", "part": "part", "chapter": "chapter"}[name]
        book = book_phrase(values.get("book") or self.fallback_title)
        title = values.get(kind, "") if kind != "book" else ""
        ask = n + self.p.plan_extra
        return client.body(
            few_shot_messages(kind, ask, book, title, self.templates, self.p.system),
            max_tokens=min(self.s.plan_max_tokens, 16 * ask + 48),
            temperature=self._temperature(exp),
            sampling=self.p.sampling(),
        )

    async def _node(
        self,
        path: str,
        kind: str,
        label: str,
        name: str,
        n: int,
        want_title: bool,
        start_child: Callable[[int, str, str | None], None] | None = None,
        **values,
    ) -> tuple[Titles, int]:
        """Plan one node. Returns its titles and how many children were already started from its stream."""
        ancestors = [values.get(k) for k in ("book", "part", "chapter")]
        on_commit = None
        if self.journal is not None:
            def on_commit(book_title: str | None, items: list[str]) -> None:
                self.journal.commit_titles(path, label, book_title, items)
        exp = _Expansion(n, want_title, start_child, frozenset(norm(a) for a in ancestors if a), on_commit)
        if self.p.distinct_outline:
            exp.taken = self.taken
        build, validate = self._request(name, n, want_title, exp, **values)
        self.level_requests[len(path.split(".")) if path else 0] += 1
        kw = {"on_delta": exp.on_delta} if start_child is not None and self._streams else {}
        restored = None
        if self.journal is not None and self.journal.get(path, kind, label) is None:
            restored = self.journal.committed(path, label)
        if restored is not None and restored.items:
            # An earlier run committed these titles and started their children before it stopped: keep them
            # (the sections written for them are in the journal under these very titles) and start them now.
            exp.restore(restored.title, restored.items)
            if start_child is not None:
                for i, t in enumerate(exp.committed):
                    start_child(i, t, exp.title)

        def restore(stored) -> Titles | None:
            value = stored.value
            if isinstance(value, dict) and isinstance(value.get("items"), list) and 1 <= len(value["items"]) <= n:
                # as accepted, fewer titles included (a node's last attempt may keep fewer than asked)
                return Titles(value.get("title"), tuple(str(x) for x in value["items"]))
            if value is None:  # a schema-1 journal: parse the stored reply, without touching this run's re-asks
                try:
                    return parse_titles(stored.text, n, want_title, avoid=exp.avoid)
                except ValueError:
                    return None
            return None

        out = await self.d.run(
            path, kind, label, build, validate, priority=(0, 0),
            **kw, **({"restore": restore, "keep": _keep} if self.journal is not None else {}),
        )
        if out.value is not None and self.p.distinct_outline:
            self.taken.update(norm(t) for t in out.value.items)
        if out.value is None:
            short = label if len(label) <= 80 else label[:77] + "..."
            where = f"node {path!r} ({kind} {short!r})" if path else "the book node"
            raise PlanError(f"the outline could not be made: {where} failed {out.attempts} attempts: {out.reply.error}")
        self.emit(NodeFinished(path, kind, label, out.reply, time.monotonic()))
        return out.value, len(exp.committed)

    async def plan(
        self,
        on_sections: Callable[[str, str, str, str, tuple[str, ...]], Awaitable[None] | None] | None = None,
        on_section: SectionCallback | None = None,
    ) -> Outline:
        """Make the outline.

        In pipeline mode ``on_section(book, part, chapter_path, chapter, index, title)`` (``index`` 1-based) is
        called, synchronously, the moment each section title is known, possibly while its chapter's list is still
        streaming; or, when only ``on_sections(book, part, chapter_path, chapter, titles)`` is given, once per
        chapter with its whole list. Strict mode calls neither: the caller writes from the returned outline.
        """
        s = self.s
        pipeline = bool(s.pipeline)
        parts: dict[int, str] = {}
        chapters: dict[tuple[int, int], str] = {}
        sections: dict[tuple[int, int], tuple[str, ...]] = {}
        chapter_lists: dict[int, tuple[str, ...]] = {}
        book_box: dict[str, str] = {}
        parts_done = {"n": 0}

        async def plan_chapter(pi: int, ci: int) -> None:
            book, part, chapter = book_box["title"], parts[pi], chapters[(pi, ci)]
            cpath = f"{pi + 1}.{ci + 1}"
            before = [chapters[(pi, j)] for j in range(ci)]

            def start_section(si: int, title: str, _book: str | None) -> None:
                if self.t_first_section is None:
                    self.t_first_section = time.monotonic()
                assert on_section is not None
                on_section(book, part, cpath, chapter, si + 1, title)

            stream = start_section if (pipeline and on_section is not None) else None
            got, started = await self._node(
                cpath, "chapter", chapter, "chapter", s.sections, False, stream,
                request=self.prompt, book=book, part=part, chapter=chapter, index=ci + 1, count=s.chapters,
                siblings=before,
            )
            sections[(pi, ci)] = got.items
            if not pipeline:
                return
            if stream is not None:
                for si in range(started, len(got.items)):
                    stream(si, got.items[si], None)
            elif on_sections is not None:
                if self.t_first_section is None:
                    self.t_first_section = time.monotonic()
                r = on_sections(book, part, cpath, chapter, got.items)
                if r is not None:
                    await r

        async def plan_part(pi: int, tg: anyio.abc.TaskGroup | None) -> None:
            book, part = book_box["title"], parts[pi]
            before = [parts[j] for j in range(pi)]

            def start_chapter(ci: int, title: str, _book: str | None) -> None:
                chapters[(pi, ci)] = title
                assert tg is not None
                tg.start_soon(plan_chapter, pi, ci)

            got, started = await self._node(
                f"{pi + 1}", "part", part, "part", s.chapters, False, start_chapter if tg is not None else None,
                request=self.prompt, book=book, part=part, index=pi + 1, count=s.parts, siblings=before,
            )
            chapter_lists[pi] = got.items
            # strict mode starts no child while a reply streams, even for titles restored from the journal
            for ci in range(started if tg is not None else 0, len(got.items)):
                if tg is not None:
                    start_chapter(ci, got.items[ci], None)
                else:
                    chapters[(pi, ci)] = got.items[ci]
            parts_done["n"] += 1
            if tg is not None and parts_done["n"] == len(parts):
                self.emit(LevelPlanned(2, len(parts) * s.chapters, time.monotonic()))

        if pipeline:
            async with anyio.create_task_group() as tg:

                def start_part(pi: int, title: str, book: str | None) -> None:
                    parts[pi] = title
                    if "title" not in book_box:
                        book_box["title"] = book or self.fallback_title
                    tg.start_soon(plan_part, pi, tg)

                root, started = await self._node(
                    "", "book", self.prompt, "book", s.parts, self.p.planning != "list", start_part, request=self.prompt
                )
                book_box.setdefault("title", root.title or self.fallback_title)
                for pi in range(started, len(root.items)):
                    start_part(pi, root.items[pi], root.title)
                self.emit(LevelPlanned(1, len(root.items), time.monotonic()))
        else:
            root, _ = await self._node("", "book", self.prompt, "book", s.parts, self.p.planning != "list",
                                       request=self.prompt)
            book_box["title"] = root.title or self.fallback_title
            for pi, t in enumerate(root.items):
                parts[pi] = t
            self.emit(LevelPlanned(1, len(parts), time.monotonic()))
            async with anyio.create_task_group() as tg:
                for pi in range(len(parts)):
                    tg.start_soon(plan_part, pi, None)
            self.emit(LevelPlanned(2, len(chapters), time.monotonic()))
            async with anyio.create_task_group() as tg:
                for pi in range(len(parts)):
                    for ci in range(len(chapter_lists[pi])):
                        tg.start_soon(plan_chapter, pi, ci)
        self.t_titles_known = time.monotonic()
        self.emit(LevelPlanned(3, sum(len(v) for v in sections.values()), self.t_titles_known))
        return Outline(
            title=book_box["title"],
            parts=tuple(
                Part(
                    parts[pi],
                    tuple(Chapter(chapters[(pi, ci)], sections[(pi, ci)]) for ci in range(len(chapter_lists[pi]))),
                )
                for pi in range(len(parts))
            ),
        )
