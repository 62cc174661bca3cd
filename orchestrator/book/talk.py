"""Assistant talk: where a section stops being the section and the model talks to whoever asked for it.

Pure: no I/O, no clock. A chat model asked for a section often answers as a chat model: it signs off ("I hope this
helps! Let me know if you have any questions.", "P.S. Thank you to everyone who supports me"), or it takes the
request for an editing task and reports its edits ("I made several changes to enhance clarity and coherence ...",
"Here's a rewritten version with improved clarity:"). In twelve SmolLM2-135M books of 36 sections on the embedded
engine (benchmarks/context_quality.py, two runs of both ways), 132 of 432 sections held such talk; in a printed
handbook it reads as a letter to a stranger. No other check sees it: it is grammatical, ends in punctuation and
repeats nothing within its section.

:func:`talk_spans` finds it by how it opens, never by what it is about: a sentence of paragraph prose that starts
with one of :data:`OPENERS` (a sign-off, an offer of more help, a report of edits made to "the text"). Where the
section has said something before it, the talk runs to the end of the section (what follows a sign-off is more of
the same: a P.S., a "---" and "the edited text", the heading of a chapter the model went on to invent), and the
span is cut from the sentence that opens it, unless what follows is more than half the section (:data:`TAIL_SHARE`:
then the opener is read as the section's own prose). Where it comes first (a lead-in: "I made several changes ...
Here is the revised text:"), only that paragraph goes, and only when it is short (:data:`LEAD_WORDS`): a long one
may go on to the content, and is kept whole. Code, headings, list items, table rows and quotes are never read: a
sentence in them is content. book.md prints the section without the spans (``assemble.section_body``);
``defects.json`` ``assistant_talk`` names each section, and counts, as every defect does, the text as generated.
"""

from __future__ import annotations

import re

from .fences import FENCE_OPEN, closer

__all__ = ["LEAD_WORDS", "OPENERS", "TAIL_SHARE", "talk_spans", "without_talk"]

LEAD_WORDS = 60  # a talking first paragraph longer than this is kept: it may carry content after its lead-in
# An opener followed by more than this share of the section's words is not where the section ends: it is read as the
# section's own prose ("In my last project I made several changes to the build ..."). The talk that ended a section
# in the twelve books held at most 49% of it (a sign-off, then an invented "What does this text mean?" and a list).
TAIL_SHARE = 0.5

_EDIT_VERB = (r"(?:made|added|rephrased|reorganized|reorganised|revised|rewrote|rewritten|edited|changed|corrected|"
              r"restructured|improved|polished|adjusted|updated|simplified|condensed|expanded|shortened)")
_EDIT_OBJECT = (r"(?:changes|edits|revisions|corrections|transitional|"
                r"the (?:original )?(?:text|passage|paragraph|essay|draft|content|section|response)|"
                r"your (?:text|passage|paragraph|essay|draft|request)|clarity|grammar|readability|coherence|"
                r"word count)")
# How talk to the requester opens (case-insensitive, at the start of a sentence of paragraph prose).
OPENERS = re.compile(
    r"(?:"
    r"I\s+hope\s+(?:this|that|these|it|you|my|the\s+(?:above|information|explanation|essay|text))\b"
    r"|(?:please\s+)?let\s+me\s+know\b"
    r"|feel\s+free\s+to\b"
    r"|don'?t\s+hesitate\s+to\b"
    r"|if\s+you\s+(?:have|need)\s+any\s+(?:other\s+|further\s+|more\s+|additional\s+)?"
    r"(?:questions?|help|assistance|clarifications?|feedback|changes)\b"
    r"|P\.\s?S\.?(?=\s)"
    r"|happy\s+(?:reading|coding|learning|writing)\s*[!.]"
    r"|thank\s+you\s+for\s+(?:reading|your\s+(?:time|request|attention|interest))\b"
    rf"|I(?:\s+have|'ve|’ve)?\s+(?:also\s+)?{_EDIT_VERB}\b[^.!?\n]{{0,60}}?\b{_EDIT_OBJECT}"
    r"|here(?:'s|’s|\s+is)\s+(?:a|an|the|my|your)\s+(?:\w+\s+){0,2}?"
    r"(?:revised|rewritten|edited|updated|improved|polished|corrected|refined|new|shorter|longer)\s+"
    r"(?:version|text|draft|passage|paragraph|essay|section)\b"
    r"|(?:word\s+count|total\s+words)\s*:\s*\d"
    r")",
    re.IGNORECASE,
)
# Where a sentence starts within a paragraph, after its first: past ". ", "! ", "? " (and a closing quote or bracket).
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"”’)]*\s+")
_MARKUP = re.compile(r"[*_]{0,3}")  # emphasis a sentence may open with
# Lines that are content, not a paragraph's prose: headings, list items, table rows, quotes, indented code, math.
_NOT_PROSE = re.compile(r"^(?: {4}|\t)|^\s*(?:#|[-*+•]\s|\d+[.)]\s|\||>|\$\$|\\\[)")
_WORD = re.compile(r"\S+")


