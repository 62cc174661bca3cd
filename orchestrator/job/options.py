"""How a session runs: what it does (:class:`Mode`), its options (:class:`Options`, a library book's
:class:`SharedFleet`), the event bus, and the default out folder."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import Backend, slugify
from ..core.events import Event
from ..core.osutil import prepare_out_dir
from ..core.outline import Outline
from ..dispatch.fleet import Fleet

log = logging.getLogger("handbook")


class Bus:
    """Fans events out to consumers; a consumer that raises is reported once and dropped, never kills the job."""

    def __init__(self, consumers: Sequence[Callable[[Event], None]]):
        self.consumers = list(consumers)

    def __call__(self, event: Event) -> None:
        for c in list(self.consumers):
            try:
                c(event)
            except Exception as e:  # a display bug must not lose the book
                log.warning("an event consumer failed and was detached: %s: %s", type(e).__name__, e)
                self.consumers.remove(c)


def default_out(prompt: str) -> Path:
    return Path("handbook-out") / slugify(prompt)


def prepare_out(out: str | os.PathLike | None, prompt: str) -> Path:
    return prepare_out_dir(out if out is not None else default_out(prompt))


@dataclass(frozen=True)
class Mode:
    """What a session does: the whole job (the default); ``plan_only``: the outline and its forecast (`handbook
    plan`); ``outline``: write this outline instead of planning one (`handbook write`, from outline.md)."""

    plan_only: bool = False
    outline: Outline | None = None


@dataclass(frozen=True)
class Options:
    """How a session runs, whatever its Mode: ``deltas``: a Delta event for every piece of streamed text;
    ``fresh``: ignore the journal in the out dir; ``handle_sigint``: take over Ctrl-C (see ``agenerate``)."""

    deltas: bool = False
    fresh: bool = False
    handle_sigint: bool = False
    shared: SharedFleet | None = None  # one book of a library: the library's fleet (job/library.py)


@dataclass(frozen=True)
class SharedFleet:
    """The fleet a library's books share: the backends as discovered with their caps, the running Fleet (one set of
    leases and caps for every book) and the MetricsSampler (one scrape per round for the library), and the book's
    ``rank`` (its place in the library: the Dispatcher's priority between planning and sections)."""

    usable: list[tuple[Backend, str]]
    caps: list[int]
    fleet: Fleet
    sampler: Any  # a MetricsSampler, already running
    rank: int = 0
    dedupe: Any = None  # --dedupe reask: the library's CrossIndex of finished books (book/crossdup.py), else None


