"""The simulator's word banks, loaded once from ``words.toml`` beside this module, and the concept index over them.

Every bank is a tuple in the file's order: the answers draw from them with a seeded ``random.Random``, so the
order is part of what makes an answer deterministic.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = [
    "ACTIONS",
    "AREAS",
    "BENEFITS",
    "BOOK_TITLES",
    "BULLET_LEADS",
    "CHAPTER_PATTERNS",
    "CLOSERS",
    "CODE_INTROS",
    "COMMON_SECTIONS",
    "CONCEPTS",
    "LIST_INTROS",
    "OBJECTS",
    "OTHER_SNIPPETS",
    "PART_AREAS",
    "PART_THEMES",
    "PRACTICES",
    "PYTHON_SNIPPETS",
    "QUALIFIERS",
    "RISKS",
    "SECTION_PATTERNS",
    "SENTENCES",
    "TEAMS",
    "concepts_near",
    "find_concept",
    "is_concept",
]

_BANKS: dict[str, Any] = tomllib.loads(Path(__file__).with_name("words.toml").read_text(encoding="utf-8"))


def _bank(name: str) -> tuple[str, ...]:
    return tuple(_BANKS[name])


BOOK_TITLES = _bank("book_titles")
QUALIFIERS = _bank("qualifiers")
CHAPTER_PATTERNS = _bank("chapter_patterns")
ACTIONS = _bank("actions")
OBJECTS = _bank("objects")
SECTION_PATTERNS = _bank("section_patterns")
COMMON_SECTIONS = _bank("common_sections")
BENEFITS = _bank("benefits")
RISKS = _bank("risks")
PRACTICES = _bank("practices")
TEAMS = _bank("teams")
SENTENCES = _bank("sentences")
LIST_INTROS = _bank("list_intros")
BULLET_LEADS = _bank("bullet_leads")
CODE_INTROS = _bank("code_intros")
CLOSERS = _bank("closers")
PYTHON_SNIPPETS = _bank("python_snippets")
OTHER_SNIPPETS: tuple[tuple[str, str], ...] = tuple((s["lang"], s["code"]) for s in _BANKS["other_snippets"])
AREAS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {area: tuple(concepts) for area, concepts in _BANKS["areas"].items()}
)
PART_AREAS: MappingProxyType[str, str] = MappingProxyType(dict(_BANKS["part_areas"]))

# --------------------------------------------------------------------------------------------------------------
# the concept index

PART_THEMES = tuple(PART_AREAS)
CONCEPTS = tuple(c for cs in AREAS.values() for c in cs)
_CONCEPT_AREA = {c.lower(): a for a, cs in AREAS.items() for c in cs}
_PART_AREA = {p.lower(): a for p, a in PART_AREAS.items()}
_CONCEPT_RE = re.compile("|".join(re.escape(x) for x in sorted(_CONCEPT_AREA, key=len, reverse=True)), re.IGNORECASE)
_PART_RE = re.compile("|".join(re.escape(x) for x in sorted(_PART_AREA, key=len, reverse=True)), re.IGNORECASE)
_CONCEPT_NAME = {c.lower(): c for c in CONCEPTS}
_CONCEPT_NAME_SET = frozenset(CONCEPTS)
_PART_NAME = {p.lower(): p for p in PART_THEMES}


def is_concept(name: str) -> bool:
    """Whether ``name`` is a concept exactly as spelled in the banks."""
    return name in _CONCEPT_NAME_SET


def find_concept(text: str) -> str:
    """The first known concept named in ``text`` (else a part theme), as spelled in the banks; "" if none."""
    if not text:
        return ""
    m = _CONCEPT_RE.search(text)
    if m:
        return _CONCEPT_NAME[m.group().lower()]
    m = _PART_RE.search(text)
    if m:
        return _PART_NAME[m.group().lower()]
    return ""


def concepts_near(concept: str) -> tuple[str, ...]:
    """Concepts of the same area as ``concept`` (a concept or a part theme); all concepts when unknown."""
    low = (concept or "").lower()
    area = _CONCEPT_AREA.get(low) or _PART_AREA.get(low)
    if area is None:
        c = find_concept(concept or "")
        area = _CONCEPT_AREA.get(c.lower()) or _PART_AREA.get(c.lower())
    return AREAS[area] if area else CONCEPTS
