"""The one template locator: the bundled templates and a user's override folder, for prompts, the book and the feed.

Rule (the same for every template): an override folder must exist; it may hold only some templates, and the bundled
ones stand behind it for the rest. The bundled folder is ``orchestrator/templates`` in a wheel (hatch force-include)
or the repository's top-level ``templates/`` in a checkout or an editable install.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .errors import ConfigError

__all__ = ["bundled_templates", "template_dirs"]

_MARKER = "book.html.j2"  # present in every complete templates folder


@lru_cache(maxsize=1)
def bundled_templates() -> Path:
    package = Path(__file__).resolve().parents[1]  # orchestrator/ (this module is orchestrator/core/resources.py)
    candidates = (package / "templates", package.parent / "templates")
    for candidate in candidates:
        if (candidate / _MARKER).is_file():
            return candidate
    raise ConfigError(
        "the bundled templates are missing from this installation (looked in "
        + " and ".join(str(c) for c in candidates) + ")"
    )


def template_dirs(override: str | Path | None = None, sub: str = "") -> list[Path]:
    """The folders to load templates from, first match wins: ``override/sub`` (when given), then the bundled
    ``sub`` folder. A missing override folder is a :class:`ConfigError`, and so is a template of ``sub`` put at the
    top of an override that has no ``sub`` folder (``DIR/section.j2`` for ``DIR/prompts/section.j2``), which would
    otherwise be silently unused; beside a ``DIR/sub`` folder, a top-level file of that name is taken for the user's
    own (a partial their ``book.html.j2`` includes)."""
    bundled = bundled_templates() / sub if sub else bundled_templates()
    if override is None or override == "":
        return [bundled]
    folder = Path(override).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"--templates {override}: not a directory")
    if sub and not (folder / sub).is_dir():  # with a DIR/sub, a top-level file of that name is the user's own
        misplaced = sorted(p.name for p in folder.glob("*.j2") if (bundled / p.name).is_file())
        if misplaced:
            raise ConfigError(f"--templates {override}: {misplaced[0]} is a {sub} template: put it in "
                              f"{Path(override) / sub}/ (the layout of the bundled templates folder)")
    folder = folder.resolve() / sub if sub else folder.resolve()
    return [folder, bundled] if folder != bundled else [bundled]
