"""Checked afterwards, asked again once: code that does not parse, and sections that nearly repeat another.

Both repairs keep the fan-out: the re-ask is one more request of the section's own, sent through the same
dispatcher (same caps, retries, priority), never journaled on its own (``journaled=False``); what the section ends
with is then recorded over the section's journal entry, with a mark saying the repair was tried, so that a rerun
repeats none (``Journal.record``: the value's ``code_repair`` / ``dedupe``).

* **Code** (:func:`repair_code`, right after a section is accepted): a fenced block whose language has a parser at
  hand (``book/codecheck.py``: Python, JSON, TOML, YAML) and does not parse sends the section back once, with the errors
  and their lines; the new text replaces the first only if every one of its checked blocks parses and it keeps as
  many closed blocks as were broken, of any language (else the first stays, and ``defects.json`` counts its blocks
  ``still_broken``).
* **Near-duplicates** (:func:`repair_duplicates`, once every section is in): of each near-duplicate pair
  (``book/textscan.near_duplicates``, the defect report's definition: :func:`partners_within`) the later section
  is asked again, told the other's title and first sentence; the new text replaces it only if it no longer nearly
  duplicates the other. A library's ``--dedupe reask`` adds the sections that nearly repeat a section of a book
  finished before (:func:`partners_across`, ``book/crossdup.CrossIndex``).

Settings.repairs turns both off (the published preset does: its book stays the reference's).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ..book.assemble import SectionText
from ..book.checks import loop_reason
from ..book.codecheck import CodeReport, check_code, repair_note
from ..book.crossdup import CrossIndex
from ..book.textscan import near_duplicates
from ..core.events import NodeFinished
from ..core.reply import Reply
from ..core.states import NodeKind

if TYPE_CHECKING:
    from ..dispatch.dispatcher import Dispatcher
    from ..dispatch.journal import Journal
    from ..wire.client import BackendClient

__all__ = ["Accepted", "Partner", "first_sentence", "partners_across", "partners_within", "repair_code",
           "repair_duplicates", "repair_notes"]

Body = Callable[["BackendClient", list[dict[str, str]], int], dict[str, Any]]  # client, messages, max_tokens
_SENTENCE = re.compile(r"(.+?[.!?])(?:\s|$)", re.DOTALL)


@dataclass(frozen=True)
class Accepted:
    """A section's accepted reply, its journal value, and the messages and token cap of its request (a re-ask's)."""

    title: str
    reply: Reply
    value: Mapping[str, Any]
    messages: tuple[dict[str, str], ...]
    max_tokens: int


def first_sentence(text: str, limit: int = 240) -> str:
    """The first sentence of a section's prose (headings and code left out), at most ``limit`` characters."""
    prose, fenced = [], False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced or not s or s.startswith("#"):
            continue
        prose.append(s)
        if len(" ".join(prose)) > limit:
            break
    joined = " ".join(prose)
    m = _SENTENCE.match(joined)
    out = (m.group(1) if m else joined).strip()
    return out if len(out) <= limit else out[: limit - 1].rstrip() + "…"


async def repair_code(dispatcher: Dispatcher, journal: Journal, path: str, done: Accepted, body: Body
                      ) -> tuple[Reply, dict[str, Any]]:
    """The section's reply after the one code re-ask (or as it was: nothing to repair, or repaired before) and its
    journal value. The value's ``code_repair``: ``{"languages": [...], "repaired": bool}`` once it was tried."""
    value = dict(done.value)
    if "code_repair" in value:
        return done.reply, value
    report = check_code(done.reply.text)
    if not report.errors:
        return done.reply, value
    follow = [*done.messages, {"role": "assistant", "content": done.reply.text},
              {"role": "user", "content": repair_note(report.errors)}]
    out = await dispatcher.run(path, NodeKind.SECTION, done.title,
                               lambda client, attempt: body(client, follow, done.max_tokens),
                               priority=(1, 0), journaled=False)
    new = out.reply
    languages = sorted({e.language for e in report.errors})
    fixed = (new.ok and new.text.strip() != "" and _parses_and_keeps(report, check_code(new.text))
             and loop_reason(new.text) is None)
    reply = replace(new, attempt=done.reply.attempt + out.attempts) if fixed else done.reply
    value["code_repair"] = {"languages": languages, "repaired": fixed}
    if fixed:
        value.pop("loop_cut", None)  # the new text is a whole answer, not one cut before its loop
    journal.record(path, NodeKind.SECTION, done.title, reply, reply.attempt, value)
    return reply, value


def _parses_and_keeps(first: CodeReport, new: CodeReport) -> bool:
    """Every checked block of the new text parses, and it has at least as many closed blocks, of any language, as the
    first had broken: a re-ask that drops the code it was asked to fix (prose where the example was) repairs nothing,
    and would make "still broken: 0" say nothing about that section. Any language counts, tagged or not: a shell
    session tagged Python is fixed by tagging it ``bash``, and a model may drop the tag of a block it corrects."""
    return not new.errors and new.seen - new.cut >= first.broken


