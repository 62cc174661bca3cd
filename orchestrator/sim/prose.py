"""Markdown prose for the simulator: paragraphs of filled sentence templates, sometimes a bullet list, and fenced
code (~0.92 blocks per answer, 3 in 4 Python and always valid), with a log-normal length around
``LENGTH_FACTOR x`` the words asked."""

from __future__ import annotations

import math
import random
import re
import string

from .context import Context
from .words import (
    ACTIONS,
    BENEFITS,
    BULLET_LEADS,
    CLOSERS,
    CODE_INTROS,
    CONCEPTS,
    LIST_INTROS,
    OBJECTS,
    OTHER_SNIPPETS,
    PRACTICES,
    PYTHON_SNIPPETS,
    RISKS,
    SENTENCES,
    TEAMS,
    concepts_near,
    find_concept,
)

__all__ = ["Slots", "make_brief", "make_prose", "natural_words", "sentence", "snippet"]

LENGTH_FACTOR = 1.17  # median-ish natural words / asked words (calibrated: mean 288 of 250 after the cap)
LENGTH_SPREAD = 0.165  # log-normal sigma of the natural length (calibrated: ~7% over 520 tokens at 250 words)
CODE_BLOCK_PROBS = (0.17, 0.74, 0.09)  # 0, 1, 2 code blocks (calibrated to ~0.91 per section)
PYTHON_SHARE = 0.75

_SLOT_BANKS: dict[str, tuple[str, ...]] = {
    "o": tuple(x.lower() for x in OBJECTS), "b": BENEFITS, "r": RISKS, "p": PRACTICES, "t": TEAMS,
    "a": tuple(x.lower() for x in ACTIONS), "A": ACTIONS,
}
_SLOTS_OF: dict[str, tuple[str, ...]] = {}  # the slot names of each template, parsed once


class Slots:
    """Fillers for sentence templates, biased towards the section's subject."""

    def __init__(self, rng: random.Random, ctx: Context):
        self.rng = rng
        self.subject = ctx.subject.strip().rstrip(".:")
        self.concept = ctx.concept or find_concept(self.subject) or rng.choice(CONCEPTS)
        self.near = concepts_near(self.concept)
        self._deck: list[str] = []

    def next_template(self) -> str:
        """Sentence templates without repeats within one answer (until the bank is used up)."""
        if not self._deck:
            self._deck = list(SENTENCES)
            self.rng.shuffle(self._deck)
        return self._deck.pop()

    def fill(self, template: str) -> str:
        r = self.rng
        names = _SLOTS_OF.get(template)
        if names is None:
            names = _SLOTS_OF[template] = tuple(f for _, f, _, _ in string.Formatter().parse(template) if f)
        if not names:
            return template
        values = {}
        for k in names:
            if k in values:
                continue
            if k == "s":
                v = self.subject.lower() if r.random() < 0.5 else self.concept.lower()
            elif k == "S":
                v = self.subject
            elif k == "c":
                v = self.concept.lower()
            elif k == "c2":
                v = r.choice(self.near).lower()
            else:
                v = r.choice(_SLOT_BANKS[k])
            values[k] = v
        return template.format(**values)


def _capital(text: str) -> str:
    return text[0].upper() + text[1:]


def sentence(slots: Slots) -> str:
    return _capital(slots.fill(slots.next_template()))


def _paragraph(rng: random.Random, slots: Slots, lo: int = 3, hi: int = 5) -> str:
    return " ".join(sentence(slots) for _ in range(rng.randint(lo, hi)))


def _bullets(rng: random.Random, slots: Slots) -> str:
    intro = slots.fill(rng.choice(LIST_INTROS))
    items = []
    for _ in range(rng.randint(3, 5)):
        lead = slots.fill(rng.choice(BULLET_LEADS))
        items.append(f"- **{_capital(lead)}**: {sentence(slots)}")
    return _capital(intro) + "\n\n" + "\n".join(items)


def _code(rng: random.Random, slots: Slots) -> str:
    lang, body = snippet(rng, slots.concept, slots.subject)
    intro = slots.fill(rng.choice(CODE_INTROS))
    return f"{_capital(intro)}\n\n```{lang}\n{body.rstrip()}\n```"


def natural_words(rng: random.Random, asked: int) -> int:
    """The length this answer 'wants', before any max_tokens cap."""
    mu = math.log(asked * LENGTH_FACTOR) - LENGTH_SPREAD**2 / 2
    return max(20, round(math.exp(rng.gauss(mu, LENGTH_SPREAD))))


