"""The one code-fence grammar: what opens a fenced code block, what closes it, and closing one left open.

CommonMark's rule, read line by line at the left margin: a fence is a run of 3 or more backticks or 3 or more
tildes, indented at most 3 spaces; a backtick fence's info string holds no backtick (```` ```x``` ```` is inline
code, not a fence). It closes at a line of the same character, at least as long, indented at most 3 spaces and
followed by nothing but spaces or tabs (no info string). A line split off at ``"\\n"`` may keep the ``"\\r"`` of a
CRLF ending: it belongs to the line ending, not to the line. A line indented 4 spaces or more (or by a tab) is no
fence here: at the margin it is indented code; inside a list item the container decides, which only a full parse
(markdown-it) knows.

Every module that tells code from prose line by line (cut-back, the loop checks, the text scans, the book's
assembly, the planning replies, the HTML's structure in typeset/html.py, the code and overlap checks in
book/codecheck.py and book/overlap.py, and benchmarks/book_quality.py) reads fences with these; :func:`fenced_blocks`
gives each block with its info string and its lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "FENCE_OPEN", "FencedBlock", "close_open_fence", "closer", "closes", "fenced_blocks", "fenced_code",
    "is_fence_line",
]

# indent, mark, the rest of the line (the info string); a backtick mark is not followed by a backtick anywhere
FENCE_OPEN = re.compile(r"^( {0,3})(`{3,}(?!.*`)|~{3,})(.*)$")


@lru_cache(maxsize=64)
def closer(mark: str) -> re.Pattern[str]:
    """The pattern of a line that closes the fence opened with ``mark``: the same character, at least as many. A
    scan holds it for the block, so that a code line costs one regex match and no call of ours."""
    return re.compile(rf"^ {{0,3}}{re.escape(mark[0])}{{{len(mark)},}}[ \t]*\r?$")


def closes(line: str, mark: str) -> bool:
    """Does ``line`` close the fence opened with ``mark``?"""
    return closer(mark).match(line) is not None


def is_fence_line(line: str) -> bool:
    """Is ``line`` a fence line, one that opens a block or could close one (a bare mark opens as well)?"""
    return FENCE_OPEN.match(line) is not None


def _open_fence(text: str) -> tuple[str, str] | None:
    """(indent, mark) of the fence still open at the end of ``text``, None when every fence closed."""
    fence: tuple[str, str] | None = None
    close = None
    for line in text.split("\n"):
        if fence is None:
            m = FENCE_OPEN.match(line)
            if m:
                fence, close = (m.group(1), m.group(2)), closer(m.group(2))
        elif close is not None and close.match(line):
            fence = None
    return fence


def close_open_fence(text: str) -> str:
    """``text`` with a fence left open at its end (a reply cut at the token cap) closed, by a line of the opening
    mark at the opening's indent (a block inside a list item is closed inside it), so that whatever renders the
    text later does not swallow what follows into code. Text whose fences all close is returned as it is."""
    fence = _open_fence(text)
    return text if fence is None else text.rstrip("\n") + "\n" + fence[0] + fence[1]


def fenced_code(text: str) -> list[str]:
    """The code of every fenced block of ``text``, in order; a block never closed runs to the end of the text, as
    CommonMark reads it."""
    return [block.code for block in fenced_blocks(text)]


@dataclass(frozen=True, slots=True)
class FencedBlock:
    """One fenced code block of a text. Lines are counted from 1 over ``text.split("\\n")``.

    ``info``: the opening fence's info string, stripped (``"python title=x.py"``; ``""`` when bare). ``code``: the
    lines between the fences, joined by ``"\\n"``, as :func:`fenced_code` gives them (indentation kept, a CRLF's
    ``"\\r"`` too). ``line``: the opening fence's line, so the code's first line is ``line + 1``. ``end``: the
    closing fence's line, or the text's last line for a block never closed. ``closed``: whether a fence closed it.
    ``indent``: the opening fence's indentation (0 to 3 spaces), which CommonMark strips from each code line."""

    info: str
    code: str
    line: int
    end: int
    closed: bool
    indent: int


def fenced_blocks(text: str) -> list[FencedBlock]:
    """Every fenced block of ``text``, in order, with its info string, code and lines; a block never closed (a
    reply cut at the token cap) runs to the end of the text, as CommonMark reads it, with ``closed=False``."""
    out: list[FencedBlock] = []
    close: re.Pattern[str] | None = None  # the open block's closing line
    code: list[str] = []
    info, start, indent, number = "", 0, 0, 0
    for number, line in enumerate(text.split("\n"), 1):
        if close is None:
            m = FENCE_OPEN.match(line)
            if m:
                close, info, start, indent, code = closer(m.group(2)), m.group(3).strip(), number, len(m.group(1)), []
        elif close.match(line):
            out.append(FencedBlock(info, "\n".join(code), start, number, True, indent))
            close = None
        else:
            code.append(line)
    if close is not None:
        out.append(FencedBlock(info, "\n".join(code), start, number, False, indent))
    return out
