"""A section the token cap stopped (finish_reason "length"), cut back so book.md never stops mid-word.

Pure: no I/O, no clock. :func:`cut_back` ends the text after its last complete sentence, list item, table row or
closed code block; :func:`orchestrator.assemble.section_body` prints what it leaves.
"""

from __future__ import annotations

import ast
import re

from .fences import FENCE_OPEN, close_open_fence, closer

__all__ = ["complete_part", "cut_back"]

# A sentence ends at . ! ? or … followed by closing quotes, brackets or emphasis, then a space or the line's end.
_SENTENCE_END = re.compile(r"[.!?…][\"'”’»)\]*_`]*(?=\s|$)")
# Abbreviations whose period does not end a sentence ("e.g. a cache").
_ABBREVIATIONS = frozenset({"e.g", "i.e", "vs", "cf", "mr", "mrs", "ms", "dr", "st", "no", "fig", "approx", "incl",
                            "al", "resp", "eq", "ca"})
_ATX = re.compile(r"^\s{0,3}#{1,6}(?:\s|$)")
_BOLD_LINE = re.compile(r"^\s*(?:\*\*|__)([^*_]+)(?:\*\*|__):?\s*$")
_SETEXT_UNDERLINE = re.compile(r"^\s{0,3}(?:=+|-+)\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+\S")
_LIST_MARKER = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")
# A code line that goes on in the next one: an operator, an opening bracket, a comma or a backslash at its end.
_CONTINUES = re.compile(r"(?:[,\\(\[{=+\-*/%&|<>:.]|&&|\|\||->|=>)\s*$")


def _sentence_ends(line: str) -> list[int]:
    """Offsets in ``line`` just after each sentence end; a list marker ("1.") and abbreviations are not ends."""
    body_start = m.end() if (m := _LIST_MARKER.match(line)) else 0
    ends = []
    for m in _SENTENCE_END.finditer(line, body_start):
        before = line[body_start : m.start()].split()
        word = before[-1].lower().lstrip("(\"'“‘*_") if before else ""
        if not word or word in _ABBREVIATIONS:
            continue
        ends.append(m.end())
    return ends


def _balanced(code: str) -> bool:
    depth = 0
    for ch in code:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
    return depth == 0


def _code_stands_alone(lang: str, lines: list[str]) -> bool:
    """Whether the code written before the cap reads as a whole snippet: Python that parses; other code with
    balanced brackets whose last line does not go on."""
    code = "\n".join(lines)
    if not code.strip():
        return False
    if lang in ("python", "py", "python3", "py3"):
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        return True
    return _balanced(code) and not _CONTINUES.search(lines[-1].rstrip())


def _is_heading(lines: list[str], i: int) -> bool:
    """An ATX heading, a setext heading's text, or a bold-only line that is not a sentence ("**Example**")."""
    line = lines[i]
    if _ATX.match(line):
        return True
    if i + 1 < len(lines) and _SETEXT_UNDERLINE.match(lines[i + 1]) and line.strip() and not _LIST_ITEM.match(line):
        return True
    m = _BOLD_LINE.match(line)
    return m is not None and not m.group(1).rstrip().endswith((".", "!", "?", "…"))


def _drop_trailing_headings(text: str) -> str:
    """``text`` without the headings (and blank lines and rules) at its end: a heading with nothing under it."""
    lines = text.rstrip().split("\n")
    while lines:
        last = lines[-1]
        if not last.strip() or _ATX.match(last) or _is_heading(lines, len(lines) - 1):
            lines.pop()
        elif _SETEXT_UNDERLINE.match(last):
            lines.pop()  # a rule, or a setext heading's underline (its text goes next round)
            if lines and lines[-1].strip() and not _LIST_ITEM.match(lines[-1]):
                lines.pop()
        else:
            break
    return "\n".join(lines).rstrip()


def cut_back(text: str) -> str:
    """A section stopped by the token cap (finish_reason "length"), cut back so it ends cleanly.

    It ends after the last complete sentence (". ! ? …", closing quotes or brackets after them; "e.g." and the
    like are not ends), complete list item, table row or closed code block, whichever comes last. The last line is
    the one the cap cut, so it is complete only up to a sentence end inside it.

    When the cap fell inside a code block, the block is kept up to its last complete line, and its fence closed,
    only when that code stands alone (Python that parses; other code with balanced brackets and a last line that
    does not go on); otherwise the cut is made before the block, because half a function reads worse than none.
    The lead-in that announced the dropped block ("Consider the following code:") goes with it, since a lead-in
    is not a sentence end.

    Headings left with nothing under them at the end are dropped. When there is no complete sentence, item, row
    or block at all, the text is kept as it is (only its trailing headings dropped and an open fence closed):
    something is better than nothing.
    """
    cut = complete_part(text)
    return cut if cut is not None else close_open_fence(_drop_trailing_headings(text) or text.rstrip())


def complete_part(text: str) -> str | None:
    """What :func:`cut_back` keeps of ``text`` when it holds a complete sentence, list item, table row or code
    block; None when it holds none (where cut_back keeps the text as it is)."""
    lines = text.split("\n")
    complete_upto = len(lines) if text.endswith("\n") else len(lines) - 1  # lines[i] complete iff i < complete_upto
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)

    best: int | None = None  # offset to cut at
    fence: tuple[str, str, str, int] | None = None  # (indent, mark, language, first code line)
    close = None  # the open block's closing line
    in_table = False
    for i, line in enumerate(lines):
        if fence is not None:
            if close is not None and close.match(line):
                best, fence = starts[i] + len(line.rstrip()), None  # a closed block, even on the cut line
            continue
        m = FENCE_OPEN.match(line)
        if m:
            info = m.group(3).strip().split()
            fence = (m.group(1), m.group(2), info[0].lower() if info else "", i + 1)
            close = closer(m.group(2))
            in_table = False
            continue
        end, in_table = _unit_end(lines, i, i < complete_upto, in_table)
        if end is not None:
            best = starts[i] + end
    closing = ""  # a fence to append after the cut
    if fence is not None:
        indent, mark, lang, first = fence
        last = _last_code_line(lines[first:complete_upto], lang)
        if last is not None:
            last += first
            best, closing = starts[last] + len(lines[last].rstrip()), "\n" + indent + mark
    if best is None:
        return None
    cut = text[:best] + closing
    return _drop_trailing_headings(cut) or cut.rstrip()


def _unit_end(lines: list[str], i: int, complete: bool, in_table: bool) -> tuple[int | None, bool]:
    """Where the last complete sentence, list item or table row of ``lines[i]`` (a line outside code) ends, as an
    offset in the line (None: nowhere), and whether a table goes on after it. ``complete``: the cap did not cut
    the line."""
    line = lines[i]
    stripped = line.strip()
    if stripped.startswith("|"):
        if _TABLE_SEPARATOR.match(stripped):
            return None, True
        return (len(line.rstrip()) if in_table and complete else None), in_table
    if not stripped or _is_heading(lines, i):
        return None, False
    if _LIST_ITEM.match(line) and complete:
        return len(line.rstrip()), False
    ends = _sentence_ends(line)
    return (ends[-1] if ends else None), False


def _last_code_line(body: list[str], lang: str) -> int | None:
    """The index in ``body`` (a block's complete lines, its fence never closed; trailing blank ones are popped) of
    the last line to keep, when the code up to it stands alone; None: the block goes."""
    while body and not body[-1].strip():
        body.pop()
    if body and _code_stands_alone(lang, body):
        return len(body) - 1
    return None
