"""Assistant talk: where a section stops being the section and the model talks to whoever asked for it.

Pure: no I/O, no clock. A chat model asked for a section often answers as a chat model: it signs off ("I hope this
helps! Let me know if you have any questions.", "P.S. Thank you to everyone who supports me"), or it takes the
request for an editing task and reports its edits ("I made several changes to enhance clarity and coherence ...",
"Here's a rewritten version with improved clarity:"). In twelve SmolLM2-135M books of 36 sections on the embedded
engine (benchmarks/context_quality.py, two runs of both ways), 132 of 432 sections held such talk; in a printed
handbook it reads as a letter to a stranger. No other check sees it: it is grammatical, ends in punctuation and
repeats nothing within its section.

:func:`talk_spans` finds it by how it opens, never by what it is about: a sentence of paragraph prose that starts
with one of :data:`OPENERS` (a sign-off, an offer of more help, a report of edits made to "the text" or of what was
kept of "the original text", a critique of "the text above"; a connective or a "[Note]" label may come first). Where the
section has said something before it, the talk runs to the end of the section (what follows a sign-off is more of
the same: a P.S., a "---" and "the edited text", the heading of a chapter the model went on to invent), and the
span is cut from the first such sentence after which at most half the section follows (:data:`TAIL_SHARE`: an
opener with more after it is read as the section's own prose). Only a sign-off (:data:`SIGN_OFFS`: "I hope this
helps", "let me know", "P.S.", an offer to answer questions) may take code, a table, a list or a quote with it; after
a report of edits or a weaker opener the talk ends at the first of those, and none is cut when one follows. Where
talk comes first (a lead-in: "I made several changes ... Here is the revised text:"), only that one paragraph goes,
and only when it is short (:data:`LEAD_WORDS`) and every sentence of it is talk or ends in a colon: a lead-in that
goes on to content keeps its opening (a sign-off later in it still ends the section). A paragraph of that kind between
content, where the talk is followed by most of the section or by content it may not take, goes alone too (``within``:
"Here's a rewritten version of the text ..." between the model's two runs at the section), unless it ends in a colon
right before code, a list, a table or a quote, which it introduces, or is a bare "I hope you ..." (weak: it may end a
section, never cut into one). Code, headings, list items (with their continuation lines), table rows and quotes are
never read: a sentence in them is content. A section that is talk and nothing else is printed as written. book.md
prints the section without the talk (``assemble.section_body``); ``defects.json`` ``assistant_talk`` names each
section, and counts, as every defect does, the text as generated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .fences import FENCE_OPEN, closer

__all__ = ["LEAD_WORDS", "OPENERS", "SIGN_OFFS", "TAIL_SHARE", "Talk", "last_sentence", "signs_off", "talk_spans",
           "without_talk", "words"]

LEAD_WORDS = 60  # a talking first paragraph longer than this is kept: it may carry content after its lead-in
# An opener followed by more than this share of the section's words is not where the section ends: it is read as the
# section's own prose ("In my last project I made several changes to the build ..."). The talk that ended a section
# in the twelve books held at most 49% of it (a sign-off, then an invented "What does this text mean?" and a list).
TAIL_SHARE = 0.5

_EDIT_VERB = (r"(?:made|added|rephrased|reorganized|reorganised|revised|rewrote|rewritten|edited|changed|corrected|"
              r"restructured|improved|polished|adjusted|updated|simplified|condensed|expanded|shortened)")
_REPLY = r"(?:(?:sure|certainly|of\s+course|absolutely|okay|ok)\s*[!,.]\s+)?"  # "Sure! Here's ..."
# Unmistakable talk to whoever asked: what follows one of these is never the section (it may take code or a list).
SIGN_OFFS = re.compile(
    r"(?:so,?\s+|and\s+|again,?\s+|once\s+again,?\s+|overall,?\s+|in\s+(?:conclusion|summary|short),?\s+)?(?:"
    # "I hope this helps", and without its "I" ("Hope this helps!": 8 of some 1,500 sections of stop 43-44's books)
    r"(?:I\s+)?hope\s+(?:this|that|these|it|my|the\s+above)(?:\s+\w+){0,2}?\s+(?:helps?|helped|gives?|gave|provides?|"
    r"has\s+(?:helped|given|provided|been)|(?:was|were|is|are)\s+(?:helpful|useful|clear)|answers?|clarifies|clears|"
    r"serves|makes\s+sense|enhances|inspires?|encourages?)\b"
    r"|I\s+hope\s+you\s+(?:found|find|enjoy|enjoyed|liked|like|learned|agree|have\s+(?:found|enjoyed|learned)|"
    r"now\s+have|got|get|will\s+find|'ll\s+find|’ll\s+find)\b"
    r"|(?:please\s+)?let\s+me\s+know\b"
    r"|feel\s+free\s+to\s+(?:ask|reach\s+out|contact|let\s+me|get\s+in\s+touch|leave\s+a\s+comment|comment|"
    r"share\s+your)\b"
    rf"|I(?:\s+have|'ve|’ve)?\s+(?:also\s+)?{_EDIT_VERB}\b[^.!?\n]{{0,60}}?\b(?:clarity|grammar|readability|coherence|"
    r"transitional|(?:the|your)\s+(?:original\s+)?(?:text|passage|paragraph|essay|draft))\b"
    r"|don['’]?t\s+hesitate\s+to\s+(?:ask|reach\s+out|contact|let\s+me|get\s+in\s+touch)\b"
    r"|(?:if\s+you\s+have\s+any\s+(?:other\s+|further\s+|more\s+|additional\s+)?questions|"
    r"if\s+there(?:'s|’s|\s+is)\s+anything\s+else)\b"
    r"|P\.S\.(?=[\s:*])"
    r"|happy\s+(?:reading|coding|learning|writing)\s*[!.]"
    r"|thank\s+you\s+for\s+(?:reading|your\s+(?:time|request|attention|interest))\b|thanks\s+for\s+reading\b"
    r")",
    re.IGNORECASE,
)
_TEXT = r"(?:text|passage|paragraph|essay|draft)"
_EDIT_OBJECT = (r"(?:changes|edits|revisions|corrections|transitional|"
                r"the (?:original )?(?:text|passage|paragraph|essay|draft|content|response)|"
                r"your (?:text|passage|paragraph|essay|draft|request)|"
                # a text the model believes it was given: "this text", "the second paragraph" (not "the request
                # method", "the response headers": a handbook's own words)
                rf"(?:this|that|my)\s+(?:original\s+)?{_TEXT}\b|"
                rf"the\s+(?:above|revised|edited|first|second|third|last|final|previous|opening)\s+{_TEXT}\b|"
                r"clarity|grammar|readability|coherence|word count)")
# A report of what was kept of "the original text" may follow a connective that sums up ("Therefore, I made changes
# to the original text ..."); any report may follow a label the model set before it on a line of its own ("[Note]\nI
# made changes to enhance clarity ..."). The pronoun is a capital I alone: "World War I destroyed the original
# version of the organ", "Appendix I reproduces the original text of the treaty" are a book's prose.
_CONNECTIVE = r"(?:(?:therefore|overall|in\s+summary|in\s+short|in\s+conclusion),?\s+)?"
_LABEL = r"(?:\[\s*(?:note|editor'?s\s+note)\s*\]\s*|(?:editor'?s\s+)?note\s*:\s*(?=I\b))?"
_KEPT = (r"(?:tried|kept|maintained|preserved|retained|ensured|made\s+sure|aimed|focused|"
         rf"made\s+(?:\w+\s+){{0,2}}?(?:changes|edits)|{_EDIT_VERB})")
# Every opener of talk (case-insensitive, at the start of a sentence of paragraph prose): a sign-off, a report of the
# edits the model believes it made to "the text", the text it offers as revised, a word count.
OPENERS = re.compile(
    rf"{_REPLY}{_LABEL}(?:{SIGN_OFFS.pattern}"
    rf"|I(?:\s+have|'ve|’ve)?\s+(?:also\s+)?{_EDIT_VERB}\b[^.!?\n]{{0,60}}?\b{_EDIT_OBJECT}"
    # what it kept of "the original text" it believes it was asked to edit
    rf"|{_CONNECTIVE}(?-i:I)(?:\s+have|'ve|’ve)?\s+(?:also\s+)?{_KEPT}\b[^.!?\n]{{0,100}}?\b(?:the|this|your)\s+"
    r"original\s+(?:text|version|passage|paragraph|content|message|meaning|essay)\b"
    # a critique of the text it was given ("This paragraph contains several sentences that could be improved ...")
    rf"|(?:the|this)\s+(?:text|paragraph|passage)(?:\s+above)?\s+contains\b[^.!?\n]{{0,80}}?\b(?:be\s+(?:improved|"
    r"rewritten|revised|condensed|rephrased|edited|shortened|simplified)|requires?\s+(?:rewriting|revision|revising|"
    r"editing))\b"
    # what it did to it ("The chapter on ... has been condensed into just two sentences.")
    r"|(?:the|this)\s+(?:\w+\s+){0,6}?(?:text|passage|paragraph|essay|draft|chapter)\b[^.!?\n]{0,60}?\bha(?:s|ve)\s+"
    r"been\s+(?:condensed|shortened|rewritten|summari[sz]ed|reduced)\s+(?:in(?:to)?\s+|to\s+)(?:just\s+|only\s+)?(?:a\s+few|one|two|"
    r"three|four|five|\d+)\s+(?:short\s+|concise\s+)?(?:sentences|paragraphs|words)\b"
    r"|(?:a\s+)?summary\s+of\s+the\s+(?:above|original)\s+text\b"
    r"|I\s+hope\s+(?:that\s+)?you\b"
    r"|here(?:'s|’s|\s+is)\s+(?:a|an|the|my|your)\s+(?:\w+\s+){0,2}?(?:revised|rewritten|edited|polished|refined)\s+"
    r"(?:version|text|draft|passage|paragraph|essay)\b"
    r"(?!\s+of\s+(?:the|this|that|our|a)\s+(?!text|passage|paragraph|essay))"  # "... version of the function"
    r"|(?:word\s+count|total\s+words)\s*:\s*\d"
    r")",
    re.IGNORECASE,
)
# A sign-off where a sentence opens, as OPENERS reads one ("Sure! I hope this helps", "[Note] Let me know ...").
_SIGN_OFF_OPENER = re.compile(rf"{_REPLY}{_LABEL}(?:{SIGN_OFFS.pattern})", re.IGNORECASE)
# An opener too weak to take a paragraph out from between content on its own ("I hope you have packed warm clothes,
# because the pass is cold at night."): where it is not also a sign-off, it may end a section, never cut into one.
_HOPE_YOU = re.compile(rf"{_REPLY}I\s+hope\s+(?:that\s+)?you\b", re.IGNORECASE)
# Where a sentence starts within a paragraph, after its first: past ". ", "! ", "? " (and a closing quote or bracket).
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"”’)*_]*\s+")
_MARKUP = re.compile(r"[*_]{0,3}")  # emphasis a sentence may open with
# Lines that are content, not a paragraph's prose: headings, list items, table rows, quotes, indented code, math.
_NOT_PROSE = re.compile(r"^(?: {4}|\t)|^\s*(?:#|[-*+•]\s|\d+[.)]\s|\||>|\$\$|\\\[)")
_CONTAINER = re.compile(r"^\s*(?:[-*+•]\s|\d+[.)]\s|>)")  # a list item or a quote: its next lines belong to it
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Talk:
    """Where a section's text talks to whoever asked for it: ``lead`` the (start, end) of a lead-in paragraph, ``tail``
    the offset from which the rest of the text is talk; falsy when it holds none."""

    lead: tuple[int, int] | None = None
    tail: int | None = None
    within: tuple[tuple[int, int], ...] = ()  # (start, end) of short paragraphs of talk between content, in order

    def __bool__(self) -> bool:
        return self.lead is not None or self.tail is not None or bool(self.within)

    def spans(self, size: int) -> tuple[tuple[int, int], ...]:
        """The (start, end) offsets to take out of a text of ``size`` characters, in order."""
        return tuple(x for x in (self.lead, *self.within, None if self.tail is None else (self.tail, size))
                     if x is not None)

    @property
    def at(self) -> str:
        """Where the section talks, as defects.json ``assistant_talk`` says it: "start" (a lead-in), "end" (the talk
        that ends it), "both", or "within" (only paragraphs of talk between its content)."""
        if self.lead is not None:
            return "start" if self.tail is None else "both"
        return "end" if self.tail is not None else "within"


def _prose_paragraphs(text: str) -> tuple[list[tuple[int, int]], list[int]]:
    """(start, end) offsets of every paragraph of prose (consecutive prose lines outside code fences, ended by a
    blank line, a fence or a line that is not prose), in order; and the offsets where content that is not prose
    starts (a fenced block, a list item and its continuation lines, a table, a quote, ...: not a heading), which
    counts as something said before a talk."""
    paragraphs: list[tuple[int, int]] = []
    content: list[int] = []
    fence: re.Pattern[str] | None = None
    start: int | None = None
    container = ""  # "list" or "quote" within one: its continuation lines (lazy or indented) are its own
    blank = True
    offset = 0
    for line in text.split("\n"):
        kind = "content"
        if fence is not None:
            if fence.match(line):
                fence = None
        elif (m := FENCE_OPEN.match(line)) is not None:
            fence = closer(m.group(2))
        else:
            kind, container = _line_kind(line, container, blank)
        if kind == "content":
            content.append(offset)
        if kind == "prose":
            start = offset if start is None else start
        elif start is not None:
            paragraphs.append((start, offset - 1))
            start = None
        blank = kind == "blank"
        offset += len(line) + 1
    if start is not None:
        paragraphs.append((start, len(text)))
    return paragraphs, content


def _line_kind(line: str, container: str, blank: bool) -> tuple[str, str]:
    """A line outside code fences: "prose", "content", "heading" (which says nothing yet) or "blank"; and the list
    item or quote ("list", "quote" or "") the lines after it may continue. A list item's or a quote's continuation
    line is content (indented, or lazy: right after it), except a lazy line after a list item that opens with a
    sign-off: the model's sign-off after a numbered list is not part of its last item."""
    if not line.strip():
        return "blank", container
    if (m := _CONTAINER.match(line)) is not None:
        return "content", "quote" if m.group().strip() == ">" else "list"
    if container and (line[:1] in (" ", "\t") or not blank):
        if container == "list" and not blank and SIGN_OFFS.match(line, _MARKUP.match(line).end()):  # type: ignore[union-attr]
            return "prose", ""
        return "content", container
    if not _NOT_PROSE.match(line):
        return "prose", ""
    return ("heading" if line.lstrip().startswith("#") else "content"), ""