# The book brief (a request whose Context level is "brief"): a plausible one of ~80-120 words, one paragraph.
_AUDIENCES = (
    "working software engineers with a year or two of experience",
    "developers moving from small projects to systems that other people depend on",
    "engineers who write code every day and want to reason about it more clearly",
    "new team leads who still review and write code themselves",
)
_VOICES = (
    "a plain, direct voice that speaks to the reader as \"you\", with short sentences and no hype",
    "the voice of an experienced colleague: practical, candid about trade-offs, and sparing with jargon",
    "a calm, precise voice that explains each idea before it names it",
)
_EXAMPLES = (
    ("a small online bookshop", "its catalogue, orders and payments"),
    ("a ticket booking service", "its seat map, bookings and refunds"),
    ("a team task tracker", "its boards, tasks and notifications"),
    ("a library lending system", "its members, loans and reminders"),
)


def make_brief(rng: random.Random, ctx: Context) -> str:
    """A book brief: who the book is for, its voice, one running example and three terms it keeps fixed (never the
    words "book brief": a section request that carries it must not read as a brief request, see context.py)."""
    name, parts = rng.choice(_EXAMPLES)
    near = list(concepts_near(ctx.concept or find_concept(ctx.subject)))
    terms = rng.sample(near, 3) if len(near) >= 3 else rng.sample(list(CONCEPTS), 3)
    team = rng.choice(TEAMS)
    return " ".join([
        f"This book is for {rng.choice(_AUDIENCES)}.",
        f"It is written in {rng.choice(_VOICES)}.",
        f"One running example carries through every chapter: {name}, built and run by {team}, with {parts};",
        "each section shows its idea on that system rather than starting a new example.",
        f"The terms \"{terms[0].lower()}\", \"{terms[1].lower()}\" and \"{terms[2].lower()}\" keep the meaning",
        "they are given where they first appear, and are never swapped for synonyms.",
        f"Sections assume the chapters before them and aim for {rng.choice(BENEFITS)}.",
    ])


def make_prose(rng: random.Random, ctx: Context, asked_words: int) -> str:
    if ctx.level == "brief":
        return make_brief(rng, ctx)
    slots = Slots(rng, ctx)
    target = natural_words(rng, asked_words)
    u = rng.random()
    n_code = 0 if u < CODE_BLOCK_PROBS[0] else (1 if u < CODE_BLOCK_PROBS[0] + CODE_BLOCK_PROBS[1] else 2)
    blocks: list[str] = [_paragraph(rng, slots, 3, 4)]
    plan: list[str] = ["code"] * n_code
    if rng.random() < 0.35:
        plan.append("list")
    rng.shuffle(plan)
    words = len(blocks[0].split())
    for kind in plan:
        if kind == "code":
            b = _code(rng, slots)
        else:
            b = _bullets(rng, slots)
        blocks.append(b)
        words += len(b.split())
        if words < target * 0.8:
            p = _paragraph(rng, slots, 2, 3)
            blocks.append(p)
            words += len(p.split())
    closing: list[str] = []
    while words < target - 12:
        s = sentence(slots)
        closing.append(s)
        words += len(s.split())
        if len(closing) >= rng.randint(4, 6):
            blocks.append(" ".join(closing))
            closing = []
    if closing:
        blocks.append(" ".join(closing))
    if blocks[-1].endswith("```") or blocks[-1].startswith("- ") or "\n- " in blocks[-1]:
        blocks.append(slots.fill(rng.choice(CLOSERS)))
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------------------------------------------
# code snippets (Python ones always parse)


def _snake(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    s = re.sub(r"_+", "_", s)
    if not s or s[0].isdigit():
        s = "item_" + s
    return s[:32].rstrip("_")


def _camel(text: str) -> str:
    return "".join(w.capitalize() for w in _snake(text).split("_"))[:32] or "Item"


def snippet(rng: random.Random, concept: str, subject: str) -> tuple[str, str]:
    """(language, code) of one code block about ``concept`` (sometimes ``subject``)."""
    base = _snake((concept if rng.random() < 0.8 else subject) or "example")
    parts = base.split("_")[:3]
    verb = rng.choice(["check", "load", "build", "process", "apply", "measure", "collect", "parse"])
    f = "_".join([verb, *parts])[:40].rstrip("_")
    C = _camel("_".join(parts))
    F = f.split("_")[0] + "".join(w.capitalize() for w in f.split("_")[1:])
    n = rng.randint(2, 9)
    fill = {"f": f, "C": C, "F": F, "n": n, "n2": rng.randint(2, 9), "a": rng.randint(2, 5)}
    if rng.random() < PYTHON_SHARE:
        return "python", rng.choice(PYTHON_SNIPPETS).format(**fill)
    lang, tpl = rng.choice(OTHER_SNIPPETS)
    return lang, tpl.format(**fill)
