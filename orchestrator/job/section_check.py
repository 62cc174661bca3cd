"""The check every section reply passes before it is accepted (:class:`SectionCheck`), and the small rules the
Writer orders and resumes sections by."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..book.checks import LoopWatch, loop_reason, norm_title
from ..book.loopcut import loop_cut
from ..book.signoff import SignOffWatch
from ..core.config import Settings
from ..core.reply import STOPPED, Reply

__all__ = ["SectionCheck", "accepted_value", "order_base"]


class SectionCheck:
    """Validates a section reply (the Dispatcher retries what raises ValueError).

    * A reply that holds nothing but headings repeating its own title (a small model printing the heading and
      stopping) is empty: asked again like an empty answer.
    * A reply caught in a repetition loop (checks.loop_reason) is kept cut before its loop when it can be
      (``keep_words``, below); else asked again once, with the profile's stronger anti-repetition settings (``build``
      sees ``loop`` set), and what the re-ask gives is kept even if it loops too (cut before its loop where it can
      be), and defects.json reports it. The value is ``{"repaired_from": why, "loop": why the accepted text still
      loops, or None}`` (journaled with the section; the Writer seeds ``SectionText.loop`` with it).
    * :meth:`watcher` gives the first answer's stream a :class:`~orchestrator.book.checks.LoopWatch`: a loop is
      caught as it streams, the stream stopped (finish_reason ``STOPPED``) and the re-ask sent at once, where the
      token cap would have let the loop run on. An answer stopped for a loop is accepted only cut before its loop.
      The re-ask is not watched for loops: what it gives is kept, as above.
    * With ``sign_off_words`` set (Settings.stop_at_sign_off), every attempt's stream is also read by a
      :class:`~orchestrator.book.signoff.SignOffWatch`: an answer that signs off to whoever asked, after at least
      that many words, is stopped there and accepted as the section (book.md leaves the sign-off out), where the
      model would have talked on, up to its token cap.
    * With ``keep_words`` set, an answer that loops is first cut before its loop (:func:`~orchestrator.book.loopcut.
      loop_cut`): when what it said before the loop holds at least that many words and loops no more, it is kept as
      the section (the value's ``loop_cut`` is the offset; the Writer prints ``kept_before_loop``), where the first
      answer would have been asked again and the re-ask printed looping."""

    def __init__(self, title: str, sign_off_words: int | None = None, keep_words: int | None = None):
        self.want = norm_title(title)
        self.loop: str | None = None  # why the first answer looped, once it did
        self.sign_off_words = sign_off_words
        self.keep_words = keep_words
        self._sign_off: SignOffWatch | None = None  # the watch of the attempt under way

    def watcher(self) -> Callable[[str], str | None] | None:
        """The stop_when of the next attempt's stream (``Dispatcher.run``'s ``watch``)."""
        loop = LoopWatch() if self.loop is None else None
        self._sign_off = None if self.sign_off_words is None else SignOffWatch(self.sign_off_words)
        if self._sign_off is None or loop is None:
            return loop or self._sign_off
        return partial(_either, loop, self._sign_off)

    def __call__(self, reply: Reply) -> dict[str, Any]:
        if reply.finish_reason == STOPPED and not (self._sign_off is not None and self._sign_off.signed_off):
            # a LoopWatch stopped it: the text so far loops
            caught = loop_reason(reply.text) or "a repetition loop caught while streaming"
            if (kept := self._cut(reply.text, caught)) is not None:
                return kept
            self.loop = self.loop or caught
            raise ValueError(f"repetition loop ({self.loop}) caught while streaming: asked again with stronger "
                             "anti-repetition settings")
        if not any(s and norm_title(s) != self.want
                   for s in (line.strip().strip("#*_=- ").strip() for line in reply.text.splitlines())):
            raise ValueError("the reply only repeats the section heading")
        if (why := loop_reason(reply.text)) and (kept := self._cut(reply.text, why)) is not None:
            return kept
        if self.loop is None:
            if why:
                self.loop = why
                raise ValueError(f"repetition loop ({why}): asked again with stronger anti-repetition settings")
            return {"repaired_from": None, "loop": None}
        return {"repaired_from": self.loop, "loop": why}

    def _cut(self, text: str, why: str) -> dict[str, Any] | None:
        """The value of an answer kept cut before its loop (``why``), or None when it cannot be (too little before
        it, or none of these checks asked)."""
        if self.keep_words is None or (at := loop_cut(text, self.keep_words)) is None:
            return None
        return {"repaired_from": self.loop or why, "loop": None, "loop_cut": at}


def _either(loop: LoopWatch, sign_off: SignOffWatch, delta: str) -> str | None:
    """Both watches of a first answer, each fed every delta: the first reason either gives."""
    return loop(delta) or sign_off(delta)


def order_base(chapter_path: str, settings: Settings) -> int:
    pi, ci = (int(x) for x in chapter_path.split("."))
    return ((pi - 1) * settings.chapters + (ci - 1)) * (settings.sections + 1)


def accepted_value(value: Any) -> dict[str, Any]:
    """A stored section's accepted value (its repair note), without the context it was journaled with."""
    return {k: v for k, v in value.items() if k != "context"} if isinstance(value, dict) else {}