def talk_spans(text: str) -> Talk:
    """Where ``text`` talks to whoever asked for it (module docstring): at most one lead-in paragraph before anything
    is said, and the talk that ends the section, from the sentence that opens it to the end of ``text``."""
    paragraphs, content = _prose_paragraphs(text)
    total = words(text)
    lead: tuple[int, int] | None = None
    within: list[tuple[int, int]] = []
    said = False  # something that is not talk came before
    for start, end in paragraphs:
        said = said or any(c < start for c in content)
        starts = _sentence_starts(text, start, end)
        for k, at in enumerate(starts):
            opens = _MARKUP.match(text, at).end()  # type: ignore[union-attr]  # matches the empty string at least
            if opens >= end or not OPENERS.match(text, opens):
                continue
            if said or k:
                # Content before it, in the section or in its own paragraph: the rest is talk, unless the rest is
                # most of the section, or it would take content with it and does not open with a sign-off. Then a
                # paragraph that is talk and nothing else goes alone, as a lead-in does ("I've covered several
                # topics so far ... Here's a rewritten version of the text:" between two runs of the section).
                if words(text, at) > TAIL_SHARE * total or (
                        not SIGN_OFFS.match(text, opens) and any(c > at for c in content)):
                    if k == 0 and _all_talk(text, starts, end, strong=True) and not _introduces(text, end, content):
                        within.append((start, end))
                        break
                    continue
                return Talk(lead, at, tuple(within))
            if lead is None and _all_talk(text, starts, end):
                lead = (start, end)
                break
            # a first paragraph that opens with talk and goes on to content keeps its opening; a sign-off further on
            # in it still ends the section
            said = True
        else:
            said = True
    return Talk(lead, None, tuple(within))


