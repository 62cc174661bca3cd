"""Which backend gets the next request: the one rule the fleet grants leases by and the forecast simulates.

Pure, and importing nothing: ``orchestrator.forecasting.simulate`` runs it without the fleet's clients.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["pick_backend"]


def pick_backend(in_flight: Sequence[int], caps: Sequence[int], healthy: Sequence[bool] | None, start: int
                 ) -> int | None:
    """The index of the healthy backend with room (in flight below its cap) whose load (in flight / cap) is the
    lowest, None when none has room. Ties go to the first one met, counting from ``start`` round the list (the
    callers rotate it, so equal backends take turns). ``healthy`` None: every backend is."""
    best: int | None = None
    best_load = 2.0
    n = len(caps)
    for k in range(n):
        i = (start + k) % n
        if (healthy is not None and not healthy[i]) or in_flight[i] >= caps[i]:
            continue
        load = in_flight[i] / caps[i]
        if load < best_load:
            best, best_load = i, load
    return best
