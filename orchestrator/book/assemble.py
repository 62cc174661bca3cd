"""Results -> Markdown in outline order; a section the token cap stopped is cut back to its last complete sentence.

``Book`` is the frozen value the later stages (typeset, defects, report) work from.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass
from functools import cached_property

from markdown_it import MarkdownIt

from ..core.outline import Outline, SectionRef
from ..core.states import Missing
from .checks import norm_title
from .codecheck import CodeReport, check_code, mark_broken
from .cutback import complete_part, cut_back
from .fences import close_open_fence
from .salad import salad_at
from .talk import Talk, talk_spans, without_talk

INTERRUPTED = Missing.INTERRUPTED  # the name older code imports


@dataclass(frozen=True)
class SectionText:
    """A section as written (or not): ``error`` is set when every attempt failed; ``text`` is then ''.

    ``text`` is the answer as generated (defects count it as the reference did); book.md prints
    :func:`section_body`. ``repaired_from`` says why the first answer was replaced by this one (the first answer's
    :func:`orchestrator.repair.loop_reason`, e.g. "line repeated 5 times: ..."), None when it was not.
    """

    path: str
    part: str
    chapter: str
    title: str
    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0
    backend: str | None = None
    error: str | None = None  # why every attempt failed, or a Missing: it was never asked for
    repaired_from: str | None = None
    code_repaired: tuple[str, ...] = ()  # languages whose broken blocks a re-ask repaired (job/repairs.py)
    rewritten_from: str | None = None  # the section it nearly repeated, before a re-ask made it say something else
    loop_cut: bool = False  # ``text`` is the answer cut before its repetition loop (book/loopcut.py), not re-asked

    @property
    def failed(self) -> bool:
        return self.error is not None and self.error != Missing.INTERRUPTED

    @property
    def interrupted(self) -> bool:
        """Not written because the run was stopped (Ctrl-C) first: not a failure; a rerun writes it."""
        return self.error == Missing.INTERRUPTED

    @property
    def empty(self) -> bool:
        return self.error is None and not self.text.strip()

    @cached_property
    def body(self) -> str:
        """:func:`section_body`, computed once: the Writer asks for it as the section lands, so that assembling
        the book after the last section (on the job's critical path) and counting its defects only join texts.
        (A cached_property sets the instance's ``__dict__`` directly, which a frozen dataclass allows.)"""
        return _section_body(self)

    @cached_property
    def code(self) -> CodeReport:
        """:func:`.codecheck.check_code` of ``text``, computed once (with :attr:`body`, as the section lands): the
        notes book.md prints under blocks that do not parse, and defects.json ``code_blocks``."""
        return check_code(self.text)

    @cached_property
    def salad(self) -> int | None:
        """:func:`.salad.salad_at` of ``text``, computed once (with :attr:`body`, as the section lands): where its
        word salad starts, None when it has none."""
        return salad_at(self.text)

    @cached_property
    def salad_cut(self) -> str | None:
        """``text`` cut back before its word salad, to the last complete sentence, list item, table row or code block
        ahead of it (:func:`.cutback.complete_part`); None when it has no salad, or none of those before it (salad
        from its first sentence: printed as written, and defects.json ``word_salad`` names it)."""
        return None if self.salad is None else complete_part(self.text[: self.salad])

    @cached_property
    def talk(self) -> Talk:
        """:func:`.talk.talk_spans` of ``text``, computed once (with :attr:`body`, as the section lands): where the
        model talks to whoever asked ("I hope this helps!", "I made several changes to ..."), which book.md leaves
        out; falsy when it does not."""
        return talk_spans(self.text)

    @cached_property
    def shingles(self) -> array[int]:
        """:func:`orchestrator.textscan.shingles` of ``text`` (the defect report's near-duplicate search), computed
        once: the Writer asks for it as the section lands."""
        from .textscan import shingles

        return shingles(self.text)

    @cached_property
    def loop(self) -> str | None:
        """:func:`orchestrator.repair.loop_reason` of ``text``, computed once (the Writer seeds it from the check
        each answer passes as it lands, so that counting the defects after the last section does not redo it)."""
        from .checks import loop_reason

        return loop_reason(self.text)


@dataclass(frozen=True)
class Book:
    outline: Outline
    sections: tuple[SectionText, ...]
    markdown: str

    @property
    def words(self) -> int:
        return sum(count_words(s.text) for s in self.sections)


_WORD = re.compile(r"\S+")


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


_md = MarkdownIt("commonmark")


def demote_headings(text: str, below: int = 4, drop_title: str | None = None) -> str:
    """Rewrite a section's own headings to sit below level ``below`` (ATX, max level 6).

    Headings are found with markdown-it, so '#' lines inside code fences stay untouched; setext headings become
    ATX. A first heading that merely repeats the section title (``drop_title``) is removed.
    """
    # Lines as markdown-it counts them (its token maps): CR and CRLF endings read as LF, and nothing else breaks a line
    # (str.splitlines would also split at U+2028, a form feed and the like, shifting every map after one)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    tokens = _md.parse(text)
    edits: list[tuple[int, int, str | None]] = []
    first_block = True
    for i, tok in enumerate(tokens):
        is_block = tok.type.endswith("_open") or tok.type in ("fence", "code_block", "hr", "html_block")
        if tok.level != 0 or tok.map is None or not is_block:
            continue
        if tok.type == "heading_open":
            level = int(tok.tag[1])
            content = tokens[i + 1].content if i + 1 < len(tokens) else ""
            start, end = tok.map
            if first_block and drop_title and norm_title(content) == norm_title(drop_title):
                edits.append((start, end, None))
            else:
                new_level = min(below + level, 6)
                edits.append((start, end, "#" * new_level + " " + content.strip()))
        first_block = False
    for start, end, repl in reversed(edits):
        lines[start:end] = [] if repl is None else [repl]
    return "\n".join(lines).strip()


def section_body(s: SectionText) -> str:
    """:attr:`SectionText.body`: the section as book.md prints it (computed once per section)."""
    return s.body


def _section_body(s: SectionText) -> str:
    """A written section's text as book.md prints it under its ``####`` heading: without the model's talk to whoever
    asked for it (a lead-in, a sign-off: :mod:`.talk`), cut back to its last complete sentence when the token cap
    stopped it (so the book never stops mid-word), its own headings demoted, a code fence left open closed. A section
    the model ended itself keeps every complete line, but loses a tail that is no sentence (a run of hashtags,
    "[Insert Guide]", a bare link: what small models sign off with). Word salad (a small model's prose that stopped
    reading as language) is cut off with the sentence it starts in. A code block that does not parse as printed
    (Python, JSON, TOML, YAML: :mod:`.codecheck`) gets a note under it saying so."""
    text, salad_cut, ended = s.text, s.salad_cut, s.finish_reason != "length"
    if s.talk and _says_something(kept := without_talk(s.text, s.talk)):
        # Talk is taken out first: a sign-off ends the section where the model stopped writing it (what the token cap
        # cut is in the talk when the talk runs to the end), and salad is looked for in what is left. A section that
        # is talk and nothing else is printed as written.
        text = kept
        ended = ended or s.talk.tail is not None
        at = salad_at(text)
        salad_cut = None if at is None else complete_part(text[:at])
    if salad_cut is not None:
        text = salad_cut
    elif not ended:
        text = cut_back(text)
    else:
        # Every line is complete (the model stopped), so only a tail that is no sentence goes; and only a tail: a
        # text that would lose more than half of itself (a reply that is all headings, say) is printed as written.
        cut = cut_back(text.rstrip() + "\n").rstrip("\n")
        text = cut if len(cut.strip()) >= 0.5 * len(text.strip()) else text
    # cut_back closes what it keeps; close_open_fence closes a text printed as written. The notes come from the
    # text as generated (a block the model never closed is cut code, with no error, whichever closed it for printing).
    return close_open_fence(mark_broken(demote_headings(text, drop_title=s.title), s.code.errors, s.text))


def _says_something(text: str) -> bool:
    """Whether ``text`` holds a line that is not a heading."""
    return any(line.strip() and not line.lstrip().startswith("#") for line in text.split("\n"))


def assemble(outline: Outline, sections: dict[str, SectionText], missing: Missing = Missing.NOT_WRITTEN) -> Book:
    """Place every section under its part and chapter, in outline order. A failed section is marked visibly; a
    section absent from ``sections`` is marked with ``missing`` (INTERRUPTED when the run was stopped). A text
    written for another title is never placed under this one: it counts as not written."""
    out: list[str] = [f"# {outline.title}", ""]
    ordered: list[SectionText] = []
    refs = {r.path: r for r in outline.sections()}
    for pi in range(1, len(outline.parts) + 1):
        out += _part_lines(outline, pi, sections, missing, refs, ordered)
    return Book(outline=outline, sections=tuple(ordered), markdown="\n".join(out).rstrip() + "\n")


def section_markdown(title: str, s: SectionText | None, missing: Missing = Missing.NOT_WRITTEN) -> str:
    """One section as :func:`assemble` writes it into book.md under the outline's ``title``: what typesetting
    while writing lays out as soon as the section is in (typeset/background.py)."""
    if s is None or s.title != title:
        s = SectionText("", "", "", title, "", error=missing)
    return "\n".join(_section_lines(title, s)).rstrip() + "\n"


def _section_lines(title: str, s: SectionText) -> list[str]:
    out = [f"#### {title}", ""]
    if s.error is not None:
        out += [f"> **This section is missing**: {s.error}", ""]
    elif s.text.strip():
        out += [s.body, ""]
    return out


def _part_lines(outline: Outline, pi: int, sections: dict[str, SectionText], missing: Missing,
                refs: dict[str, SectionRef], ordered: list[SectionText]) -> list[str]:
    part = outline.parts[pi - 1]
    out = [f"## {part.title}", ""]
    for ci, chapter in enumerate(part.chapters, 1):
        out += [f"### {chapter.title}", ""]
        for si, title in enumerate(chapter.sections, 1):
            path = f"{pi}.{ci}.{si}"
            s = sections.get(path)
            if s is None or s.title != title:
                s = SectionText(path, refs[path].part, refs[path].chapter, title, "", error=missing)
            ordered.append(s)
            out += _section_lines(title, s)
    return out
