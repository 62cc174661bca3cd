"""Defects -> defects.md: the counts as a table a person reads, then the worst sections of each kind.

Pure, like :mod:`.defects`, whose :meth:`~.defects.Defects.to_markdown` calls :func:`defects_markdown`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .overlap import overlap_line

__all__ = ["defects_markdown"]

_TALK_AT = {"both": "at the start and end", "within": "between its paragraphs"}  # defects.json assistant_talk "at"


class Defects(Protocol):
    """What this module reads of :class:`.defects.Defects`; a protocol rather than an import, which would close
    a cycle with the module that calls this one (the layer contracts forbid it, TYPE_CHECKING imports included)."""

    @property
    def duplicate_section_titles(self) -> dict[str, Any]: ...
    @property
    def unterminated_blocks(self) -> dict[str, Any]: ...
    @property
    def truncated_sections(self) -> dict[str, Any]: ...
    @property
    def empty_sections(self) -> dict[str, Any]: ...
    @property
    def failed_sections(self) -> dict[str, Any]: ...
    @property
    def code_blocks(self) -> dict[str, Any]: ...
    @property
    def near_duplicate_sections(self) -> dict[str, Any]: ...
    @property
    def looping_sections(self) -> dict[str, Any]: ...
    @property
    def words(self) -> dict[str, Any]: ...
    @property
    def repeated_titles(self) -> dict[str, Any]: ...
    @property
    def sibling_overlap(self) -> dict[str, Any]: ...
    @property
    def word_salad(self) -> dict[str, Any]: ...
    @property
    def assistant_talk(self) -> dict[str, Any]: ...


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _quote(text: str) -> str:
    return "`" + text.replace("`", "'") + "`" if text else "(nothing)"


def _parse_line(c: dict[str, Any]) -> str:
    checked, broken = c.get("checked", {}), c.get("still_broken", {})
    if not checked:
        return "none checked"
    langs = ", ".join(f"{k} {checked[k] - broken.get(k, 0):,} of {checked[k]:,}" for k in sorted(checked))
    repaired = sum(c.get("repaired", {}).values())
    return f"{langs}; {repaired:,} sections repaired by a re-ask"


def defects_markdown(d: Defects, worst: int = 10) -> str:
    """defects.md: the table of counts, then up to ``worst`` sections of each kind found."""
    out = ["# Defect report", "", "| defect | count |", "|---|---|"]
    out += [f"| {a} | {_md_escape(b)} |" for a, b in _rows(d)]
    _lists(d, worst, out)
    return "\n".join(out) + "\n"


def _rows(d: Defects) -> list[tuple[str, str]]:
    u = d.unterminated_blocks
    up = u["printed"]
    lp = d.looping_sections
    c = d.code_blocks
    w = d.words
    langs = ", ".join(f"{k} {v:,}" for k, v in list(c["by_language"].items())[:8]) or "none"
    return [
        ("duplicate section titles", (f"{d.duplicate_section_titles['count']:,} titles occur more than once "
                                     f"({d.duplicate_section_titles['sections']:,} sections)")),
        ("unterminated blocks", f"{u['count']:,} of {u['of']:,} ({u['share']:.1%})"),
        ("unterminated blocks as printed in book.md", f"{up['count']:,} of {up['of']:,} ({up['share']:.1%})"),
        ("truncated sections (finish_reason \"length\")", f"{d.truncated_sections['count']:,}"),
        ("empty sections", f"{d.empty_sections['count']:,}"),
        ("failed sections", f"{d.failed_sections['count']:,}"),
        ("code blocks", f"{c['count']:,} ({langs})"),
        ("Python blocks failing ast.parse", (f"{c['python_syntax_errors']['count']:,} of "
                                            f"{c['python_syntax_errors']['of']:,}")),
        ("unclosed code fences", f"{c['unclosed_fences']['count']:,}"),
        ("code blocks that parse (Python, JSON, TOML)", _parse_line(c)),
        ("near-duplicate section pairs", f"{d.near_duplicate_sections['count']:,} "
                                         f"({d.near_duplicate_sections.get('repaired', 0):,} sections rewritten "
                                         "to say something else)"),
        ("looping sections", f"{lp['count']:,} still looping; {lp['repaired']:,} repaired "
                             f"({lp.get('cut', 0):,} of them kept cut before the loop)"),
        ("word salad (prose that stopped reading as language)",
         f"{d.word_salad['count']:,} sections; {d.word_salad['cut']:,} printed cut back before it"),
        ("assistant talk (a sign-off, a note on edits: left out of book.md)",
         f"{d.assistant_talk['count']:,} sections, {d.assistant_talk['words']:,} words"),
        ("repeated titles (book, parts, chapters, sections)", f"{d.repeated_titles['count']:,}"),
        ("word 5-grams a section shares with its chapter (titles it names set apart)",
         overlap_line(d.sibling_overlap)),
        ("words", f"{w['total']:,} in all; per section mean {w['mean']:,}, min {w['min']:,}, max {w['max']:,}"),
    ]


def _heading(title: str, shown: int, total: int) -> list[str]:
    return ["", f"## {title}" + (f" (first {shown} of {total:,})" if total > shown else ""), ""]


def _lists(d: Defects, worst: int, out: list[str]) -> None:
    """The sections behind each count, ``worst`` at most a kind, appended to ``out``."""
    u = d.unterminated_blocks
    c = d.code_blocks

    def section_list(title: str, items: list[dict[str, Any]], total: int,
                     extra: Callable[[dict[str, Any]], str] | None = None) -> None:
        if not items:
            return
        shown = items[:worst]
        out.extend(_heading(title, len(shown), total))
        for it in shown:
            line = f"- **{it['path']}** {_md_escape(it['title'])}: starts {_quote(it.get('first_line', ''))}"
            if extra:
                line += extra(it)
            out.append(line)

    if d.failed_sections["count"]:
        section_list("Failed sections", d.failed_sections["sections"], d.failed_sections["count"],
                     lambda it: f"; error: {_md_escape(str(it.get('error')))}")
    section_list("Empty sections", d.empty_sections["sections"], d.empty_sections["count"])
    titles = d.duplicate_section_titles["titles"]
    if titles:
        out.extend(_heading("Duplicate section titles", min(worst, len(titles)), len(titles)))
        out += [f"- {_md_escape(t['title'])} ×{t['count']}: {', '.join(t['paths'])}" for t in titles[:worst]]
    section_list("Unterminated blocks", u["sections"], u["count"],
                 lambda it: f"; ends {_quote(it['last_line'])}" + (" (truncated)" if it.get("truncated") else ""))
    section_list("Truncated sections", d.truncated_sections["sections"], d.truncated_sections["count"])
    section_list("Word salad", d.word_salad["sections"], d.word_salad["count"],
                 lambda it: f"; turns to salad after {it['words_before']:,} words at {_quote(it['salad'])}"
                 + ("; printed cut back before it" if it["cut"] else "; printed as written"))
    section_list("Assistant talk", d.assistant_talk["sections"], d.assistant_talk["count"],
                 lambda it: f"; talks {_TALK_AT.get(it['at'], 'at the ' + it['at'])}, "
                 f"{it['words']:,} words: {_quote(it['talk'])}")
    lp = d.looping_sections
    if lp["sections"]:
        shown = lp["sections"][:worst]
        out.extend(_heading("Looping sections", len(shown), lp["count"]))
        out += [f"- **{it['path']}** {_md_escape(it['title'])}: {_md_escape(it['reason'])}" for it in shown]
    section_list("Python blocks failing ast.parse", c["python_syntax_errors"]["sections"],
                 len(c["python_syntax_errors"]["sections"]),
                 lambda it: f" ({it['blocks']} block{'s' if it['blocks'] > 1 else ''})")
    section_list("Unclosed code fences", c["unclosed_fences"]["sections"], len(c["unclosed_fences"]["sections"]),
                 lambda it: f" ({', '.join(it['languages'])})")
    nd = d.near_duplicate_sections
    if nd["pairs"]:
        out.extend(_heading("Near-duplicate sections", min(worst, len(nd["pairs"])), nd["count"]))
        out += [f"- **{p['a']}** {_md_escape(p['a_title'])} ~ **{p['b']}** {_md_escape(p['b_title'])}: "
                f"Jaccard {p['jaccard']:.2f}, containment {p['containment']:.2f}" for p in nd["pairs"][:worst]]
