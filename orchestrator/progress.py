"""Terminal progress: a rich live display on a terminal, plain periodic log lines elsewhere (CI logs).

Both views fold the job's one stream of events (``orchestrator.events``) into a :class:`JobState` and render it.
Every rate shown is server-counted: it comes from :class:`~orchestrator.events.MetricsSample` events only, never
from timing chunk arrivals on the client (the reference run's browser-timed "best second" read 9% high). A rate
summed over only some backends (the others expose no token counter, or their scrape failed this round) is labelled
"server-counted (k of n backends)", never shown as the fleet's.

    progress = Progress()            # rich.console.Console() by default
    with progress:                   # or progress.start() / progress.stop()
        await agenerate(..., on_event=progress)

The consumer is cheap and never blocks: an event updates a few counters under a lock; drawing happens on rich's
refresh thread (terminal) or on a timer thread every ``plain_interval`` seconds (plain lines).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Self
from urllib.parse import urlparse

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .events import (
    BackendState,
    Delta,
    JobFinished,
    JobStarted,
    LevelPlanned,
    MetricsSample,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    OutlineReady,
)

__all__ = ["JobState", "Progress", "short_url"]

LEVEL_NAMES = {1: "parts", 2: "chapters", 3: "sections"}


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

    Shared by the terminal progress and the live feed so that both count the same things the same way.
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
        self.active: dict[str, str] = {}  # node path -> backend of its attempt in flight
        self.inflight: dict[str, int] = {}  # backend -> attempts in flight
        self.errors: dict[str, int] = {}  # backend -> failed attempts
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

    # -- folding events -------------------------------------------------------------------------------------------

    def update(self, event: Any) -> list[str]:
        """Fold one event in; returns the planning nodes this event showed to be done (see _parents_done)."""
        with self.lock:
            self.inferred = []
            self._update(event)
            return self.inferred

    def _update(self, e: Any) -> None:
        if isinstance(e, Delta):
            return
        t = getattr(e, "t", None)
        if t is not None:
            if self.t0 is None:
                self.t0 = t
            self.t_last = t if self.t_last is None else max(self.t_last, t)
        if isinstance(e, NodeStarted):
            self._end_attempt(e.path)
            self._parents_done(e.path)
            self.active[e.path] = e.backend
            self.inflight[e.backend] = self.inflight.get(e.backend, 0) + 1
            self._know(e.backend)
        elif isinstance(e, NodeFinished):
            self._end_attempt(e.path)
            if e.kind == "section":
                if e.path not in self.sections_done:
                    self.tokens_written += max(0, int(e.reply.completion_tokens or 0))
                self.sections_done.add(e.path)
                self.sections_failed.discard(e.path)
            elif e.path not in self.planned:
                self.planned.add(e.path)
                self.tokens_written += max(0, int(e.reply.completion_tokens or 0))
                self.plan_done += 1
        elif isinstance(e, NodeFailed):
            self._end_attempt(e.path)
            self.errors[e.backend] = self.errors.get(e.backend, 0) + 1
            self._know(e.backend)
            if e.final:
                self.nodes_failed.add(e.path)
                if e.kind == "section":
                    self.sections_failed.add(e.path)
                self.last_failure = f"{e.kind} {e.path} {e.title!r}: {e.error}"
            else:
                self.retries += 1
        elif isinstance(e, MetricsSample):
            self.samples += 1
            if e.tokens is not None:
                if self.first_sample is None:
                    self.first_sample = (e.t, float(e.tokens))
                self.last_sample = (e.t, float(e.tokens))
            self.rate = None if e.rate_tok_s is None else float(e.rate_tok_s)
            self.rate_t = e.t
            if e.rate_tok_s is not None:
                self.rate_history.append((e.t, float(e.rate_tok_s)))
            self.servers = {url: dict(v) for url, v in e.per_backend.items()}
            self.metered_backends = len(e.per_backend)
            self.counted_backends = sum(1 for v in e.per_backend.values() if v.get("tokens") is not None)
            for url in e.per_backend:
                self._know(url)
        elif isinstance(e, LevelPlanned):
            self.levels[e.level] = e.nodes
            if e.level == 3:
                self.sections_total = e.nodes
        elif isinstance(e, OutlineReady):
            self.title = e.outline.title
            self.sections_total = e.outline.shape[2]
            for path in [p for p in self.active if p.count(".") < 2]:  # every planning node is done by now
                self._plan_node_done(path)
        elif isinstance(e, BackendState):
            self.health[e.url] = (e.healthy, e.reason)
        elif isinstance(e, JobStarted):
            self.prompt = e.prompt
            for url in e.backends:
                self._know(url)
            settings = e.settings if isinstance(e.settings, dict) else {}
            cap = settings.get("cap")
            self.cap = cap if isinstance(cap, int) and cap > 0 else None
            shape = [settings.get(k) for k in ("parts", "chapters", "sections")]
            if all(isinstance(x, int) and x > 0 for x in shape):
                self.sections_expected = shape[0] * shape[1] * shape[2]
        elif isinstance(e, JobFinished):
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
    def rate_label(self) -> str:
        """What the rate is: "server-counted", or "server-counted (k of n backends)" when it is a partial sum."""
        k, n = self.counted_backends, self.metered_backends
        if k is None or n is None or k >= n:
            return "server-counted"
        return f"server-counted ({k} of {n} backends)"

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
            "tokens_written": self.tokens_written,
            "server_tokens": self.server_tokens,
            "rate": self.rate,
            "rate_t": self.rate_t,
            "rate_so_far": self.rate_so_far,
            "rate_label": self.rate_label,
            "counted_backends": self.counted_backends,
            "metered_backends": self.metered_backends,
            "metered": self.samples > 0,
            "cap": self.cap,
            "backends": backends,
            "all_down": None if all_down is None or all_down[0] else all_down[1],
            "finished": self.finished,
            "complete": self.complete,
        }


def _num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}{unit}"


def _duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """A callable event consumer that shows a job's progress on ``console``.

    On a terminal (``console.is_terminal``): a rich live display. Otherwise: one plain log line every
    ``plain_interval`` seconds, plus a line at each milestone (a planning level, the outline, a backend leaving or
    rejoining, a node lost, the end). Use it as a context manager, or call ``start()`` and ``stop()``.
    """

    wants_deltas = False

    def __init__(self, console: Console | None = None, plain_interval: float = 5.0):
        self.console = console if console is not None else Console()
        self.plain_interval = float(plain_interval)
        self.state = JobState()
        self.live_mode = bool(self.console.is_terminal)
        self._live: Live | None = None
        self._timer: threading.Thread | None = None
        self._stopping = threading.Event()
        self._started = False
        self._notes: deque[str] = deque(maxlen=4)  # recent milestones, shown under the live display

    # -- consumer -----------------------------------------------------------------------------------------------

    def __call__(self, event: Any) -> None:
        if isinstance(event, Delta):
            return
        self.state.update(event)
        note = self._milestone(event)
        if note is not None:
            if self.live_mode:
                self._notes.append(note)
            elif self._started:
                self._print(note)
            else:
                self._notes.append(note)

    def _milestone(self, e: Any) -> str | None:
        if isinstance(e, JobStarted):
            n = len(e.backends)
            return f"job started on {n} backend{'s' if n != 1 else ''}: {', '.join(map(short_url, e.backends))}"
        if isinstance(e, LevelPlanned):
            return f"planned level {e.level}: {e.nodes} {LEVEL_NAMES.get(e.level, 'nodes')}"
        if isinstance(e, OutlineReady):
            p, c, s = e.outline.shape
            return f"outline ready: {p} parts, {c} chapters, {s} sections"
        if isinstance(e, BackendState):
            if e.url == "*":
                return f"no backend answering: {e.reason}"
            what = "back in rotation" if e.healthy else "out of rotation"
            return f"backend {short_url(e.url)} {what}: {e.reason}"
        if isinstance(e, NodeFailed) and e.final:
            return f"{e.kind} {e.path} {e.title!r} failed after {e.attempt} attempts: {e.error}"
        if isinstance(e, JobFinished):
            return None  # stop() prints the closing line
        return None

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> Progress:
        if self._started:
            return self
        self._started = True
        self._stopping.clear()
        if self.live_mode:
            self._live = Live(
                get_renderable=self._render,
                console=self.console,
                refresh_per_second=4,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        else:
            while self._notes:
                self._print(self._notes.popleft())
            self._timer = threading.Thread(target=self._tick, name="handbook-progress", daemon=True)
            self._timer.start()
        return self

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self._stopping.set()
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        if self._timer is not None:
            self._timer.join(timeout=max(1.0, self.plain_interval))
            self._timer = None
        if not self.live_mode:
            self._print(self.plain_line())
        with self.state.lock:
            finished, complete = self.state.finished, self.state.complete
            failed = len(self.state.sections_failed)
        if finished:
            verdict = "complete" if complete else f"finished with problems ({failed} failed sections)"
            self._print(f"job {verdict}")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _tick(self) -> None:
        while not self._stopping.wait(self.plain_interval):
            self._print(self.plain_line())

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)

    # -- plain lines ----------------------------------------------------------------------------------------------

    def plain_line(self) -> str:
        """One log line: where the job stands (CI logs)."""
        s = self.state
        with s.lock:
            parts = [f"[{_duration(s.elapsed):>6}]"]
            total = s.total
            done = len(s.sections_done)
            if total:
                mark = "" if s.sections_total is not None else "~"
                pct = 100.0 * done / total
                parts.append(f"sections {done}/{mark}{total} ({pct:.1f}%)")
            else:
                parts.append(f"sections {done}/?")
            if s.sections_total is None:
                levels = " ".join(f"L{k}={v}" for k, v in sorted(s.levels.items()))
                parts.append(f"planning {levels + ' ' if levels else ''}({s.plan_done} planning requests done)")
            parts.append(f"tokens {s.tokens_written:,}")
            if s.samples == 0:
                parts.append("rate -")
            elif s.rate is None and s.first_sample is None:
                parts.append("rate n/a (no server counter)")
            else:
                label = s.rate_label
                partial = "" if label == "server-counted" else f" {label}"  # a fleet-wide rate needs no label
                parts.append(f"rate {_num(s.rate)} tok/s (so far {_num(s.rate_so_far)}){partial}")
            flights = " ".join(
                f"{short_url(u)}={s.inflight.get(u, 0)}" + ("" if s.health.get(u, (True, ""))[0] else "(down)")
                for u in s.backends
            )
            parts.append(f"in flight {sum(s.inflight.values())}" + (f" [{flights}]" if flights else ""))
            parts.append(f"retries {s.retries}")
            parts.append(f"failed {len(s.nodes_failed)}")
        return "  ".join(parts)

    # -- rich live display ----------------------------------------------------------------------------------------

    def _render(self) -> Group:
        s = self.state
        with s.lock:
            head = Text()
            head.append("handbook ", style="bold")
            head.append(s.title or s.prompt or "starting", style="bold cyan")
            head.append(f"   {_duration(s.elapsed)}", style="dim")

            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold", no_wrap=True)
            grid.add_column()

            plan = Text()
            for level in (1, 2, 3):
                if level in s.levels:
                    plan.append(f"✓ {s.levels[level]:,} {LEVEL_NAMES[level]}  ", style="green")
                elif not s.finished:
                    plan.append(f"… level {level}", style="yellow")
                    break
            plan.append(f"  ({s.plan_done:,} planning requests done)", style="dim")
            grid.add_row("planning", plan)

            total = s.total
            done = len(s.sections_done)
            sec = Table.grid(padding=(0, 1))
            sec.add_column(no_wrap=True)
            sec.add_column(no_wrap=True)
            if total:
                mark = "" if s.sections_total is not None else "~"
                sec.add_row(
                    ProgressBar(total=total, completed=done, width=32),
                    Text(f"{done:,}/{mark}{total:,}  {100.0 * done / total:.1f}%"),
                )
            else:
                sec.add_row(ProgressBar(total=None, width=32), Text("waiting for the outline"))
            grid.add_row("sections", sec)

            tok = Text(f"{s.tokens_written:,} written")
            grid.add_row("tokens", tok)

            rate = Text()
            if s.samples == 0:
                rate.append("waiting for the first /metrics sample", style="dim")
            elif s.rate is None and s.first_sample is None:
                rate.append("servers expose no token counter", style="dim")
            else:
                rate.append(f"{_num(s.rate)} tok/s", style="bold magenta")
                rate.append(" last second · ")
                rate.append(f"{_num(s.rate_so_far)} tok/s", style="magenta")
                rate.append(f" so far ({s.rate_label})")
            grid.add_row("rate", rate)

            trouble = Text(f"{s.retries:,} retries · ")
            trouble.append(f"{len(s.nodes_failed):,} failed", style="red" if s.nodes_failed else "")
            if s.last_failure:
                trouble.append(f"  last: {s.last_failure}", style="dim red")
            grid.add_row("trouble", trouble)

            fleet = Table(box=None, padding=(0, 1), show_header=True, header_style="dim")
            fleet.add_column("backend", no_wrap=True)
            fleet.add_column("in flight", no_wrap=True)
            fleet.add_column("", justify="right", no_wrap=True)
            fleet.add_column("server run/wait", justify="right", no_wrap=True)
            fleet.add_column("errors", justify="right", no_wrap=True)
            top = max([s.cap or 0, *s.inflight.values(), 1])
            for url in s.backends:
                healthy, _reason = s.health.get(url, (True, ""))
                n = s.inflight.get(url, 0)
                server = s.servers.get(url, {})
                run, wait = server.get("running"), server.get("waiting")
                name = Text(short_url(url), style="" if healthy else "red strike")
                fleet.add_row(
                    name,
                    ProgressBar(total=top, completed=n, width=24),
                    str(n),
                    f"{_num(run)}/{_num(wait)}",
                    Text(str(s.errors.get(url, 0)), style="red" if s.errors.get(url) else "dim"),
                )
            notes = Text("\n".join(self._notes), style="dim")
        return Group(head, grid, fleet, notes)
