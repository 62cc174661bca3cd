"""A section's stream read until the model signs off (:class:`SignOffWatch`, ``BackendClient.chat``'s ``stop_when``).

A chat model asked for a section often ends it by talking to whoever asked ("I hope this helps! Let me know if you
have any questions.") and then goes on talking: a P.S., an invented question and its answer, "the edited text", up to
its token cap. book.md prints none of it (:mod:`.talk`), but the servers write it and the job waits for it. Over the
24 SmolLM2-135M books of 36 sections that benchmarks/context_quality.py made at stop 42 (/tmp/cq42*, read with
talk.talk_spans), 243 sections ended in such talk, 237 of them opening with a sign-off; what followed the sign-off
came to 9,018 words, and 30 of those sections ran on to their token cap. The sign-off came after at least 79 words of
the section (most after 150 or more).

The watch looks at each sentence as it ends (its mark and the space after it: "P." of "P.S." is no end) and stops the
stream after one that signs off to whoever asked (:func:`signs_off_here`): a sentence of paragraph prose (not code, a
list item, a table, a quote or a heading: :func:`.talk.last_sentence`), outside a quotation its paragraph opened, that
opens with a sign-off (:func:`.talk.signs_off`), names the writer ("I", "me", "my") unless it is one that needs no name
("P.S.", "Happy coding!", "Thanks for reading"), and follows at least ``min_words`` words. A handbook's own "Feel
free to contact the lock keeper ..." or "If there is anything else on the bench, clear it first." names no writer and
is read on. The section is then done: its text so far is the answer (finish reason ``STOPPED``, kept by SectionCheck),
and book.md leaves out the sign-off as any talk; a weaker opener before it ("I hope that you found this guide
useful.") does not hide it.

Measured on the 960 sections of /tmp/cq42* and the reference-way books of /tmp/cq43a (written to their end), fed one
word a delta at 83 words (250 asked): 198 stopped, 6,719 words not written, 26 of them sections that had run to the
cap; in 4 the full text's talk_spans had kept more in book.md (talk with more than half the section after it), and
what it kept there was more talk ("Your answer must contain exactly 3 bullet points ...", "(Laughter) P.S. [Your
Name] Founder and Editor at ..."). Cost: 1.4 µs a delta (LoopWatch: 0.5), 0.4 ms a section, on this machine.
"""

from __future__ import annotations

import re

from .talk import last_sentence, signs_off, words

__all__ = ["SIGNED_OFF", "SignOffWatch", "signs_off_here"]

SIGNED_OFF = "the section signed off"  # the reason stop_when returns
# A sentence ended: its mark (and a closing quote, bracket or emphasis) with a space after it, so that "P." of "P.S.",
# "3." of "3.14" and "e.g" of "e.g." are not ends yet.
_ENDED = re.compile(r"[.!?…][\"'”’)\]*_]*(?=\s)")
# Talk to whoever asked, in the sentence itself: the writer names itself ("I hope this helps", "let me know", "feel
# free to ask me"), or one of the sign-offs that need no pronoun. "Feel free to contact the lock keeper", "If there
# is anything else on the bench, clear it first." and "Don't hesitate to ask the ranger" are a handbook's own.
_TO_THE_ASKER = re.compile(r"\b(?:I|me|my)\b|\bP\.S\.|^\W*(?:happy\s+(?:reading|coding|learning|"
                           r"writing)|thanks?(?:\s+you)?\s+for\s+reading|hope\s+(?:this|that|these|it))\b",
                           re.IGNORECASE)


def signs_off_here(text: str, min_words: int) -> bool:
    """Does ``text``, which ends where a sentence ends, end in a sign-off to whoever asked: its last sentence is
    paragraph prose (:func:`.talk.last_sentence`), opens with a sign-off (:func:`.talk.signs_off`), names the writer
    or is one of the sign-offs that need no name (:data:`_TO_THE_ASKER`), is not inside a quotation its paragraph
    opened, and follows at least ``min_words`` words?"""
    found = last_sentence(text)
    if found is None:
        return False
    paragraph, at = found
    if not signs_off(text, at) or words(text, 0, at) < min_words:
        return False
    sentence = text[at:]
    if not _TO_THE_ASKER.search(sentence):
        return False
    before = text[paragraph:at]
    return before.count('"') % 2 == 0 and before.count("“") == before.count("”")


class SignOffWatch:
    """``stop_when`` for a section's stream: :data:`SIGNED_OFF` once a sentence ends that signs off to whoever asked
    after at least ``min_words`` words (:func:`signs_off_here`), else None. ``signed_off`` says whether it stopped the
    stream."""

    __slots__ = ("_checked", "_text", "min_words", "signed_off")

    def __init__(self, min_words: int) -> None:
        self.min_words = min_words
        self.signed_off = False
        self._text = ""
        self._checked = 0  # sentence ends before this were looked at

    def __call__(self, delta: str) -> str | None:
        self._text += delta
        if not any(c.isspace() for c in delta):  # a sentence's end is known by the space after it
            return None
        text = self._text
        # From the last end looked at, or from just before this delta (a mark may have come before the space that ends
        # its sentence): every end found is a new one.
        for m in _ENDED.finditer(text, max(self._checked, len(text) - len(delta) - 8)):
            end = self._checked = m.end()
            if signs_off_here(text[:end], self.min_words):
                self.signed_off = True
                return SIGNED_OFF
        return None
