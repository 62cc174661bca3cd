"""A planning reply while it streams: its titles as they complete (:class:`TitleStream`), read by
:class:`.stream.Expansion`, which starts the node's children from them."""

from __future__ import annotations

import orjson

from ..book.fences import is_fence_line
from .titles import LIST_LINE, TITLE_LINE, clean_title, indent_width, marker_kind


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
            if rest[0] in "`~":  # perhaps a code fence opening: skip its whole line
                nl = rest.find("\n")
                if nl < 0:
                    return
                start = len(self.buf) - len(rest)
                if is_fence_line(self.buf[self.buf.rfind("\n", 0, start) + 1:start + nl]):
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
            if self._text_line(line):
                return

    def _text_line(self, line: str) -> bool:
        """Take one complete line of a text reply; True when the scan stops at it (``stalled``)."""
        if not line.strip() or is_fence_line(line):
            return False
        tm = TITLE_LINE.match(line)
        if tm:
            if self.title is None:
                self.title = clean_title(tm.group(1)) or None
            return False
        m = LIST_LINE.match(line)
        if m:
            return self._list_line(indent_width(m.group("indent")), marker_kind(m.group("marker")), m.group("text"))
        if self.items:
            # prose after the list: the final parse still takes the list; nothing more to start
            self.stalled = True
            return True
        return False

    def _list_line(self, indent: int, kind: str, text: str) -> bool:
        if kind == "bullet":
            # Bullets may be notes around a numbered list (the final parse decides): never commit one while
            # streaming; a bulleted list's children start when its reply is complete.
            if self._level is None or indent <= self._level[0]:
                self.stalled = True
                return True
            return False
        if self._level is None:
            self._level = (indent, kind)  # the first list line sets the list's indent and marker
        if indent > self._level[0]:
            return False  # a sub-bullet under a title: not a title
        if (indent, kind) != self._level:
            self.stalled = True  # a list of another shape: leave it to the final parse
            return True
        t = clean_title(text)
        if t:
            self.items.append(t)
        return False

    # -- JSON: a small tokenizer that only ever consumes complete tokens ---------------------------------------
    # Each token's method returns the index after the token, or -1 when the scan stops there: ``stalled``, or
    # waiting for more of the reply (``i`` then says where to go on from).
    def _json(self) -> None:
        buf = self.buf
        n = len(buf)
        i = self.i
        stack, want_key = self._stack, self._want_key
        while i < n:
            c = buf[i]
            if c in " \t\r\n,:":
                if c == ":" and stack and stack[-1] == "o":
                    want_key[-1] = False
                i += 1
                continue
            if c == '"':
                i = self._json_string(buf, i)
            elif c in "{[":
                self._open("o" if c == "{" else "a")
                i = -1 if self.stalled else i + 1  # a container inside the items: nothing after it is titles
            elif c in "}]":
                i = self._json_close(i)
            else:
                i = self._json_literal(buf, i)
            if i < 0:
                return
        self.i = i

    def _json_string(self, buf: str, i: int) -> int:
        j = i + 1
        while True:
            j = buf.find('"', j)
            if j < 0:
                self.i = i
                return -1  # incomplete string: wait for more
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
            return -1
        self._string(value)
        return -1 if self.stalled else j + 1

    def _json_close(self, i: int) -> int:
        stack = self._stack
        if not stack:
            self.stalled = True
            return -1
        stack.pop()
        self._key.pop()
        self._want_key.pop()
        self._value_done()
        if not stack:  # the top-level value is complete
            self.stalled = True
            self.i = i + 1
            return -1
        return i + 1

    def _json_literal(self, buf: str, i: int) -> int:
        """A bare literal (number, true, false, null): complete once a delimiter follows it."""
        n = len(buf)
        j = i
        while j < n and buf[j] not in " \t\r\n,:}]":
            j += 1
        if j >= n:
            self.i = i
            return -1
        if self._in_items():
            self.stalled = True  # a non-string title: positions would no longer be certain
            return -1
        self._value_done()
        return j

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
