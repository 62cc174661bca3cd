"""Titles for the simulator's plans: the book, its parts, chapters and sections, as a list or inside any JSON
schema the request carries."""

from __future__ import annotations

import random
from typing import Any

from .context import Context
from .prose import Slots, sentence
from .words import (
    ACTIONS,
    BOOK_TITLES,
    CHAPTER_PATTERNS,
    COMMON_SECTIONS,
    CONCEPTS,
    OBJECTS,
    PART_THEMES,
    QUALIFIERS,
    SECTION_PATTERNS,
    concepts_near,
    is_concept,
)

__all__ = ["fill_schema", "make_book_title", "make_titles"]

# share of section titles drawn from the shared pool of generic titles (calibrated: ~46 of 1,536 repeat)
SECTION_COMMON_P = 0.065


def make_book_title(rng: random.Random) -> str:
    return rng.choice(BOOK_TITLES)


def make_titles(rng: random.Random, ctx: Context, n: int) -> list[str]:
    """``n`` distinct titles for the children of the node named in the prompt."""
    seen: set[str] = set()
    out: list[str] = []
    level = ctx.level or "section"
    tries = 0
    deck: list[str] = []
    while len(out) < n:
        tries += 1
        if level == "part":
            t = _part_title(rng, tries)
        elif level == "chapter":
            if not deck:  # every concept of the area once before any repeats
                deck = list(concepts_near(ctx.concept or ctx.subject))
                rng.shuffle(deck)
            t = _chapter_title(rng, deck.pop())
        else:
            t = _section_title(rng, ctx)
        if tries > 50 * (n + 1):
            t = f"{t} ({len(out) + 1})"
        k = t.lower()
        if k in seen:
            continue
        seen.add(k)
        out.append(t)
    return out


def _part_title(rng: random.Random, tries: int) -> str:
    if tries <= 3 * len(PART_THEMES):
        return rng.choice(PART_THEMES)
    return f"{rng.choice(PART_THEMES)} and {rng.choice(CONCEPTS)}"


def _chapter_title(rng: random.Random, concept: str) -> str:
    return rng.choice(CHAPTER_PATTERNS).format(c=concept, q=rng.choice(QUALIFIERS))


def _section_title(rng: random.Random, ctx: Context) -> str:
    if rng.random() < SECTION_COMMON_P:
        return rng.choice(COMMON_SECTIONS)
    c = ctx.concept if is_concept(ctx.concept) else rng.choice(concepts_near(ctx.concept))
    if rng.random() < 0.3:
        c = rng.choice(concepts_near(c))
    pat = rng.choice(SECTION_PATTERNS)
    o, o2 = rng.sample(OBJECTS, 2)
    return pat.format(c=c, o=o, o2=o2, a=rng.choice(ACTIONS), q=rng.choice(QUALIFIERS))


def fill_schema(schema: Any, rng: random.Random, ctx: Context, n: int | None, name: str, depth: int = 0) -> Any:
    """A value that fits ``schema``: titles wherever strings or string arrays are asked for, ``n`` of them (the
    "exactly N" of the prompt) where the schema does not fix the count."""
    if not isinstance(schema, dict) or depth > 6:
        return make_titles(rng, ctx, 1)[0]
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for comb in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(comb), list) and schema[comb]:
            return fill_schema(schema[comb][0], rng, ctx, n, name, depth + 1)
    t = _schema_type(schema)
    if t == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return {"titles": make_titles(rng, ctx, n or 5)}
        return {k: fill_schema(v, rng, ctx, n, k, depth + 1) for k, v in props.items()}
    if t == "array":
        return _fill_array(schema, rng, ctx, n, name, depth)
    if t == "string":
        return _fill_string(rng, ctx, name)
    return _fill_scalar(schema, t)


def _schema_type(schema: dict) -> Any:
    """The type a schema asks for: the first that is not "null" of a list, else guessed from its keywords."""
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t is None:
        t = "object" if "properties" in schema else ("array" if "items" in schema else "string")
    return t


def _fill_string(rng: random.Random, ctx: Context, name: str) -> str:
    """A string named ``name``: the book's title, a summary sentence, or a title."""
    low = name.lower()
    if "book" in low or low in ("title", "name"):
        return make_book_title(rng)
    if "summary" in low or "description" in low:
        return sentence(Slots(rng, ctx))
    return make_titles(rng, ctx, 1)[0]


def _fill_scalar(schema: dict, t: Any) -> Any:
    if t == "integer":
        return int(schema.get("minimum", 1))
    if t == "number":
        return float(schema.get("minimum", 1.0))
    if t == "boolean":
        return True
    if t == "null":
        return None
    return ""


def _fill_array(schema: dict, rng: random.Random, ctx: Context, n: int | None, name: str, depth: int) -> list:
    lo = schema.get("minItems")
    hi = schema.get("maxItems")
    if isinstance(hi, int):
        count = hi
    elif isinstance(lo, int):
        count = max(lo, n or lo)
    else:
        count = n if n is not None else 5
    items = schema["items"] if isinstance(schema.get("items"), dict) else {"type": "string"}
    if items.get("type") == "string" and "enum" not in items:
        lv = _level_from_name(name)
        sub = Context(lv, ctx.quoted, ctx.concept, ctx.subject) if lv else ctx
        return make_titles(rng, sub, count)
    return [fill_schema(items, rng, ctx, None, name, depth + 1) for _ in range(count)]


def _level_from_name(name: str) -> str:
    low = name.lower()
    for lv in ("part", "chapter", "section"):
        if lv in low:
            return lv
    return ""
