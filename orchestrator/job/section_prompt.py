"""What one section request says, and the context it is journaled under (``--context none|outline``).

``none`` is the reference's request: the book, part and chapter titles and the section's own. ``outline`` adds,
before the section's own line, the book's brief, the part's chapter titles and the chapter's section titles, in an
order that gives all sections of a chapter the longest shared prompt prefix (book and brief, then part, then
chapter; the section's own line last; the small profile's template puts a person's brief, then the chapter's
topics, and names the book in the section's own line), which vLLM's automatic prefix caching computes once per card.
The template
is the profile's section template with ``_outline`` after its name (``section_outline.j2``,
``section_small_outline.j2``), overridable in ``--templates`` like every other.

The journal's context of a section (``SectionRef.context``, which decides resuming) gains, with ``outline``, a
digest of what the request carries besides its titles: a changed brief or a renamed sibling redoes the sections
whose requests it changed, and nothing else. With ``none`` the context is exactly what it always was, so journals of
earlier runs (and the published take's) resume as before.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..core.config import Settings
from ..core.outline import SectionRef
from ..core.profiles import Profile
from ..core.prompts import book_phrase, render

__all__ = ["affinity_key", "check_templates", "section_context", "section_text", "template_of"]


def template_of(profile: Profile, settings: Settings) -> str:
    return profile.section_template + ("_outline" if settings.context == "outline" else "")


def section_text(ref: SectionRef, settings: Settings, profile: Profile, words: int) -> str:
    """The user message of the section's request."""
    values: dict[str, Any] = {
        "book": ref.book, "part": ref.part, "chapter": ref.chapter, "section": ref.title, "words": words,
        "book_phrase": book_phrase(ref.book),
    }
    if settings.context == "outline":
        values.update(brief=ref.brief, part_chapters=list(ref.part_chapters), siblings=list(ref.siblings),
                      index=int(ref.path.rsplit(".", 1)[-1]))
    return render(template_of(profile, settings), settings.templates, **values)


def section_context(ref: SectionRef, settings: Settings, words: int, profile: Profile) -> dict[str, Any]:
    """The section's journal context: its titles and length, and with ``outline`` a digest of the request's text as
    the profile's template renders it (exactly what it carries: a template that leaves the part's chapters out is
    not redone when a chapter is renamed)."""
    context = ref.context(words)
    if settings.context == "outline":
        text = section_text(ref, settings, profile, words)
        context["outline"] = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    return context


def affinity_key(ref: SectionRef, settings: Settings) -> str | None:
    """The fleet's affinity key of the section's request: its chapter, whose sections share a prompt prefix with
    ``outline`` (unless ``settings.affinity`` is off); None with ``none`` (a ~60-token request shares little worth a
    preference)."""
    return ref.path.rsplit(".", 1)[0] if settings.context == "outline" and settings.affinity else None


def check_templates(settings: Settings, profile: Profile) -> None:
    """Render the section template once with empty values, and with ``outline`` the brief's: a broken template fails
    before planning, not after requests were spent."""
    ref = SectionRef("1.1.1", "", "", "", "")
    section_text(ref, settings, profile, 1)
    if settings.context == "outline" and profile.brief_template is not None:
        render(profile.brief_template, settings.templates, request="", words=1, book_phrase="")
