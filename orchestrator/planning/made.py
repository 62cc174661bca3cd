"""Titles the planner makes itself rather than take from a model: the book's from the prompt, a title another node
took qualified by this node's, the fillers of a node its replies left short, and a rambling title shortened."""

from __future__ import annotations

import re

from ..book.checks import MAX_TITLE_WORDS

MAX_TITLE_CHARS = 160  # a longer "title" is a model rambling, and its children's prompts would overflow


def book_title_from_prompt(prompt: str) -> str:
    """A book title made from the request, for a reply that names none ("Write me a complete software
    engineering handbook. Every topic..." -> "Software Engineering Handbook")."""
    first = re.split(r"(?<=[.!?])\s", prompt.strip(), maxsplit=1)[0].strip().rstrip(".!?")
    t = re.sub(
        r"^(?:please\s+)?(?:write|create|make|generate|produce|draft|compose|give)\s+(?:me\s+|us\s+)?"
        r"(?:a|an|the)?\s*(?:(?:complete|comprehensive|full|thorough|detailed|long|short|small|whole)\s+)*",
        "", first, flags=re.IGNORECASE,
    ).strip()
    t = t or first or "Handbook"
    words = t.split()[:12]
    small = {"a", "an", "the", "and", "or", "of", "for", "in", "on", "to", "with", "about"}
    return " ".join(w if (i and w.lower() in small) or not w.islower() else w.capitalize()
                    for i, w in enumerate(words))


def qualified(title: str, parent: str) -> str:
    """The last resort for a title another node already took: the same title made this node's by its parent's
    ("Testing" under "Web Services" -> "Testing in Web Services"); read better than a "(2)" suffix, and still
    says what the section is about."""
    return f"{title} in {parent}"


# The angles a node's own title is topped up with when the model offered fewer usable titles than asked (see
# parse_titles, ``own``): ordinary section headings of any subject, the most useful first, distinct from one another
# and from their parent (each adds words to it, so none is a near copy).
FILLER_ANGLES = (
    "Core Ideas of {t}", "{t} in Practice", "Common Mistakes in {t}", "A Worked Example of {t}", "Tools for {t}",
    "Trade-offs in {t}", "Getting Started with {t}", "Key Terms in {t}", "A Checklist for {t}",
    "Advanced Topics in {t}", "Case Studies in {t}", "A Short History of {t}", "Measuring Success in {t}",
    "Questions and Answers on {t}", "Explaining {t} to Others", "Further Reading on {t}",
)


def filler_titles(own: str) -> list[str]:
    """Titles made from a node's own title (``own``), for the places its replies left empty: the angles of
    :data:`FILLER_ANGLES`, those within the quality checker's word limit first, then ("More on X: Topic 17") as many
    as a node may ask beyond them. Not the model's words, so a node gets them only on the attempt that takes a reply
    as well as it can (its last, or the end of its profile's bounded re-asks; see ``titles.parse_titles``), and only
    for the places no distinct title of its replies filled: a chapter of the size asked with plain headings reads
    better than a chapter of one section, or a section titled as its chapter (both seen on SmolLM2-135M)."""
    t = shorten(own.strip().rstrip(".:"))
    made = [a.format(t=t) for a in FILLER_ANGLES]
    made.sort(key=lambda x: len(x.split()) > MAX_TITLE_WORDS)  # stable: the angles' order within each group
    return made + [f"More on {t}: Topic {k}" for k in range(len(FILLER_ANGLES) + 1, 257)]


# Where a rambling title is cut: a dash, colon, semicolon or comma, or an opening bracket, after which the model went on
# describing or listing ("Design Patterns (DP) - A book that provides information on ...", "Fundamentals, 1. Cloud
# Computing, 2. ..."); the words before the first of them (keeping MIN_CUT_WORDS) are the title.
_SEPARATOR = re.compile(r"\s[-–—]\s|[:;,]\s|\s\(")
# Words a title does not end on: where the word limit cut a sentence, these are left dangling ("... information on").
_DANGLING = frozenset("a an the and or of for in on to with about by at from as into that which who when where how "
                      "is are was were be its their your our this these".split())
_SIGNS = frozenset("& / + - – — (".split())  # a lone sign a cut may end on: the title gate refuses it (title_debris)
MIN_CUT_WORDS = 3  # the words a cut at a separator keeps at least ("Chapter 3: ..." is no title of its own)


def shorten(title: str) -> str:
    """A title within the quality checker's :data:`MAX_TITLE_WORDS` words and :data:`MAX_TITLE_CHARS` characters; one
    within both is returned with its spaces made single. Over the word limit, it is cut at the first separator
    (:data:`_SEPARATOR`) within the limit that keeps at least :data:`MIN_CUT_WORDS` words, else at the limit, and then
    loses the function words it would end on; over the character limit, it is cut with an ellipsis. A cut title goes
    through the title gate like any other (a cut back to its parent's title is a copy of it, and is refused there)."""
    words = title.split()
    if len(words) > MAX_TITLE_WORDS:
        head = " ".join(words[:MAX_TITLE_WORDS])
        cuts = [m.start() for m in _SEPARATOR.finditer(head) if len(head[: m.start()].split()) >= MIN_CUT_WORDS]
        kept = (head[: cuts[0]] if cuts else head).split()
        while len(kept) > 1 and (kept[-1].lower().strip(".,;:!?") in _DANGLING or kept[-1] in _SIGNS):
            kept.pop()
        kept[-1] = kept[-1].rstrip(",;:-–—") or kept[-1]
        words = kept
    out = " ".join(words)
    return out if len(out) <= MAX_TITLE_CHARS else out[: MAX_TITLE_CHARS - 1].rstrip() + "…"
