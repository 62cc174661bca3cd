"""The fleet's queue of waiting leases, with prefix-cache affinity.

A request may name an *affinity key* (a chapter: its sections share the longest prompt prefix, which vLLM's
automatic prefix caching computes once per card). The first request of a key gives the key a *home*: the backend
with the least work homed on it, by cap; the key's later requests wait in that home's queue, so that a slot freed on
a backend goes first to the requests whose prefix it already holds. Requests without a key (planning, or a job
without context) wait in a shared queue, as before, and so does a keyed retry (``Fleet.lease(avoid=)``: it is sent
away from the card that failed it, and still counts in its key's shares).

Three rules keep affinity from costing throughput or balance:

* a freed slot never idles while anything waits: a backend whose own queue and the shared one are empty takes the
  best waiter of another backend's queue (its prefix is then computed twice; the forecast's rule still holds);
* the better of the home's best waiter and the shared queue's best goes first, so planning (kind 0) keeps priority
  over every section;
* equal shares: a backend is not made a home while the keyed requests it has served exceed its share of them (by
  cap) by more than ``SHARE_SLACK`` (10%, as the issue's bound, plus a few requests so that the first grants of a job
  are not refused on rounding).

Pure bookkeeping over heaps of :class:`Waiter`; the :class:`~orchestrator.dispatch.fleet.Fleet` grants from it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

import anyio

__all__ = ["HOMES_KEPT", "SHARE_SLACK", "Queues", "Waiter"]

SHARE_SLACK = 0.10
SHARE_GRACE = 8  # requests over the share a backend may have before it is refused as a home
HOMES_KEPT = 8192  # keys remembered (least recently used dropped): a library's chapters come and go


@dataclass(order=True)
class Waiter:
    priority: tuple[int, ...]
    seq: int
    event: anyio.Event = field(compare=False)
    key: Hashable | None = field(default=None, compare=False)
    granted: int | None = field(default=None, compare=False)
    abandoned: bool = field(default=False, compare=False)


class Queues:
    """The shared queue and one queue per backend, the keys' homes, and how many keyed requests each served."""

    def __init__(self, caps: Sequence[int]):
        self.caps = list(caps)
        self.shared: list[Waiter] = []
        self.homed: list[list[Waiter]] = [[] for _ in caps]
        self.homes: OrderedDict[Hashable, int] = OrderedDict()
        self.served = [0] * len(caps)  # keyed requests granted, per backend
        self.waiting_homed = [0] * len(caps)

    def __len__(self) -> int:
        """Waiters queued, abandoned ones included until a grant passes them (cheap: a lease asks it each time)."""
        return len(self.shared) + sum(len(q) for q in self.homed)

    def __iter__(self) -> Iterator[Waiter]:
        yield from self.shared
        for q in self.homed:
            yield from q

    def home_of(self, key: Hashable, in_flight: Sequence[int], healthy: Sequence[bool]) -> int | None:
        """The key's home, chosen now if it has none (None: no backend may be one)."""
        home = self.homes.get(key)
        if home is not None and healthy[home]:
            self.homes.move_to_end(key)
            return home
        total_cap = sum(c for c, ok in zip(self.caps, healthy, strict=True) if ok) or 1
        total = sum(self.served) + 1
        best, best_load = None, float("inf")
        for i, cap in enumerate(self.caps):
            if not healthy[i] or self.served[i] > (1 + SHARE_SLACK) * total * cap / total_cap + SHARE_GRACE:
                continue
            load = (in_flight[i] + self.waiting_homed[i]) / cap
            if load < best_load:
                best, best_load = i, load
        if best is not None:
            self.homes[key] = best
            while len(self.homes) > HOMES_KEPT:
                self.homes.popitem(last=False)
        return best

    def push(self, w: Waiter, home: int | None) -> None:
        if home is None:
            heapq.heappush(self.shared, w)
        else:
            heapq.heappush(self.homed[home], w)
            self.waiting_homed[home] += 1

    def pop_for(self, i: int) -> Waiter | None:
        """The waiter backend ``i``'s freed slot goes to: the better of its own queue's best and the shared queue's
        best; else the best of any other backend's queue; None when nothing waits."""
        own, shared = self._top(self.homed[i], i), self._top(self.shared, None)
        if own is not None and (shared is None or own < shared):
            return self._pop(self.homed[i], i)
        if shared is not None:
            return self._pop(self.shared, None)
        others = [(q[0], j) for j, q in enumerate(self.homed) if j != i and self._top(q, j) is not None]
        if not others:
            return None
        _, j = min(others)
        return self._pop(self.homed[j], j)

    def granted(self, w: Waiter, i: int) -> None:
        if w.key is not None:
            self.served[i] += 1

    def _top(self, q: list[Waiter], home: int | None) -> Waiter | None:
        while q and q[0].abandoned:
            heapq.heappop(q)
            if home is not None:
                self.waiting_homed[home] -= 1
        return q[0] if q else None

    def _pop(self, q: list[Waiter], home: int | None) -> Waiter:
        w = heapq.heappop(q)
        if home is not None:
            self.waiting_homed[home] -= 1
        return w
