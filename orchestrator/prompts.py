"""Prompt rendering: a jinja2 Environment(StrictUndefined) over templates/prompts/*.j2 and the planners' JSON schema."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from .errors import ConfigError


def template_dir(override: str | None = None) -> Path:
    """The templates folder: an override, else the one shipped in the wheel, else the repo's top-level one."""
    if override:
        p = Path(override)
        if not p.is_dir():
            raise ConfigError(f"--templates {override!r} is not a directory")
        return p
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if candidate.is_dir():
            return candidate
    raise ConfigError("the bundled templates are missing from this installation")


@lru_cache(maxsize=8)
def _env(directory: str) -> jinja2.Environment:
    base = Path(directory)
    # An override folder may hold only some templates: fall back to the bundled ones for the rest.
    loaders = [jinja2.FileSystemLoader(str(base / "prompts"))]
    bundled = template_dir(None) / "prompts"
    if bundled != base / "prompts":
        loaders.append(jinja2.FileSystemLoader(str(bundled)))
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # prompts are plain text, not HTML
        keep_trailing_newline=False,
    )


def render(name: str, templates: str | None = None, **values: Any) -> str:
    env = _env(str(template_dir(templates)))
    try:
        return env.get_template(f"{name}.j2").render(**values).strip()
    except jinja2.TemplateNotFound:
        raise ConfigError(f"prompt template {name}.j2 not found") from None
    except jinja2.UndefinedError as e:
        raise ConfigError(f"prompt template {name}.j2: {e}") from None


def list_schema(n: int, with_title: bool) -> dict[str, Any]:
    """JSON schema for a planning reply: exactly n titles (and the book title at the top level)."""
    props: dict[str, Any] = {
        "items": {"type": "array", "items": {"type": "string"}, "minItems": n, "maxItems": n},
    }
    required = ["items"]
    if with_title:
        props = {"title": {"type": "string"}, **props}
        required = ["title", "items"]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
