"""The job as its events have told it so far: one fold of the event stream that every view reads.

The terminal progress (``orchestrator.progress``) and the live feed (``orchestrator.feed``) both keep a
:class:`JobState`, so that both count the same things the same way. Rates come from
:class:`~orchestrator.events.MetricsSample` events only (server-counted, never timed from chunk arrivals).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ..core.events import (
    BackendState,
    Delta,
    ForecastReady,
    JobFinished,
    JobStarted,
    LevelPlanned,
    MetricsSample,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    OutlineReady,
    ProbeStarted,
)
from ..core.states import NodeKind
from .eta import Eta, job_eta

if TYPE_CHECKING:
    from ..core.events import Event

__all__ = ["JobState", "short_url"]


def short_url(url: str) -> str:
    """``http://gpu1:8000/v1`` -> ``gpu1:8000`` (the label a backend gets in progress views)."""
    try:
        p = urlparse(url)
    except ValueError:
        return url
    if not p.hostname:
        return url
    return f"{p.hostname}:{p.port}" if p.port else p.hostname


class JobState:
    """The job as the events have told it so far. ``update(event)`` is cheap; read it under ``lock``.

    Shared by the terminal progress and the live feed.
    """

    RATE_HISTORY = 240  # samples kept for the feed's sparkline (2 minutes at the sampler's 0.5 s)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt = ""
        self.title = ""
        self.backends: list[str] = []
        self.cap: int | None = None
        self.t0: float | None = None
        self.t_last: float | None = None
        self.levels: dict[int, int] = {}
        self.plan_done = 0
        self.planned: set[str] = set()  # planning nodes known to be done
        self.inferred: list[str] = []  # planning nodes found done by inference during the last update()
        self.sections_total: int | None = None
        self.sections_expected: int | None = None  # parts x chapters x sections asked for, until the outline says
        self.sections_done: set[str] = set()
        self.sections_failed: set[str] = set()
        self.nodes_failed: set[str] = set()
        self.retries = 0
        self.tokens_written = 0
        self.tokens_asked = 0  # of tokens_written, those this run's requests wrote (what its forecast counts)
        self.active: dict[str, str] = {}  # node path -> backend of its attempt in flight
        self.inflight: dict[str, int] = {}  # backend -> attempts in flight
        self.errors: dict[str, int] = {}  # backend -> failed attempts (the backend's: not unusable answers)
        self.unusable = 0  # answers a check of ours refused (NodeFailed.unusable), asked again: no backend's error
        self.health: dict[str, tuple[bool, str]] = {}
        self.first_sample: tuple[float, float] | None = None  # (t, tokens) of the first counted sample
        self.last_sample: tuple[float, float] | None = None
        self.rate: float | None = None  # server-counted tok/s over the last second
        self.rate_t: float | None = None
        self.rate_history: deque[tuple[float, float]] = deque(maxlen=self.RATE_HISTORY)
        self.servers: dict[str, dict[str, float | None]] = {}
        self.counted_backends: int | None = None  # backends whose counter the last sample summed ...
        self.metered_backends: int | None = None  # ... of the backends it scraped
        self.samples = 0
        self.last_failure = ""
        self.finished = False
        self.complete: bool | None = None
        self.stats: dict[str, Any] | None = None
        self.forecast: ForecastReady | None = None
        self.probe: ProbeStarted | None = None  # the forecast's probe, while the job has not started
        self.writing = False  # a section request has begun
        # (t, server tokens, tokens_asked) when the first section began: the live writing rate counts from here
        self.write_base: tuple[float, float, int] | None = None
        self.t_written: float | None = None  # when the last section was written (or lost)

    # -- folding events -------------------------------------------------------------------------------------------

    def update(self, event: Event) -> list[str]:
        """Fold one event in; returns the planning nodes this event showed to be done (see _parents_done)."""
        with self.lock:
            self.inferred = []
            if isinstance(event, ProbeStarted):  # before JobStarted, not on the job's clock (a probe is not the job)
                self.probe = event
            else:
                self._update(event)
            return self.inferred

    def _update(self, e: Event) -> None:
        if isinstance(e, Delta):
            return
        self._clock(getattr(e, "t", None))
        match e:
            case NodeStarted():
                self._node_started(e)
            case NodeFinished():
                self._node_finished(e)
            case NodeFailed():
                self._node_failed(e)
            case MetricsSample():
                self._sample(e)
            case LevelPlanned():
                self._level_planned(e)
            case OutlineReady():
                self._outline_ready(e)
            case BackendState():
                self.health[e.url] = (e.healthy, e.reason)
            case ForecastReady():
                self.forecast = e
            case JobStarted():
                self._job_started(e)
            case JobFinished():
                self._job_finished(e)

    def _clock(self, t: float | None) -> None:
        if t is not None:
            if self.t0 is None:
                self.t0 = t
            self.t_last = t if self.t_last is None else max(self.t_last, t)

    def _node_started(self, e: NodeStarted) -> None:
        self._end_attempt(e.path)
        if e.kind != NodeKind.BRIEF:  # the brief's path is beside the outline's tree, not under the book's
            self._parents_done(e.path)
        self.active[e.path] = e.backend
        self.inflight[e.backend] = self.inflight.get(e.backend, 0) + 1
        self._know(e.backend)
        if e.kind == "section" and not self.writing:
            self.writing = True
            if self.last_sample is not None:
                self.write_base = (*self.last_sample, self.tokens_asked)

    def _node_finished(self, e: NodeFinished) -> None:
        asked = e.path in self.active  # else the journal answered it: no attempt in this run
        self._end_attempt(e.path)
        new = e.path not in (self.sections_done if e.kind == "section" else self.planned)
        tokens = max(0, int(e.reply.completion_tokens or 0)) if new else 0
        self.tokens_written += tokens
        self.tokens_asked += tokens if asked else 0
        if e.kind == "section":
            self.sections_done.add(e.path)
            self.sections_failed.discard(e.path)
            self._sections_over(e.t)
        elif new:
            self.planned.add(e.path)
            self.plan_done += 1

    def _node_failed(self, e: NodeFailed) -> None:
        self._end_attempt(e.path)
        if e.unusable:  # the backend answered; a check of ours refused the answer: asked again, no server's error
            self.unusable += 1
        else:
            self.errors[e.backend] = self.errors.get(e.backend, 0) + 1
        self._know(e.backend)
        if not e.final:
            self.retries += 1
            return
        if e.kind == NodeKind.BRIEF or e.path in self.sections_done:
            # No node is lost: a book without a brief is written all the same, and a section asked again after it
            # was written (a repair's re-ask, a continuation) keeps the text it had.
            return
        self.nodes_failed.add(e.path)
        if e.kind == "section":
            self.sections_failed.add(e.path)
            self._sections_over(e.t)
        self.last_failure = f"{e.kind} {e.path} {e.title!r}: {e.error}"

    def _sample(self, e: MetricsSample) -> None:
        self.samples += 1
        if e.tokens is not None:
            if self.first_sample is None:
                self.first_sample = (e.t, float(e.tokens))
            self.last_sample = (e.t, float(e.tokens))
            if self.write_base is None and self.writing:
                self.write_base = (e.t, float(e.tokens), self.tokens_asked)
        self.rate = None if e.rate_tok_s is None else float(e.rate_tok_s)
        self.rate_t = e.t
        if e.rate_tok_s is not None:
            self.rate_history.append((e.t, float(e.rate_tok_s)))
        self.servers = {url: dict(v) for url, v in e.per_backend.items()}
        self.metered_backends = len(e.per_backend)
        self.counted_backends = sum(1 for v in e.per_backend.values() if v.get("tokens") is not None)
        for url in e.per_backend:
            self._know(url)

    def _level_planned(self, e: LevelPlanned) -> None:
        self.levels[e.level] = e.nodes
        if e.level == 3:
            self.sections_total = e.nodes

    def _outline_ready(self, e: OutlineReady) -> None:
        self.title = e.outline.title
        self.sections_total = e.outline.shape[2]
        for path in [p for p in self.active if p.count(".") < 2]:  # every planning node is done by now
            self._plan_node_done(path)

    def _job_started(self, e: JobStarted) -> None:
        self.probe = None  # the forecast's probe is over
        self.prompt = e.prompt
        for url in e.backends:
            self._know(url)
        settings = e.settings if isinstance(e.settings, dict) else {}
        cap = settings.get("cap")
        self.cap = cap if isinstance(cap, int) and cap > 0 else None
        shape = [settings.get(k) for k in ("parts", "chapters", "sections")]
        parts, chapters, sections = (x if isinstance(x, int) and x > 0 else 0 for x in shape)
        if parts and chapters and sections:
            self.sections_expected = parts * chapters * sections

    def _job_finished(self, e: JobFinished) -> None:
        self.finished = True
        self.complete = e.complete
        self.stats = dict(e.stats) if e.stats is not None else {}
        self.active.clear()
        self.inflight = {k: 0 for k in self.inflight}

    def _parents_done(self, path: str) -> None:
        """A node's request starts only once its parent's titles are known: the parent's attempt is over.

        (Planning nodes may get no NodeFinished of their own; this keeps in-flight counts true regardless.)"""
        if not path:
            return
        bits = path.split(".")
        for depth in range(len(bits)):
            parent = ".".join(bits[:depth])
            if parent in self.active:
                self._plan_node_done(parent)

    def _plan_node_done(self, path: str) -> None:
        self._end_attempt(path)
        if path not in self.planned:
            self.planned.add(path)
            self.plan_done += 1
            self.inferred.append(path)

    def _sections_over(self, t: float) -> None:
        accounted = len(self.sections_done) + len(self.sections_failed)
        if self.t_written is None and self.sections_total is not None and accounted >= self.sections_total:
            self.t_written = t

    def _end_attempt(self, path: str) -> None:
        backend = self.active.pop(path, None)
        if backend is not None:
            self.inflight[backend] = max(0, self.inflight.get(backend, 0) - 1)

    def _know(self, url: str) -> None:
        if url and url != "*" and url not in self.inflight:
            self.inflight[url] = 0
            if url not in self.backends:
                self.backends.append(url)

    # -- derived values (call under lock) ------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        if self.t0 is None or self.t_last is None:
            return 0.0
        return max(0.0, self.t_last - self.t0)

    @property
    def total(self) -> int | None:
        """Sections in the book: the outline's count once known, else the shape that was asked for."""
        return self.sections_total if self.sections_total is not None else self.sections_expected

    @property
    def server_tokens(self) -> float | None:
        """Generation tokens the servers counted since the first sample of this job (None without a counter)."""
        if self.first_sample is None or self.last_sample is None:
            return None
        return max(0.0, self.last_sample[1] - self.first_sample[1])

    @property
    def rate_so_far(self) -> float | None:
        """Server-counted tokens per second averaged over the sampled part of the job."""
        if self.first_sample is None or self.last_sample is None:
            return None
        dt = self.last_sample[0] - self.first_sample[0]
        if dt <= 0:
            return None
        return max(0.0, self.last_sample[1] - self.first_sample[1]) / dt

    @property
    def per_reader(self) -> float | None:
        """What each reader gets now: the last second's server-counted rate over the streams the same servers run
        (their running gauges summed); None without both."""
        if self.rate is None:
            return None
        running = [v.get("running") for v in self.servers.values() if v.get("tokens") is not None]
        streams = sum(r for r in running if r is not None)
        return self.rate / streams if streams else None

    @property
    def rate_label(self) -> str:
        """What the rate is: "server-counted", or "server-counted (k of n backends)" when it is a partial sum."""
        k, n = self.counted_backends, self.metered_backends
        if k is None or n is None or k >= n:
            return "server-counted"
        return f"server-counted ({k} of {n} backends)"

    def eta(self) -> Eta | None:
        """The forecast beside where the job stands (None when no forecast was made); see :class:`Eta`."""
        return job_eta(self)

    def snapshot(self) -> dict[str, Any]:
        """The state as plain JSON-able data (what the feed's header shows)."""
        backends = []
        for url in self.backends:
            healthy, reason = self.health.get(url, (True, ""))
            server = self.servers.get(url, {})
            backends.append(
                {
                    "url": url,
                    "label": short_url(url),
                    "inflight": self.inflight.get(url, 0),
                    "errors": self.errors.get(url, 0),
                    "healthy": healthy,
                    "reason": reason,
                    "running": server.get("running"),
                    "waiting": server.get("waiting"),
                }
            )
        all_down = self.health.get("*")
        return {
            "prompt": self.prompt,
            "title": self.title,
            "elapsed": round(self.elapsed, 2),
            "levels": {str(k): v for k, v in sorted(self.levels.items())},
            "plan_done": self.plan_done,
            "sections_total": self.total,
            "outline_known": self.sections_total is not None,
            "sections_done": len(self.sections_done),
            "sections_failed": len(self.sections_failed),
            "failed": len(self.nodes_failed),
            "retries": self.retries,
            "unusable": self.unusable,
            "tokens_written": self.tokens_written,
            "server_tokens": self.server_tokens,
            "rate": self.rate,
            "rate_t": self.rate_t,
            "rate_so_far": self.rate_so_far,
            "rate_label": self.rate_label,
            "per_reader": self.per_reader,
            "counted_backends": self.counted_backends,
            "metered_backends": self.metered_backends,
            "metered": self.samples > 0,
            "cap": self.cap,
            "backends": backends,
            "all_down": None if all_down is None or all_down[0] else all_down[1],
            "finished": self.finished,
            "complete": self.complete,
            "forecast": None if (eta := self.eta()) is None else eta.to_json(),
        }
