"""The words for the job's states, as enums that mypy checks: a typo in one is an error, not a new state.

``StrEnum``: each member is its own string ("section", "all-down", ...), so what is journaled, sent to the feed or
written to stats.json reads as before, and a value read back from a journal becomes a member again
(``NodeKind("section")``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never


class NodeKind(StrEnum):
    """What a request is for: an outline node, or the book's brief (``--context outline``; path "brief", beside the
    outline's paths, never one of them)."""

    BOOK = "book"
    PART = "part"
    CHAPTER = "chapter"
    SECTION = "section"
    BRIEF = "brief"


PLANNING_KINDS = (NodeKind.BOOK, NodeKind.PART, NodeKind.CHAPTER, NodeKind.BRIEF)


class Stop(StrEnum):
    """Why the writing ended before every section was asked for."""

    INTERRUPT = "interrupt"  # Ctrl-C: requests in flight were let finish
    CANCEL = "cancel"  # a second Ctrl-C: stopped at once
    ALL_DOWN = "all-down"  # every backend out of rotation for all_down_timeout_s
    OUTPUT = "output"  # the journal could not be written (a full disk)


class RunStatus(StrEnum):
    """How a run of a job ended, as its journal records it (``runs.status``)."""

    RUNNING = "running"  # not ended (killed)
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"  # finished with failed or empty sections
    INTERRUPTED = "interrupted"
    ABORTED = "aborted"  # every backend stopped answering, or the output could not be written
    PLANNED = "planned"  # `handbook plan`: the outline is whole
    FAILED = "failed"  # the outline could not be made, or a bug of ours ended it


class Missing(StrEnum):
    """What a section that has no text says instead (``SectionText.error``) when it was never asked for."""

    INTERRUPTED = "interrupted before it was written"
    NOT_WRITTEN = "not written"


def status_after(stop: Stop | None) -> RunStatus:
    """The journal's word for a run whose writing ended for ``stop`` (None: it did not end early)."""
    match stop:
        case None:
            return RunStatus.COMPLETE
        case Stop.INTERRUPT | Stop.CANCEL:
            return RunStatus.INTERRUPTED
        case Stop.ALL_DOWN | Stop.OUTPUT:
            return RunStatus.ABORTED
        case _:
            assert_never(stop)
