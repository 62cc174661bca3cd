"""The book brief (``--context outline``): who the book is for, its voice, one running example and the terms it uses
the same way everywhere, in at most about 150 words, carried by every section request so that sections written
separately read as one book.

How it is asked, and why so:

* **Its own request, started with the book node and run beside the whole outline.** Not a property of the book
  node's JSON reply: after the items it would end the book reply ~200 tokens later, and before them it would delay
  every part; in a few-shot numbered list (profile "small") a paragraph after the list is what a 135M model gets
  wrong, and the title parser would have to tell it from the list. A brief of its own changes nothing in the
  planning requests (``--context none`` and ``outline`` plan with the same prompts), and its ~140 tokens of decoding
  overlap the book, part and chapter levels: with ``outline`` a section needs its chapter's whole list and its
  part's (its request names them all), which take longer than the brief, so it waits for nothing in the common case.
* **Optional, bounded, never an exception.** A model or server that fails it twice (:data:`BRIEF_ATTEMPTS`, a
  shorter bound than a planning node's: sections wait for it), or a reply with no usable prose, gives the empty
  brief, logged: the book is written without one. A template error is still a configuration error.
* **Journaled like a node** (path :data:`BRIEF_PATH`, kind "brief", titled with the request), so a rerun carries the
  same brief and the sections an earlier run wrote keep their context. A brief that failed is journaled as failed:
  a rerun keeps "no brief" once the journal holds sections written without one, and asks again otherwise.
* **In the event stream as a node of its own kind** (``NodeKind.BRIEF``, path :data:`BRIEF_PATH`): the views count
  it as a planning request and show it beside the outline's nodes, never inside the tree the paths of the outline
  make ("" book, "3" part, "3.7" chapter). It runs on a Dispatcher of its own (its own attempt bound) over the same
  fleet, journal and events; its requests and replies are added to the job's Dispatcher, so ``requests`` and
  ``planning_requests`` count it (one more than the published take's 105 at 8 x 12 x 16 with ``outline``).
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

from ..book.checks import loop_reason
from ..book.fences import fenced_code
from ..core.events import NodeFinished
from ..core.outline import normal_brief
from ..core.profiles import Profile
from ..core.prompts import book_phrase, render
from ..core.reply import Reply
from ..core.states import NodeKind
from ..dispatch.dispatcher import Dispatcher
from ..dispatch.journal import StoredNode
from .made import book_title_from_prompt

if TYPE_CHECKING:
    from ..wire.client import BackendClient

__all__ = ["BRIEF_ATTEMPTS", "BRIEF_PATH", "BRIEF_WORDS", "MAX_BRIEF_WORDS", "ask_brief", "clean_brief"]

log = logging.getLogger("handbook")

BRIEF_PATH = "brief"  # its journal row: beside the outline's paths ("" book, "1" part, ...), never one of them
BRIEF_WORDS = 100  # asked for; a model's "about 100" runs to ~120
MAX_BRIEF_WORDS = 150  # kept at most: a longer reply is cut back to its last sentence within this
MIN_BRIEF_WORDS = 8  # fewer is no brief (a title, an echo of the request)
BRIEF_ATTEMPTS = 2  # one retry for a transient error; sections wait for it, so it gets no more
BRIEF_MAX_TOKENS = 260  # 150 words at ~1.42 tokens each, and a sentence's room to end

# Lines that are the model talking or labelling rather than the brief ("Here is the brief:", "# Book brief").
_LEAD_IN = re.compile(r"^(?:here(?:'s| is)|sure\b|certainly|of course|below is)", re.IGNORECASE)
_LABEL = re.compile(r"^(?:\*\*|__)?(?:the\s+)?(?:book\s+)?brief(?:\*\*|__)?\s*[:\-–—]\s*(?:\*\*|__)?\s*", re.IGNORECASE)
_LEAD_IN_END = re.compile(r"[:.!?](?:\s|$)")  # where a lead-in ends: its colon or its first sentence
_MARKER = re.compile(r"^(?:[-*•+]|\d+[.)])\s+")
_SENTENCE_END = re.compile(r"[.!?][\"'”’)]?(?=\s|$)")


def clean_brief(text: str, truncated: bool = False) -> str:
    """The brief a reply holds, in normal form (:func:`~orchestrator.core.outline.normal_brief`), or "" when it
    holds none: code, headings, list markers, labels and lead-ins dropped, at most :data:`MAX_BRIEF_WORDS` words
    ending on a sentence. ``truncated`` (the reply hit its token cap): cut back to its last complete sentence. A reply
    caught in a repetition loop (:func:`~orchestrator.book.checks.loop_reason`) holds none: its first 150 words would
    be one sentence over and over, carried by every section request."""
    for code in fenced_code(text):
        text = text.replace(code, "")
    if loop_reason(text):  # after the code is gone: a sample's repeated lines are no loop of the brief's
        return ""
    lines: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        while line and _LEAD_IN.match(line):  # "Sure! Here is the brief: This book is for..." keeps "This book..."
            m = _LEAD_IN_END.search(line)
            line = line[m.end():].strip() if m else ""
        if not line or line.startswith(("```", "~~~", "#")) or (line.endswith(":") and len(line.split()) <= 8):
            lines.append("")
            continue
        line = _LABEL.sub("", _MARKER.sub("", line)).replace("**", "").replace("__", "")
        lines.append(line)
    brief = normal_brief("\n".join(lines))
    words = brief.split(" ")
    if truncated or len(brief.split()) > MAX_BRIEF_WORDS:
        brief = _cut_to_sentence(brief, MAX_BRIEF_WORDS)
    elif not _SENTENCE_END.search(words[-1] if words else ""):
        brief = _cut_to_sentence(brief, MAX_BRIEF_WORDS) or brief
    return brief if len(brief.split()) >= MIN_BRIEF_WORDS else ""


def _cut_to_sentence(brief: str, limit: int) -> str:
    """``brief`` up to the end of its last sentence that ends within ``limit`` words ("" if none does)."""
    head = brief
    count = 0
    for m in re.finditer(r"\S+", brief):
        count += 1
        if count > limit:
            head = brief[: m.start()]
            break
    ends = list(_SENTENCE_END.finditer(head))
    return normal_brief(head[: ends[-1].end()]) if ends else ""


class _BriefRequest:
    """The brief's request to the Dispatcher: its body, its check, and its journaled value."""

    def __init__(self, d: Dispatcher, profile: Profile, prompt: str, templates: str | None):
        self.d = d
        self.profile = profile
        self.prompt = prompt
        self.templates = templates

    def build(self, client: BackendClient, attempt: int) -> dict[str, Any]:
        p = self.profile
        assert p.brief_template is not None  # the planner asks no brief of a profile without one
        text = render(p.brief_template, self.templates, request=self.prompt, words=BRIEF_WORDS,
                      book_phrase=book_phrase(book_title_from_prompt(self.prompt)))
        return client.body(
            p.messages(text),
            max_tokens=BRIEF_MAX_TOKENS,
            temperature=p.temperature if p.plan_temperature is None else p.plan_temperature,
            sampling=p.sampling(),
        )

    def validate(self, reply: Reply) -> str:
        # Never unusable: a reply with no brief in it is no brief, not a reason to ask again (sections wait).
        brief = clean_brief(reply.text, truncated=reply.finish_reason == "length")
        if not brief:
            log.warning("the book brief's reply held no usable brief (%d characters); writing without one",
                        len(reply.text))
        return brief

    def restore(self, stored: StoredNode) -> str | None:
        value = stored.value
        if not isinstance(value, dict) or not isinstance(value.get("brief"), str):
            return None
        journal = self.d.journal
        if value.get("failed") and journal is not None and not any(
            n.kind == NodeKind.SECTION for n in journal.nodes.values()
        ):
            return None  # it failed before any section was written without it: ask again
        return normal_brief(value["brief"])


