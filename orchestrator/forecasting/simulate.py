"""The fleet, simulated: every request of a job run over the backends' step-time fits, event by event.

Each backend runs the requests leased to it (at most its cap) as one continuous batch: a decoding step costs
``a_ms + b_ms x running`` and gives every running request one token, so between two events (a request starts,
ends, or streams a title that starts a child) each backend advances at a constant rate and the next event's time
is exact. A request goes to the backend with the lowest load (in flight / cap), ties rotating, as
:class:`orchestrator.fleet.Fleet` grants leases; waiting requests are served by priority (planning before sections,
sections in outline order), as the fleet's queue is. In pipeline mode a child becomes ready the moment its title
has streamed in its parent's reply (:class:`orchestrator.planning.stream.Expansion`); in strict mode each level
waits for the whole previous one, and sections for the whole outline.

About 4 events per request and a scan of the backends per event: the published take's 1,641 requests over 6
backends take ~30 ms.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..dispatch.pick import pick_backend

__all__ = ["BackendRun", "Node", "SimulatedRun", "simulate"]

SECTION = 3  # the level of a section node (0 book, 1 part, 2 chapter)


@dataclass(frozen=True)
class Node:
    """One request: its level (0 book, 1 part, 2 chapter, 3 section), its reply's tokens, its place in the queue,
    and the children its titles start: ``children[k]`` is ready ``offsets[k]`` tokens into this reply (pipeline)."""

    level: int
    tokens: int
    order: int
    children: tuple[int, ...] = ()
    offsets: tuple[int, ...] = ()


@dataclass(frozen=True)
class BackendRun:
    """One backend's share of a :class:`SimulatedRun`."""

    sections: int
    tokens: int
    busy_s: float  # time with at least one request running


@dataclass(frozen=True)
class SimulatedRun:
    """What the simulated job did: when its requests ended, in seconds from its first request, and each
    backend's share."""

    end_s: float  # the last request answered
    titles_s: float  # the last planning reply answered (0.0: no planning)
    first_section_s: float | None  # the first section request started ...
    last_section_s: float | None  # ... and the last one answered
    backends: tuple[BackendRun, ...]


def simulate(nodes: Sequence[Node], roots: Sequence[int], steps: Sequence[tuple[float, float, int]], *,
             pipeline: bool) -> SimulatedRun:
    """Run ``nodes`` (``roots`` ready at t=0) over backends given as ``(a_ms, b_ms, cap)``."""
    return _Run(nodes, steps, pipeline).go(roots)


class _Run:
    def __init__(self, nodes: Sequence[Node], steps: Sequence[tuple[float, float, int]], pipeline: bool):
        self.nodes = nodes
        self.pipeline = pipeline
        n = len(steps)
        self.a = [s[0] / 1000.0 for s in steps]
        self.b = [s[1] / 1000.0 for s in steps]
        self.cap = [max(1, s[2]) for s in steps]
        self.run = [0] * n  # requests running on each backend
        self.v = [0.0] * n  # tokens each request running on a backend has gained since t=0 (a virtual clock)
        # per backend: (virtual time, seq, node, child index or -1 for the node's end)
        self.due: list[list[tuple[float, int, int, int]]] = [[] for _ in range(n)]
        self.ready: list[tuple[int, int, int]] = []  # (level > 2: sections after planning, order, node)
        self.seq = itertools.count()
        self.rr = itertools.count()
        self.t = 0.0
        self.busy = [0.0] * n
        self.sections = [0] * n
        self.tokens = [0] * n
        self.titles_s = 0.0
        self.first_section: float | None = None
        self.last_section: float | None = None
        # strict mode: the nodes of each level still to finish, and the next level's nodes held back until then
        self.left = [0, 0, 0, 0]
        self.held: list[list[int]] = [[], [], [], []]
        for node in nodes:
            self.left[node.level] += 1

    def go(self, roots: Sequence[int]) -> SimulatedRun:
        for k in roots:
            self._ready(k)
        while True:
            self._dispatch()
            i, t_next = self._next_event()
            if i < 0:
                break
            self._advance(t_next)
            self._fire(i)
        return SimulatedRun(
            end_s=self.t, titles_s=self.titles_s, first_section_s=self.first_section,
            last_section_s=self.last_section,
            backends=tuple(BackendRun(s, k, b) for s, k, b in zip(self.sections, self.tokens, self.busy, strict=True)),
        )

    def _ready(self, k: int) -> None:
        node = self.nodes[k]
        heapq.heappush(self.ready, (1 if node.level == SECTION else 0, node.order, k))

    def _pick(self) -> int:
        """The backend with the lowest load that has room, -1 when none has: the fleet's rule (every backend is
        healthy here)."""
        best = pick_backend(self.run, self.cap, None, next(self.rr) % len(self.cap))
        return -1 if best is None else best

    def _dispatch(self) -> None:
        while self.ready:
            i = self._pick()
            if i < 0:
                return
            _, _, k = heapq.heappop(self.ready)
            self._start(i, k)

    def _start(self, i: int, k: int) -> None:
        """Node ``k`` runs on backend ``i`` from now: its end and (pipeline) its children's titles fall due."""
        node = self.nodes[k]
        self.run[i] += 1
        v0 = self.v[i]
        heapq.heappush(self.due[i], (v0 + node.tokens, next(self.seq), k, -1))
        if self.pipeline:
            for c, off in enumerate(node.offsets):
                heapq.heappush(self.due[i], (v0 + min(off, node.tokens), next(self.seq), k, c))
        if node.level == SECTION:
            self.sections[i] += 1
            if self.first_section is None:
                self.first_section = self.t
        self.tokens[i] += node.tokens

    def _next_event(self) -> tuple[int, float]:
        best, t_best = -1, float("inf")
        for i, due in enumerate(self.due):
            if due:
                t = self.t + (due[0][0] - self.v[i]) * (self.a[i] + self.b[i] * self.run[i])
                if t < t_best:
                    best, t_best = i, t
        return best, t_best

    def _advance(self, t_next: float) -> None:
        dt = t_next - self.t
        if dt > 0:
            for i, r in enumerate(self.run):
                if r:
                    self.v[i] += dt / (self.a[i] + self.b[i] * r)
                    self.busy[i] += dt
        self.t = max(self.t, t_next)

    def _fire(self, i: int) -> None:
        v_due, _, k, c = heapq.heappop(self.due[i])
        self.v[i] = max(self.v[i], v_due)  # exact, whatever rounding the rate made
        node = self.nodes[k]
        if c >= 0:
            self._ready(node.children[c])
            return
        self.run[i] -= 1
        if node.level == SECTION:
            self.last_section = self.t
        else:
            self.titles_s = self.t
        if self.pipeline:
            return
        self.left[node.level] -= 1
        self.held[node.level].extend(node.children)
        if self.left[node.level] == 0:
            # strict: the next level starts once this one is complete, in outline order
            for child in sorted(self.held[node.level], key=lambda x: self.nodes[x].order):
                self._ready(child)
