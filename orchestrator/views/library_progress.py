"""Seeing a library run: books done / in flight / waiting, sections, the server-counted rate, one line per book in
flight.

The library (``orchestrator.job.library``) tells its consumers how many books there are (:class:`LibraryStarted`)
and of each book it starts and finishes (:class:`BookStarted`, :class:`BookFinished`), passes every book's own
events to those that have a ``book_event(book_id, event)`` method (:meth:`LibraryState.book_event`)
and the fleet's (:class:`~orchestrator.core.events.MetricsSample` from the one sampler of the library: the rate is
the servers' counted rate, never timed here). :class:`LibraryProgress` prints its state as plain lines every few
seconds (the library runs for hours: a line a period is what a log of it wants).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from ..core.events import MetricsSample, NodeFailed, NodeFinished, OutlineReady


@dataclass(frozen=True)
class LibraryStarted:
    """The library was read and its fleet is up: ``books`` in this shard, ``carried`` of them done before this run."""

    books: int
    carried: int
    t: float
    forecast: dict[str, Any] | None = None  # the library's forecast.json (--forecast), None without one


@dataclass(frozen=True)
class BookStarted:
    """A book of the library was handed to the fleet (``rank``: its place in the library, oldest first)."""

    id: str
    prompt: str
    rank: int
    t: float


@dataclass(frozen=True)
class BookFinished:
    """A book of the library ended: ``status`` "complete", "failed" (a section failed or came back empty, or its
    planning failed: ``error``) or "incomplete"."""

    id: str
    status: str
    sections: int
    tokens: int
    t: float
    error: str | None = None


@dataclass
class _Book:
    prompt: str
    sections_total: int | None = None
    sections_done: int = 0
    failed: int = 0
    title: str | None = None  # the book's title, once its outline is known
    recent: list[str] = field(default_factory=list)  # the titles of its last sections written (at most RECENT)


RECENT = 6
FINISHED_SHOWN = 200  # books finished, newest first, that a snapshot lists


@dataclass
class LibraryState:
    """Where the library stands. ``books_total``: the books of this shard; ``carried``: done before this run."""

    books_total: int = 0
    carried: int = 0
    done: int = 0
    failed: int = 0
    sections_done: int = 0
    tokens: int = 0
    rate: float | None = None  # the servers' counted rate over the last second
    in_flight: dict[str, _Book] = field(default_factory=dict)
    forecast: dict[str, Any] | None = None
    finished: list[dict[str, Any]] = field(default_factory=list)  # the last FINISHED_SHOWN books ended, oldest first
    t_start: float = field(default_factory=time.monotonic)

    def __call__(self, event: Any) -> None:
        """Library-level events: books started and finished, the fleet's samples."""
        if isinstance(event, LibraryStarted):
            self.books_total, self.carried, self.forecast = event.books, event.carried, event.forecast
        elif isinstance(event, BookStarted):
            self.in_flight[event.id] = _Book(event.prompt)
        elif isinstance(event, BookFinished):
            b = self.in_flight.pop(event.id, None)
            self.finished.append({"id": event.id, "title": b.title if b else None, "status": event.status,
                                  "sections": event.sections, "tokens": event.tokens, "error": event.error})
            del self.finished[:-FINISHED_SHOWN]
            if event.status == "complete":
                self.done += 1
            else:
                self.failed += 1
        elif isinstance(event, MetricsSample):
            self.rate = None if event.rate_tok_s is None else float(event.rate_tok_s)

    def book_event(self, book_id: str, event: Any) -> None:
        """One book's own event (its sections finishing, its outline known)."""
        b = self.in_flight.get(book_id)
        if b is None:
            return
        if isinstance(event, OutlineReady):
            b.sections_total = event.outline.shape[2]
            b.title = event.outline.title
        elif isinstance(event, NodeFinished) and event.kind == "section":
            b.sections_done += 1
            b.recent.append(event.title)
            del b.recent[:-RECENT]
            self.sections_done += 1
            self.tokens += event.reply.completion_tokens
        elif isinstance(event, NodeFailed) and event.kind == "section" and event.final:
            b.failed += 1

    @property
    def waiting(self) -> int:
        return max(0, self.books_total - self.carried - self.done - self.failed - len(self.in_flight))

    def eta(self) -> float | None:
        """Seconds left: the forecast's tokens not yet written, at the servers' counted rate (None without both)."""
        if not self.forecast or not self.rate:
            return None
        return max(0.0, self.forecast["tokens"] - self.tokens) / self.rate

    def snapshot(self) -> dict[str, Any]:
        """The state as plain data (the library feed's /status): totals, the books in flight, the last finished."""
        return {
            "books": self.books_total, "carried": self.carried, "done": self.done, "failed": self.failed,
            "waiting": self.waiting, "sections_done": self.sections_done, "tokens": self.tokens, "rate": self.rate,
            "eta_s": self.eta(), "forecast_s": (self.forecast or {}).get("whole_job_s"),
            "elapsed_s": time.monotonic() - self.t_start,
            "in_flight": [{"id": i, "title": b.title, "prompt": b.prompt, "sections_done": b.sections_done,
                           "sections_total": b.sections_total, "failed": b.failed, "recent": list(b.recent)}
                          for i, b in list(self.in_flight.items())],
            "finished": list(reversed(self.finished)),
        }

    def lines(self) -> list[str]:
        """The state as text: a summary line, then one line per book in flight (oldest first)."""
        elapsed = time.monotonic() - self.t_start
        rate = "rate -" if self.rate is None else f"rate {self.rate:,.0f} tok/s (server-counted)"
        head = (f"[{elapsed:6.0f}s]  books {self.carried + self.done}/{self.books_total} done"
                f"{f' ({self.carried} before this run)' if self.carried else ''}, {len(self.in_flight)} in flight, "
                f"{self.waiting} waiting, {self.failed} failed  sections {self.sections_done:,}  "
                f"tokens {self.tokens:,}  {rate}")
        eta = self.eta()
        if eta is not None:
            head += f"  ETA {eta:,.0f} s (forecast {self.forecast['whole_job_s']:,.0f} s)"  # type: ignore[index]
        rows = [f"    {book_id}: {b.sections_done}/{b.sections_total if b.sections_total is not None else '?'} "
                f"sections" + (f", {b.failed} failed" if b.failed else "") for book_id, b in self.in_flight.items()]
        return [head, *rows]


class LibraryProgress:
    """Plain lines of a :class:`LibraryState` every ``interval`` seconds (a daemon thread), and once at
    :meth:`stop`."""

    def __init__(self, state: LibraryState, interval: float = 5.0, stream: IO[str] | None = None):
        self.state = state
        self.interval = interval
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="library-progress", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.print()

    def print(self) -> None:
        if not self.state.books_total:  # the library has not started (a bad line, no backend): nothing to show
            return
        try:
            self.stream.write("\n".join(self.state.lines()) + "\n")
            self.stream.flush()
        except (OSError, ValueError, RuntimeError):  # a closed stream, or the dict changed under us: next time
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.print()