def _introduces(text: str, end: int, content: list[int]) -> bool:
    """Does the paragraph ending at ``end`` end in a colon with code, a list, a table or a quote right after it (what
    it introduces: "I've simplified the content below to one function:" stays with its code)?"""
    if not text[:end].rstrip().rstrip("*_").endswith(":"):
        return False
    return any(c >= end and not text[end:c].strip() for c in content)


def _all_talk(text: str, starts: list[int], end: int, strong: bool = False) -> bool:
    """A lead-in paragraph goes only when it is short and each of its sentences is talk or ends in a colon (what
    introduces the text); ``strong`` (a paragraph between content): talk that is more than a bare "I hope you ..."."""
    if words(text, starts[0], end) > LEAD_WORDS:
        return False
    bounds = [*starts[1:], end]
    for at, stop in zip(starts, bounds):
        sentence = text[at:stop].strip()
        opens = _MARKUP.match(text, at).end()  # type: ignore[union-attr]
        if not (OPENERS.match(text, opens) or sentence.rstrip("*_").endswith(":")):
            return False
        if strong and _HOPE_YOU.match(text, opens) and not SIGN_OFFS.match(text, opens):
            return False
    return True


def without_talk(text: str, talk: Talk) -> str:
    """``text`` with ``talk`` (:func:`talk_spans`) taken out, tidied only where the cuts were: no trailing spaces or
    blank lines where the tail was, no blank lines left where the lead-in was, and an emphasis the tail cut in two
    closed again. Nothing else changes (a code block's blank lines stay)."""
    if not talk:
        return text
    out = text if talk.tail is None else text[: talk.tail].rstrip()
    if talk.tail is not None and not text[: talk.tail].rstrip(" \t").endswith("\n"):
        # The tail cut inside a paragraph that opened with emphasis ("**Remember: ... Feel free to ask.**"): close it.
        last = out[out.rfind("\n") + 1:]
        run = _MARKUP.match(last).group()  # type: ignore[union-attr]
        if run and last.count(run) % 2:
            out += run[::-1]
    for start, end in reversed((*((talk.lead,) if talk.lead is not None else ()), *talk.within)):
        # last first, so that the offsets of the paragraphs before stay those of ``text``
        before, after = out[:start].rstrip(), out[end:].lstrip("\n")
        out = f"{before}\n\n{after}" if before else after
    return out.strip("\n")


