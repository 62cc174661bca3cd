"""What a prompt is about, as far as the simulator cares: the level a list is of, the quoted parent names, and the
concept and subject an answer should stay on."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .words import find_concept

__all__ = ["Context"]

_QUOTED_RE = re.compile(r"\"([^\"\n]{1,200})\"|“([^”\n]{1,200})”")
_BRIEF_RE = re.compile(r"\bbook brief\b")  # the planner's brief request (templates/prompts/brief*.j2)
_LEVEL_RE = re.compile(r"exactly \d+\s+(?:[\w-]+\s+){0,3}?(parts?|chapters?|sections?|titles?|topics?)\b")


@dataclass(frozen=True)
class Context:
    level: str  # "part", "chapter", "section", "title" or "" (what a list is of); "brief": the book's brief
    quoted: tuple[str, ...]  # parent names found in the prompt, in order
    concept: str  # the subject the answer is about
    subject: str  # the most specific quoted name (e.g. the section title), or the concept

    @classmethod
    def from_prompt(cls, last: str, everything: str) -> Context:
        low = last.lower()
        level = ""
        m = _LEVEL_RE.search(low)
        if m:
            level = m.group(1).rstrip("s")
        elif _BRIEF_RE.search(low):
            level = "brief"
        else:
            for lv in ("section", "chapter", "part"):
                if lv in low:
                    level = lv
                    break
        quoted = tuple(next(g for g in q if g) for q in _QUOTED_RE.findall(last))
        concept = find_concept(" ".join(quoted[::-1]) or last) or find_concept(everything) or ""
        subject = quoted[-1] if quoted else (concept or "software engineering")
        if level == "title":
            level = "section" if "section" in low else ("chapter" if "chapter" in low else "part")
        if level == "topic":
            level = "section"
        return cls(level, quoted, concept, subject)
