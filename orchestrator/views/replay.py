"""A recorded run played again (``handbook replay OUT``): its events delivered at the run's pace, or ``speed``
times faster, to the consumers given (the live feed, the terminal progress).

The events keep their recorded times (rebased to now): every figure the views derive is the run's own, and the
rate they show is the servers' counted rate the run recorded (``MetricsSample.rate_tok_s``), never re-timed here.
Only the pace of delivery changes with ``speed``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
import anyio.lowlevel

from ..core.events import Event, JobFinished
from .recording import find_recording, read_recording

__all__ = ["Replayed", "replay"]


@dataclass(frozen=True)
class Replayed:
    """What a replay delivered: ``events``; ``run_s``, the recorded run's length; ``finished``, whether the
    recording reached the run's end (a killed run's does not)."""

    events: int
    run_s: float
    finished: bool


async def replay(path: str | os.PathLike, consumers: Sequence[Callable[[Event], None]], speed: float = 1.0
                 ) -> Replayed:
    """Deliver the recording at ``path`` (a run's out folder, or the file) to ``consumers``, each event when its
    time comes at ``speed`` x. Raises FileNotFoundError when there is none, ValueError on a line that is not one."""
    if not speed > 0:
        raise ValueError("speed must be positive")
    base = time.monotonic()
    start = base
    events = 0
    t_last = base
    finished = False
    for event in read_recording(find_recording(path), base):
        due = start + (event.t - base) / speed
        wait = due - time.monotonic()
        if wait > 0.001:
            await anyio.sleep(wait)
        elif events % 256 == 0:
            await anyio.lowlevel.checkpoint()  # far behind (a high speed): let the feed's handlers write
        for consume in consumers:
            consume(event)
        events += 1
        t_last = max(t_last, event.t)
        finished = finished or isinstance(event, JobFinished)
    return Replayed(events, t_last - base, finished)