@dataclass(frozen=True)
class Partner:
    """The section another nearly repeats: where it is, what a re-ask is told of it, and how to tell whether a new
    text still repeats it."""

    path: str  # in this book, or "<book id>/<path>" in another of the library
    title: str
    first: str
    repeats: Callable[[str], bool]


def partners_within(sections: Mapping[str, SectionText], accepted: Mapping[str, Accepted]) -> dict[str, Partner]:
    """The later section of each near-duplicate pair of this book -> the earlier one it repeats (most similar first,
    one partner each); sections already asked again (their value's ``dedupe``) are left alone."""
    written = [s for s in sections.values() if not s.error and s.text.strip() and s.path in accepted]
    pairs = near_duplicates([s.text for s in written], [s.shingles for s in written])
    out: dict[str, Partner] = {}
    for i, j, _jac, _con in pairs:
        a, b = sorted((written[i], written[j]), key=lambda s: _order(s.path))
        if b.path not in out and "dedupe" not in accepted[b.path].value:
            out[b.path] = Partner(a.path, a.title, first_sentence(a.text), partial(_repeats, a.text))
    return out


async def repair_duplicates(dispatcher: Dispatcher, journal: Journal, sections: dict[str, SectionText],
                            accepted: Mapping[str, Accepted], body: Body, partner: Mapping[str, Partner]
                            ) -> list[str]:
    """Ask again, once, every section of ``partner`` (path -> the section it nearly repeats); ``sections`` is
    updated in place with the texts that no longer repeat. Returns the paths rewritten."""
    import anyio

    rewritten: list[str] = []

    async def one(path: str, other: Partner) -> None:
        done = accepted[path]
        note = (f'Another section, "{other.title}", already says: "{other.first}" '
                f'Write this section so that it does not repeat that one: say what is particular to '
                f'"{done.title}".')
        messages = [*done.messages[:-1], {"role": "user", "content": done.messages[-1]["content"] + "\n\n" + note}]
        out = await dispatcher.run(path, NodeKind.SECTION, done.title,
                                   lambda client, attempt: body(client, messages, done.max_tokens),
                                   priority=(1, 0), journaled=False)
        new = out.reply
        fixed = (new.ok and new.text.strip() != "" and loop_reason(new.text) is None and not other.repeats(new.text))
        reply = replace(new, attempt=done.reply.attempt + out.attempts) if fixed else done.reply
        value = {**done.value, "dedupe": {"of": other.path, "repaired": fixed}}
        if fixed:
            value.pop("loop_cut", None)  # the new text is a whole answer, not one cut before its loop
        journal.record(path, NodeKind.SECTION, done.title, reply, reply.attempt, value)
        # the re-ask's attempt is over (the views close it) and the section has the text it keeps
        dispatcher.emit(NodeFinished(path, NodeKind.SECTION, done.title, reply, time.monotonic()))
        if fixed:
            rewritten.append(path)
            old = sections[path]
            sections[path] = replace(old, text=new.text, finish_reason=new.finish_reason,
                                     completion_tokens=new.completion_tokens, backend=new.backend or old.backend,
                                     rewritten_from=other.path, loop_cut=False)

    async with anyio.create_task_group() as tg:
        for path, other in partner.items():
            tg.start_soon(one, path, other)
    return rewritten


def partners_across(index: CrossIndex, sections: Mapping[str, SectionText], accepted: Mapping[str, Accepted],
                    taken: Mapping[str, Partner]) -> dict[str, Partner]:
    """``--dedupe reask``: this book's sections that nearly repeat a finished book's (not already partnered within
    the book, not asked again before) -> that section."""
    left = [s for s in sections.values() if not s.error and s.text.strip() and s.path in accepted
            and s.path not in taken and "dedupe" not in accepted[s.path].value]
    out: dict[str, Partner] = {}
    for s, match in zip(left, index.query([s.shingles for s in left]), strict=True):
        if match is not None:
            out[s.path] = Partner(match.key, match.title, match.first_sentence,
                                  partial(_still_repeats, index, match.key))
    return out


def _repeats(first: str, text: str) -> bool:
    return bool(near_duplicates([first, text]))


def _still_repeats(index: CrossIndex, key: str, text: str) -> bool:
    from ..book.textscan import shingles

    match = index.query([shingles(text)])[0]
    return match is not None and match.key == key


def repair_notes(value: Mapping[str, Any]) -> dict[str, Any]:
    """What a section's journal value says was repaired, as SectionText's fields."""
    code, dedupe = value.get("code_repair") or {}, value.get("dedupe") or {}
    return {
        "repaired_from": value.get("repaired_from"),
        "code_repaired": tuple(code.get("languages", ())) if code.get("repaired") else (),
        "rewritten_from": dedupe.get("of") if dedupe.get("repaired") else None,
        "loop_cut": bool(value.get("loop_cut")),
    }


def _order(path: str) -> tuple[int, ...]:
    return tuple(int(x) for x in path.split("."))
