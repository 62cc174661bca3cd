"""Section text -> CodeReport: do the fenced code blocks of a section parse, in the languages we have a parser for?

Pure: no I/O, no clock. Blocks are found with the project's one fence grammar (:func:`.fences.fenced_blocks`:
CommonMark fences at the left margin; a fence indented 4 spaces or more, in a nested list, is not seen). Lines are
counted from 1 over the section's text, ``text.split("\\n")``.

- Language: the first word of the info string, lower-cased; a Pandoc attribute block is tolerated
  (``{.python .numberLines}`` reads ``python``); ``none`` for a bare fence. Tags of one language count together
  under its name: ``python``/``py``/``python3``/``py3`` as ``python``, ``json``, ``toml``, ``yaml``/``yml`` as
  ``yaml``; any other tag counts under itself.
- Parsers at hand: Python (``ast.parse``, which checks syntax only: a top-level ``return`` or ``await`` passes, and
  syntax newer than the interpreter running the check fails), JSON (``json.loads``), TOML (``tomllib.loads``), YAML
  (PyYAML's ``compose_all``: every document of a stream, syntax only, like ``ast.parse``, so an application's own
  tags such as CloudFormation's ``!Ref`` and a template's ``{{ value }}`` keys, which only constructing the values
  would refuse, pass); a YAML block holding template directives (Helm's ``{{- if }}``, Jinja's ``{% for %}``, a
  line that is a ``{{ ... }}`` alone) is a template, seen but not checked. Untagged and unknown blocks are seen but
  not checked.
- Each code line loses up to as many leading spaces as its opening fence is indented (CommonMark's rule, so a block
  in a list item indented at most 3 spaces parses); a CRLF's ``"\\r"`` is dropped.
- A Python block holding a ``>>>`` prompt is a REPL transcript (as ``defects`` counts it): only its ``>>>``/``...``
  lines are parsed, prompts stripped; output lines are skipped. Anything else tagged Python (a shell session,
  pseudo-code) is parsed as it is and reported broken when it does not parse: that is a defect of the text.
- Cut: a block never closed runs to the end of the section, which happens when the reply stopped at the token cap.
  Its end is missing through no error of the model's code, so it is counted as ``cut``, not parsed, and never
  ``broken`` (an unclosed fence is reported by ``defects`` as such).

``checked`` counts the closed blocks with a parser at hand; ``broken`` those of them that do not parse, each with a
:class:`BlockError`; :func:`repair_note` turns the errors into the paragraph of a re-ask, and :func:`mark_broken`
puts a note under each such block of the text book.md prints (a block still broken after its re-ask, or never
re-asked, is never printed as if it were good code).
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from .fences import fenced_blocks

__all__ = ["BlockError", "CodeReport", "LanguageCounts", "check_code", "language_of", "mark_broken", "repair_note"]

# tag -> the language it counts under; the languages with a parser are in _PARSERS
_CANONICAL = {
    "python": "python", "py": "python", "python3": "python", "py3": "python",
    "json": "json", "toml": "toml", "yaml": "yaml", "yml": "yaml",
}
_NAMES = {"python": "Python", "json": "JSON", "toml": "TOML", "yaml": "YAML"}  # as a re-ask names them
NOTED = 3  # errors repair_note spells out; the rest it counts
_TAG_END = re.compile(r"[,;{}]")
# A Helm or Jinja template tagged yaml: its directives ("{{- if .Values.x }}", "{% for %}") are the template's, and
# only its rendering is YAML, so it is seen but not checked (a "{{ value }}" in a value position parses: it is kept).
_YAML_TEMPLATE = re.compile(r"\{%|\{\{-|-\}\}|^\s*\{\{.*\}\}\s*$", re.MULTILINE)
_TOML_AT = re.compile(r"^(.*?) \(at (?:line (\d+), column \d+|end of document)\)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class BlockError:
    """A block that does not parse. ``language``: the language it counts under (``python``). ``line``: the section
    line the parser puts the error on (the block's first code line is ``block_line + 1``). ``message``: one line,
    the exception's class and message (``SyntaxError: invalid syntax``). ``block_line``: the opening fence's line."""

    language: str
    line: int
    message: str
    block_line: int


@dataclass(frozen=True, slots=True)
class LanguageCounts:
    """The blocks of one language: ``seen`` all of them, ``checked`` the closed ones with a parser at hand,
    ``broken`` those that do not parse, ``cut`` those never closed (the section stopped inside them)."""

    seen: int = 0
    checked: int = 0
    broken: int = 0
    cut: int = 0


@dataclass(frozen=True)
class CodeReport:
    """The code blocks of one section: the counts by language (in order of first appearance) and the errors, in
    order of the text."""

    languages: dict[str, LanguageCounts]
    errors: tuple[BlockError, ...]

    @property
    def seen(self) -> int:
        return sum(c.seen for c in self.languages.values())

    @property
    def checked(self) -> int:
        return sum(c.checked for c in self.languages.values())

    @property
    def broken(self) -> int:
        return sum(c.broken for c in self.languages.values())

    @property
    def cut(self) -> int:
        return sum(c.cut for c in self.languages.values())

    @property
    def ok(self) -> bool:
        """No block that was checked is broken."""
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        return {
            "languages": {lang: {"seen": c.seen, "checked": c.checked, "broken": c.broken, "cut": c.cut}
                          for lang, c in self.languages.items()},
            "errors": [{"language": e.language, "line": e.line, "message": e.message, "block_line": e.block_line}
                       for e in self.errors],
        }


def language_of(info: str) -> str:
    """The language a fence's info string tags its block with: the first word, lower-cased, with a Pandoc
    attribute block's braces and dot dropped (``{.Python .numberLines}`` -> ``python``), aliases folded
    (``py`` -> ``python``, ``yml`` -> ``yaml``); ``none`` when there is no tag."""
    tag = info.strip()
    if tag.startswith("{"):
        tag = tag[1:]
    words = tag.split()
    tag = _TAG_END.split(words[0])[0].lstrip(".").lower() if words else ""
    return _CANONICAL.get(tag, tag) if tag else "none"


def check_code(text: str) -> CodeReport:
    """Parse every closed fenced block of ``text`` whose language has a parser at hand (module docstring)."""
    counts: dict[str, list[int]] = {}  # language -> [seen, checked, broken, cut]
    errors: list[BlockError] = []
    for block in fenced_blocks(text):
        lang = language_of(block.info)
        count = counts.setdefault(lang, [0, 0, 0, 0])
        count[0] += 1
        if not block.closed:
            count[3] += 1
            continue
        parse = _PARSERS.get(lang)
        if parse is None or (lang == "yaml" and _YAML_TEMPLATE.search(block.code)):
            continue
        count[1] += 1
        found = parse(_code_lines(block.code, block.indent))
        if found is not None:
            count[2] += 1
            errors.append(BlockError(lang, block.line + found[0], found[1], block.line))
    return CodeReport({lang: LanguageCounts(*c) for lang, c in counts.items()}, tuple(errors))


def repair_note(errors: Sequence[BlockError]) -> str:
    """The paragraph a re-ask adds for the blocks that do not parse, ``""`` when none: each error (the first
    :data:`NOTED` by line; the rest counted) and what to do. The same errors in any order make the same note."""
    if not errors:
        return ""
    ordered = sorted(errors, key=lambda e: (e.block_line, e.line, e.language, e.message))
    parts = [f"The {_name(e.language)} block starting on line {e.block_line} does not parse: line {e.line}: "
             f"{_sentence(e.message)}" for e in ordered[:NOTED]]
    if len(ordered) > NOTED:
        more = len(ordered) - NOTED
        parts.append(f"{more} more block{'s' if more > 1 else ''} do{'' if more > 1 else 'es'} not parse either.")
    names = list(dict.fromkeys(_name(e.language) for e in ordered))
    if len(names) == 1:
        parts.append(f"Rewrite the section so that every {names[0]} block is valid {names[0]}.")
    else:
        listed = ", ".join(names[:-1]) + " and " + names[-1]
        parts.append(f"Rewrite the section so that every {listed} block is valid in its language.")
    return " ".join(parts)


def mark_broken(printed: str, errors: Sequence[BlockError], generated: str) -> str:
    """``printed`` with a one-line note under each block of ``generated`` that does not parse (``errors``:
    ``check_code(generated).errors``), as book.md prints it: a block quote naming the language, the line within the
    block and the parser's message (``> **Note:** the Python above does not parse (line 3: SyntaxError: invalid
    syntax).``), indented like the block's fence so that a block in a list item keeps its note inside the item.
    ``printed`` itself when there are no errors. Pure.

    ``printed`` is ``generated`` cut back and with its headings demoted: it holds a prefix of the blocks, in order,
    each with the same code, so block i of one is block i of the other. A block the model never closed is cut code,
    not broken code, and has no error: it gets no note, whatever closed it for printing."""
    if not errors:
        return printed
    index = {b.line: i for i, b in enumerate(fenced_blocks(generated))}
    blocks = fenced_blocks(printed)
    lines = printed.split("\n")
    for e in sorted(errors, key=lambda e: e.block_line, reverse=True):
        i = index[e.block_line]
        if i >= len(blocks):  # cut off before this block: not printed
            continue
        end, indent = blocks[i].end, blocks[i].indent
        where = f"line {e.line - e.block_line}: " if e.line > e.block_line else ""
        note = f"{' ' * indent}> **Note:** the {_name(e.language)} above does not parse ({where}{_escaped(e.message)})."
        # A block quote may follow a closing fence directly, and a list item ends it: no blank line there, which
        # would make a tight list loose; before a paragraph line one ends the quote (else the line joins it).
        after = [""] if end < len(lines) and lines[end].strip() and not _LIST_ITEM.match(lines[end]) else []
        lines[end:end] = [note, *after]
    return "\n".join(lines)


_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])(?:\s|$)")  # a line that starts a list item
# Markdown's inline punctuation in a parser's message ("'(' was never closed", "expected '<document start>'"): shown
# as written, never read as emphasis, code or a link
_INLINE = re.compile(r"([\\`*_\[\]<>])")


def _escaped(message: str) -> str:
    return _INLINE.sub(r"\\\1", message.rstrip(".")).replace("\n", " ")


def _name(language: str) -> str:
    return _NAMES.get(language, language)


def _sentence(message: str) -> str:
    return message if message.endswith((".", "?", "!")) else message + "."


# ---------------------------------------------------------------------------------------------------------------
# the parsers: code lines -> None, or (the error's line among them, 1-based; a one-line message)

_Parser = Callable[[list[str]], tuple[int, str] | None]


def _code_lines(code: str, indent: int) -> list[str]:
    """The block's lines as the parser reads them: up to ``indent`` leading spaces and a CRLF's ``"\\r"`` dropped."""
    lines = code.split("\n")
    if indent:
        lines = [line[min(indent, len(line) - len(line.lstrip(" "))):] for line in lines]
    return [line.removesuffix("\r") for line in lines]


def _one_line(kind: str, message: str) -> str:
    return f"{kind}: {' '.join(message.split()) or 'does not parse'}"


def _clamp(line: int | None, lines: list[str]) -> int:
    return min(max(line or 1, 1), max(len(lines), 1))


def _python(lines: list[str]) -> tuple[int, str] | None:
    numbers = list(range(1, len(lines) + 1))  # the block line of each line parsed
    if any(line.startswith(">>> ") or line.rstrip() == ">>>" for line in lines):
        kept = [(n, line[4:]) for n, line in enumerate(lines, 1)
                if line.startswith((">>> ", "... ")) or line.rstrip() in (">>>", "...")]
        numbers, lines = [n for n, _ in kept], [line for _, line in kept]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarning (an invalid escape) is no error
        try:
            ast.parse("\n".join(lines))
        except SyntaxError as e:
            return numbers[_clamp(e.lineno, lines) - 1] if numbers else 1, _one_line(type(e).__name__, e.msg)
        except (ValueError, RecursionError, MemoryError, OverflowError) as e:
            return numbers[0] if numbers else 1, _one_line(type(e).__name__, str(e))
    return None


def _json(lines: list[str]) -> tuple[int, str] | None:
    try:
        json.loads("\n".join(lines))
    except json.JSONDecodeError as e:
        return _clamp(e.lineno, lines), _one_line("JSONDecodeError", e.msg)
    except (ValueError, RecursionError) as e:
        return 1, _one_line(type(e).__name__, str(e))
    return None


def _toml(lines: list[str]) -> tuple[int, str] | None:
    try:
        tomllib.loads("\n".join(lines))
    except tomllib.TOMLDecodeError as e:
        # Python 3.14 gives lineno and msg; before, the message ends "(at line L, column C)" or "(at end of document)"
        message, line = str(e), getattr(e, "lineno", None)
        m = _TOML_AT.match(message)
        if m:
            message = m.group(1)
            line = line or (int(m.group(2)) if m.group(2) else len(lines))
        return _clamp(line, lines), _one_line("TOMLDecodeError", getattr(e, "msg", message))
    except RecursionError as e:
        return 1, _one_line(type(e).__name__, str(e))
    return None


def _yaml(lines: list[str]) -> tuple[int, str] | None:
    try:
        for _ in yaml.compose_all("\n".join(lines), Loader=yaml.SafeLoader):
            pass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark  # 0-based line of where the parser stopped
        problem = " ".join(x for x in (e.context, e.problem) if x) or "does not parse"
        return _clamp(mark.line + 1 if mark is not None else None, lines), _one_line(type(e).__name__, problem)
    except (yaml.YAMLError, RecursionError) as e:
        return 1, _one_line(type(e).__name__, str(e))
    return None


_PARSERS: dict[str, _Parser] = {"python": _python, "json": _json, "toml": _toml, "yaml": _yaml}
