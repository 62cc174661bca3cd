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
    title: str
    sections: tuple[str, ...] = ()


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
                    yield SectionRef(f"{pi}.{ci}.{si}", self.title, part.title, chapter.title, title)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "parts": [
                {
                    "title": p.title,
                    "chapters": [{"title": c.title, "sections": list(c.sections)} for c in p.chapters],
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
                        Chapter(title=c["title"], sections=tuple(c.get("sections", ()))) for c in p.get("chapters", ())
                    ),
                )
                for p in data.get("parts", ())
            ),
        )


@dataclass(frozen=True)
class SectionRef:
    """One section to write: everything its request may carry."""

    path: str
    book: str
    part: str
    chapter: str
    title: str


def level_of(path: str) -> int:
    """0 for the book, 1 for a part, 2 for a chapter, 3 for a section."""
    return 0 if path == "" else path.count(".") + 1