def _sentence_starts(text: str, start: int, end: int) -> list[int]:
    """Where the sentences of the paragraph ``text[start:end]`` start: its start, and past each sentence's end."""
    return [start, *(m.end() for m in _SENTENCE_END.finditer(text, start, end))]


def signs_off(text: str, at: int) -> bool:
    """Does the sentence at ``at`` (a :class:`Talk`'s ``tail``) open with a sign-off (:data:`SIGN_OFFS`), unmistakable
    talk, rather than with a weaker opener?"""
    return _SIGN_OFF_OPENER.match(text, _MARKUP.match(text, at).end()) is not None  # type: ignore[union-attr]


def words(text: str, start: int = 0, end: int | None = None) -> int:
    """The words of ``text[start:end]``, counted as :func:`talk_spans` counts them."""
    return len(_WORD.findall(text, start, len(text) if end is None else end))


def last_sentence(text: str) -> tuple[int, int] | None:
    """(where its paragraph starts, where it opens, past emphasis) of the last sentence of ``text`` where ``text``
    ends in paragraph prose, as :func:`talk_spans` reads it (not in code, a list item, a table, a quote or a
    heading); else None."""
    paragraphs, _ = _prose_paragraphs(text)
    if not paragraphs or paragraphs[-1][1] != len(text):
        return None
    start, end = paragraphs[-1]
    at = max(s for s in _sentence_starts(text, start, end) if s < end)
    return start, _MARKUP.match(text, at).end()  # type: ignore[union-attr]