def _prose_paragraphs(text: str) -> tuple[list[tuple[int, int]], list[int]]:
    """(start, end) offsets of every paragraph of prose (consecutive prose lines outside code fences, ended by a
    blank line, a fence or a line that is not prose), in order; and the offsets where content that is not prose
    starts (a fenced block, a list item, a table, a quote, ...: not a heading), which counts as something said
    before a talk."""
    paragraphs: list[tuple[int, int]] = []
    content: list[int] = []
    fence: re.Pattern[str] | None = None
    start: int | None = None
    offset = 0
    for line in text.split("\n"):
        end = offset + len(line)
        prose = False
        if fence is not None:
            if fence.match(line):
                fence = None
        elif (m := FENCE_OPEN.match(line)) is not None:
            fence = closer(m.group(2))
            content.append(offset)
        elif line.strip() and not _NOT_PROSE.match(line):
            prose = True
        elif line.strip() and not line.lstrip().startswith("#"):  # a heading says nothing yet
            content.append(offset)
        if prose:
            if start is None:
                start = offset
        elif start is not None:
            paragraphs.append((start, offset - 1))
            start = None
        offset = end + 1
    if start is not None:
        paragraphs.append((start, len(text)))
    return paragraphs, content


def talk_spans(text: str) -> tuple[tuple[int, int], ...]:
    """The spans of ``text`` (start, end offsets) that talk to the requester, in order: at most one lead-in
    paragraphs before anything is said, and the talk that ends the section, from the sentence that opens it to the
    end of ``text`` (module docstring). () when there is none."""
    paragraphs, content = _prose_paragraphs(text)
    total = len(_WORD.findall(text))
    spans: list[tuple[int, int]] = []
    said = False  # something that is not talk came before
    for start, end in paragraphs:
        said = said or any(c < start for c in content)
        starts = [start, *(m.end() for m in _SENTENCE_END.finditer(text, start, end))]
        for at in starts:
            opens = _MARKUP.match(text, at).end()  # type: ignore[union-attr]  # matches the empty string at least
            if opens >= end or not OPENERS.match(text, opens):
                continue
            if said or text[start:at].strip():
                # Content before it, in the section or in its own paragraph: the rest is talk, unless the rest is
                # most of the section.
                if len(_WORD.findall(text, at)) <= TAIL_SHARE * total:
                    return (*spans, (at, len(text)))
                continue
            if len(_WORD.findall(text, start, end)) <= LEAD_WORDS:
                spans.append((start, end))
                break
            said = True  # a long first paragraph that opens with talk and goes on: kept whole
            break
        else:
            said = True
    return tuple(spans)


def without_talk(text: str, spans: tuple[tuple[int, int], ...]) -> str:
    """``text`` with ``spans`` (:func:`talk_spans`) taken out and the ends of what is left tidied: no trailing
    spaces or blank lines where the cut was, no leading blank line where a lead-in was."""
    if not spans:
        return text
    parts: list[str] = []
    at = 0
    for start, end in spans:
        parts.append(text[at:start])
        at = end
    parts.append(text[at:])
    out = "".join(parts)
    out = re.sub(r"\n{3,}", "\n\n", out)
    return out.strip("\n").rstrip()
