"""Frozen outline values and node paths.

A node path names a node of the outline tree, 1-based: "" is the book, "3" the third part, "3.7" its seventh
chapter, "3.7.12" that chapter's twelfth section.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Outline:
    title: str
    parts: tuple[Part, ...] = ()

    @property
    def shape(self) -> tuple[int, int, int]:
        """(parts, chapters, sections) counted over the whole tree."""
        chapters = sum(len(p.chapters) for p in self.parts)
        sections = sum(len(c.sections) for p in self.parts for c in p.chapters)
        return len(self.parts), chapters, sections

    def sections(self) -> Iterator[SectionRef]:
        """Every section in outline order."""
        for pi, part in enumerate(self.parts, 1):
            for ci, chapter in enumerate(part.chapters, 1):
                for si, title in enumerate(chapter.sections, 1):
                    yield SectionRef(f"{pi}.{ci}.{si}", self.title, part.title, chapter.title, title,
                                     chapter.words_of(si - 1), part_chapters=tuple(c.title for c in part.chapters),
                                     siblings=chapter.sections)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "parts": [
                {
                    "title": p.title,
                    "chapters": [_chapter_json(c) for c in p.chapters],
                }
                for p in self.parts
            ],
        }

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
        )


def _chapter_json(c: Chapter) -> dict[str, Any]:
    out: dict[str, Any] = {"title": c.title, "sections": list(c.sections)}
    if any(w is not None for w in c.words):  # only when a person set a length: outline.json stays as it was
        out["words"] = [c.words_of(i) for i in range(len(c.sections))]
    return out


@dataclass(frozen=True)
class SectionRef:
    """One section to write: everything its request may carry (``words``: None for the job's ``--words``)."""

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

