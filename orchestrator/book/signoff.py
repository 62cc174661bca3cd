"""A section's stream read until the model signs off (:class:`SignOffWatch`, ``BackendClient.chat``'s ``stop_when``).

A chat model asked for a section often ends it by talking to whoever asked ("I hope this helps! Let me know if you
have any questions.") and then goes on talking: a P.S., an invented question and its answer, "the edited text", up to
its token cap. book.md prints none of it (:mod:`.talk`), but the servers write it and the job waits for it. Over the
24 SmolLM2-135M books of 36 sections that benchmarks/context_quality.py made at stop 42 (/tmp/cq42*, read with
talk.talk_spans), 243 sections ended in such talk, 237 of them opening with a sign-off; what followed the sign-off
came to 9,018 words, and 30 of those sections ran on to their token cap. The sign-off came after at least 79 words of
the section (most after 150 or more).

The watch reads the stream as it arrives and stops it once the text so far ends in talk, by :func:`.talk.talk_spans`'
own reading (a sentence of paragraph prose, not code, a list or a quote, after something was said), that opens with
a sign-off (:func:`.talk.signs_off`: unmistakable talk, not a weaker opener such as "I hope you ...") and follows at
least ``min_words`` words of the section: the section is then done, and its text so far is the answer (its finish
reason is ``STOPPED``; the talk it ends with is left out of book.md as any is). Only a word the stream has finished is
read: "let me know" is not yet a sign-off in "Let me know" + "ledge".

Cost: a search of the last :data:`LOOK_BACK` characters for a sign-off at each delta that ends a word (microseconds),
and :func:`.talk.talk_spans` on the whole text only where one is found.
"""

from __future__ import annotations

import re

from .talk import SIGN_OFFS, signs_off, talk_spans, words

__all__ = ["LOOK_BACK", "SIGNED_OFF", "SignOffWatch"]

LOOK_BACK = 160  # characters before the newest searched again: a sign-off's words may have come in several deltas
SIGNED_OFF = "the section signed off"  # the reason stop_when returns
_ENDS_WORD = re.compile(r"[\s.,;:!?)\]\"'”’*_]")


class SignOffWatch:
    """``stop_when`` for a section's stream: :data:`SIGNED_OFF` once the text so far ends in a sign-off that follows
    at least ``min_words`` words, else None. ``signed_off`` says whether it stopped the stream."""

    __slots__ = ("_checked", "_text", "min_words", "signed_off")

    def __init__(self, min_words: int) -> None:
        self.min_words = min_words
        self.signed_off = False
        self._text = ""
        self._checked = 0  # the text before this was searched

    def __call__(self, delta: str) -> str | None:
        self._text += delta
        text = self._text
        # The end of the last finished word: a word still being written may yet become another one.
        end = len(text)
        while end > self._checked and not _ENDS_WORD.match(text, end - 1):
            end -= 1
        if end <= self._checked:
            return None
        found = SIGN_OFFS.search(text, max(0, self._checked - LOOK_BACK), end)
        self._checked = end
        if found is None:
            return None
        head = text[:end]
        tail = talk_spans(head).tail
        if tail is None or not signs_off(head, tail) or words(head, 0, tail) < self.min_words:
            return None
        self.signed_off = True
        return SIGNED_OFF