async def ask_brief(d: Dispatcher, profile: Profile, prompt: str, templates: str | None = None) -> str:
    """The brief of the book asked for by ``prompt``, through ``d``'s fleet and journal; "" when it cannot be had."""
    # A Dispatcher of its own: a smaller attempt bound than planning nodes' (see the module's doc).
    sub = Dispatcher(d.fleet, d.emit, min(BRIEF_ATTEMPTS, d.attempts), False, journal=d.journal, rank=d.rank)
    request = _BriefRequest(d, profile, prompt, templates)
    try:
        out = await sub.run(BRIEF_PATH, NodeKind.BRIEF, prompt, request.build, request.validate,
                            priority=(0, 0), restore=request.restore, keep=lambda b: {"brief": b})
    finally:  # also when cancelled: what was sent is counted
        d.requests += sub.requests
        d.replies.extend(sub.replies)
    if out.value is not None:
        d.emit(NodeFinished(BRIEF_PATH, NodeKind.BRIEF, prompt, out.reply, time.monotonic()))
        return out.value
    log.warning("the book brief could not be made (%d attempts: %s); writing without one", out.attempts,
                out.reply.error)
    if d.journal is not None:
        d.journal.record(BRIEF_PATH, NodeKind.BRIEF, prompt, out.reply, out.attempts,
                         {"brief": "", "failed": True})
    return ""
