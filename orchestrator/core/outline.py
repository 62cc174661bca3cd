"""Frozen outline values and node paths.

A node path names a node of the outline tree, 1-based: "" is the book, "3" the third part, "3.7" its seventh
chapter, "3.7.12" that chapter's twelfth section.

An outline may carry the book's *brief* (``--context outline``): a short paragraph on the book's audience, voice,
running example and terms that every section request carries, so that sections written separately read as one
book. It is kept in normal form (:func:`normal_brief`) wherever it is made or read, so that outline.md, the journal
and the planner's value compare equal when nobody edited it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Chapter:
    """``words``: per-section target lengths set by a person in outline.md, parallel to ``sections`` (None: the
    job's ``--words``); empty when none is set."""

    title: str
    sections: tuple[str, ...] = ()
    words: tuple[int | None, ...] = ()

    def words_of(self, index: int) -> int | None:
        """The words set for section ``index`` (0-based), or None."""
        return self.words[index] if index < len(self.words) else None


@dataclass(frozen=True)
class Part:
    title: str
    chapters: tuple[Chapter, ...] = ()


def normal_brief(text: str) -> str:
    """A brief in normal form: its paragraphs (separated by blank lines), each on one line with single spaces, joined
    by one blank line; no empty paragraph. Idempotent; outline.md writes and reads exactly this form."""
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text or ""))
    return "\n\n".join(p for p in paragraphs if p)


@dataclass(frozen=True)
class Outline:
    """``brief``: the book's brief in normal form, "" for none (``--context none``, or a brief that failed)."""

    title: str
    parts: tuple[Part, ...] = ()
    brief: str = ""

    @property
    def shape(self) -> tuple[int, int, int]:
        """(parts, chapters, sections) counted over the whole tree."""
        chapters = sum(len(p.chapters) for p in self.parts)
        sections = sum(len(c.sections) for p in self.parts for c in p.chapters)
        return len(self.parts), chapters, sections

    def titles(self) -> Iterator[tuple[str, str]]:
        """(path, title) of every level, in reading order: the book's ("" its path), then each part's, chapter's and
        section's ("1", "1.2", "1.2.3")."""
        yield "", self.title
        for pi, part in enumerate(self.parts, 1):
            yield f"{pi}", part.title
            for ci, chapter in enumerate(part.chapters, 1):
                yield f"{pi}.{ci}", chapter.title
                for si, title in enumerate(chapter.sections, 1):
                    yield f"{pi}.{ci}.{si}", title

    def sections(self) -> Iterator[SectionRef]:
        """Every section in outline order, each with the book's brief, its part's chapter titles and its chapter's
        section titles (what a ``--context outline`` request carries)."""
        for pi, part in enumerate(self.parts, 1):
            chapters = tuple(c.title for c in part.chapters)
            for ci, chapter in enumerate(part.chapters, 1):
                for si, title in enumerate(chapter.sections, 1):
                    yield SectionRef(f"{pi}.{ci}.{si}", self.title, part.title, chapter.title, title,
                                     chapter.words_of(si - 1), brief=self.brief, part_chapters=chapters,
                                     siblings=chapter.sections)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "title": self.title,
            "parts": [
                {
                    "title": p.title,
                    "chapters": [_chapter_json(c) for c in p.chapters],
                }
                for p in self.parts
            ],
        }
        if self.brief:  # only when there is one: an outline without a brief is written as it always was
            out["brief"] = self.brief
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outline:
        return cls(
            title=data["title"],
            parts=tuple(
                Part(
                    title=p["title"],
                    chapters=tuple(
                        Chapter(title=c["title"], sections=tuple(c.get("sections", ())),
                                words=tuple(c.get("words", ())))
                        for c in p.get("chapters", ())
                    ),
                )
                for p in data.get("parts", ())
            ),
            brief=normal_brief(data["brief"]) if isinstance(data.get("brief"), str) else "",
        )


def _chapter_json(c: Chapter) -> dict[str, Any]:
    out: dict[str, Any] = {"title": c.title, "sections": list(c.sections)}
    if any(w is not None for w in c.words):  # only when a person set a length: outline.json stays as it was
        out["words"] = [c.words_of(i) for i in range(len(c.sections))]
    return out


@dataclass(frozen=True)
class SectionRef:
    """One section to write: everything its request may carry (``words``: None for the job's ``--words``).

    ``brief``, ``part_chapters`` (the part's chapter titles, in order) and ``siblings`` (the chapter's section titles,
    in order, this one included) are what a ``--context outline`` request carries besides the titles; they come after
    the positional fields and default to empty, so every older construction, and :meth:`context`, are unchanged."""

    path: str
    book: str
    part: str
    chapter: str
    title: str
    words: int | None = None
    # what a request with --context outline carries besides its titles (job/section_prompt.py)
    brief: str = ""
    part_chapters: tuple[str, ...] = ()  # the part's chapter titles, in order
    siblings: tuple[str, ...] = ()  # the chapter's section titles, in order, this one among them

    def context(self, words: int) -> dict[str, Any]:
        """What the section's request is made from besides its title, its path aside: a section whose context and
        title are unchanged is the same section wherever the outline moved it (``handbook write`` after an edit)."""
        return {"book": self.book, "part": self.part, "chapter": self.chapter, "words": words}


def level_of(path: str) -> int:
    """0 for the book, 1 for a part, 2 for a chapter, 3 for a section."""
    return 0 if path == "" else path.count(".") + 1

