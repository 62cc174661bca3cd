"""Prompt rendering: a jinja2 Environment(StrictUndefined) over templates/prompts/*.j2 and the planners' JSON schema."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import jinja2

from .errors import ConfigError
from .resources import template_dirs


@lru_cache(maxsize=8)
def _env(override: str | None) -> jinja2.Environment:
    # An override folder may hold only some templates: the bundled ones stand behind it (resources.template_dirs).
    loaders = [jinja2.FileSystemLoader(str(d)) for d in template_dirs(override, "prompts")]
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # prompts are plain text, not HTML
        keep_trailing_newline=False,
    )


def render(name: str, templates: str | None = None, **values: Any) -> str:
    env = _env(templates or None)
    try:
        return env.get_template(f"{name}.j2").render(**values).strip()
    except jinja2.TemplateNotFound:
        raise ConfigError(f"prompt template {name}.j2 not found") from None
    except jinja2.UndefinedError as e:
        raise ConfigError(f"prompt template {name}.j2: {e}") from None


def list_schema(n: int, with_title: bool, spare: int = 0) -> dict[str, Any]:
    """JSON schema for a planning reply: n titles, up to ``spare`` more (spares stand in for titles another node of
    the book already took; without spares, exactly n), and the book title at the top level."""
    props: dict[str, Any] = {
        "items": {"type": "array", "items": {"type": "string"}, "minItems": n, "maxItems": n + spare},
    }
    required = ["items"]
    if with_title:
        props = {"title": {"type": "string"}, **props}
        required = ["title", "items"]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


# The worked example of few-shot planning: a domain far from the books people usually ask for here, so a model
# that copies its example is caught by the title gate rather than passing unnoticed. Sixteen titles per level:
# the example shows exactly as many as the real request asks for.
_EXAMPLE_BOOK = "a home cooking guide"
_EXAMPLES = {
    "book": ("", ["Kitchen Basics", "Everyday Meals", "Baking and Desserts", "Cooking for Guests", "Preserving Food",
                  "Healthy Eating", "World Cuisines", "Seasonal Cooking", "Cooking on a Budget", "Grilling",
                  "Vegetarian Cooking", "Sauces and Dressings", "Breakfast and Brunch", "Street Food at Home",
                  "Cooking with Children", "Planning a Menu"]),
    "part": ("Everyday Meals", ["Quick Breakfasts", "Soups and Stews", "One-Pan Dinners", "Pasta and Rice",
                                "Salads", "Roasted Vegetables", "Using Leftovers", "Simple Fish Dishes",
                                "Chicken Weeknights", "Lunch Boxes", "Eggs Five Ways", "Beans and Lentils",
                                "Sandwiches", "Stir-Fries", "Batch Cooking", "Ten-Minute Sides"]),
    "chapter": ("Soups and Stews", ["Making Stock", "Choosing Vegetables", "Thickening a Soup", "Slow Cooking",
                                    "Seasoning to Taste", "Storing and Freezing", "Blended Soups", "Hearty Stews",
                                    "Cold Soups", "Garnishes", "Pressure Cooking", "Soup for a Crowd",
                                    "Fixing a Bland Soup", "Bread on the Side", "Reheating Safely",
                                    "Classic Recipes"]),
}
_CHILD = {"book": "part", "part": "chapter", "chapter": "section"}


def book_phrase(title: str) -> str:
    """A book title as a noun phrase for a prompt: "Software Engineering Handbook" -> "a software engineering
    handbook" (small models follow a plain phrase better than a quoted title)."""
    t = " ".join(title.split()).rstrip(".")
    words = t.split()
    low = " ".join(w if (w.isupper() and len(w) > 1) else w.lower() for w in words)
    if re.match(r"^(?:a|an|the)\b", low):
        return low
    return ("an " if low[:1].lower() in "aeiou" else "a ") + low


def few_shot_messages(kind: str, n: int, book: str, title: str, templates: str | None = None,
                      system: str | None = None) -> list[dict[str, str]]:
    """Messages asking for ``n`` child titles of a ``kind`` node ("book", "part", "chapter") titled ``title`` of
    the book ``book`` (a noun phrase), after one worked example of the same request and its numbered answer."""
    ex_title, ex_items = _EXAMPLES[kind]
    k = max(1, min(n, len(ex_items)))
    child = _CHILD[kind]
    example = render("list", templates, kind=kind, child=child, n=k, title=ex_title, book=_EXAMPLE_BOOK)
    answer = "\n".join(f"{i}. {t}" for i, t in enumerate(ex_items[:k], 1))
    request = render("list", templates, kind=kind, child=child, n=n, title=title, book=book)
    msgs = [{"role": "system", "content": system}] if system else []
    return [*msgs, {"role": "user", "content": example}, {"role": "assistant", "content": answer},
            {"role": "user", "content": request}]
