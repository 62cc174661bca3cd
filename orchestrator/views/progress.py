"""Terminal progress: a rich live display on a terminal, plain periodic log lines elsewhere (CI logs).

Both views fold the job's one stream of events (``orchestrator.events``) into a
:class:`~orchestrator.jobstate.JobState` and render it.
Every rate shown is server-counted: it comes from :class:`~orchestrator.events.MetricsSample` events only, never
from timing chunk arrivals on the client (the reference run's browser-timed "best second" read 9% high). A rate
summed over only some backends (the others expose no token counter, or their scrape failed this round) is labelled
"server-counted (k of n backends)", never shown as the fleet's. A job that made a forecast
(:class:`~orchestrator.events.ForecastReady`) has it shown beside the live figures, with the time still to go and
what that rests on (``orchestrator.eta``); a job without one shows nothing about it. A job that made a PDF ends
with when it was ready (stats.json's ``pdf_ready_s``, ``typeset_after_write_s``: the reader's wait).

    progress = TerminalProgress()    # rich.console.Console() by default
    with progress:                   # or progress.start() / progress.stop()
        await agenerate(..., on_event=progress)

The consumer is cheap and never blocks: an event updates a few counters under a lock; drawing happens on rich's
refresh thread (terminal) or on a timer thread every ``plain_interval`` seconds (plain lines).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Self

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..core.events import (
    BackendState,
    Delta,
    Event,
    ForecastReady,
    JobFinished,
    JobStarted,
    LevelPlanned,
    NodeFailed,
    OutlineReady,
    ProbeStarted,
)
from .eta import Eta
from .jobstate import JobState, short_url
from .words import LEVEL_NAMES, closing_words, duration, eta_words, num, pdf_words, rate_num, secs

__all__ = ["TerminalProgress"]

class TerminalProgress:
    """A callable event consumer that shows a job's progress on ``console``.

    On a terminal (``console.is_terminal``): a rich live display. Otherwise: one plain log line every
    ``plain_interval`` seconds, plus a line at each milestone (a planning level, the outline, a backend leaving or
    rejoining, a node lost, the end). Use it as a context manager, or call ``start()`` and ``stop()``.
    It ignores :class:`~orchestrator.events.Delta` events: a job asked for them (``deltas=True``) for another
    consumer costs this one a type check per chunk, nothing more.
    """

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

    def __call__(self, event: Event) -> None:
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

    def _milestone(self, e: Event) -> str | None:
        if isinstance(e, JobStarted):
            n = len(e.backends)
            return f"job started on {n} backend{'s' if n != 1 else ''}: {', '.join(map(short_url, e.backends))}"
        if isinstance(e, ProbeStarted):
            n = e.backends
            return (f"forecast: measuring the step time of {n} backend{'s' if n != 1 else ''} at "
                    f"{_levels(e)} streams at once, before the job starts")
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
        if isinstance(e, ForecastReady):
            return (
                f"forecast: {secs(e.whole_job_s)} for the whole job, {e.pages:,} A5 pages, "
                f"{e.sections:,} sections, {e.tokens:,} tokens"
            )
        if isinstance(e, NodeFailed) and e.final:
            return f"{e.kind} {e.path} {e.title!r} failed after {e.attempt} attempts: {e.error}"
        if isinstance(e, JobFinished):
            return None  # stop() prints the closing line
        return None

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> Self:
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
            eta = self.state.eta()
            pdf = pdf_words(self.state.stats)
        if finished:
            if eta is not None:
                self._print(closing_words(eta))
            if pdf is not None:
                self._print(pdf)
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
            if s.t0 is None and s.probe is not None:  # the job has not started: its clock reads 0 until it does
                return (f"[{duration(max(0.0, time.monotonic() - s.probe.t)):>6}]  forecast: measuring step times at "
                        f"{_levels(s.probe)} streams")
            parts = [f"[{duration(s.elapsed):>6}]"]
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
                each = s.per_reader
                reader = "" if each is None else f", each reader {rate_num(each)} tok/s"
                parts.append(f"rate {rate_num(s.rate)} tok/s (so far {num(s.rate_so_far)}{reader}){partial}")
            flights = " ".join(
                f"{short_url(u)}={s.inflight.get(u, 0)}" + ("" if s.health.get(u, (True, ""))[0] else "(down)")
                for u in s.backends
            )
            parts.append(f"in flight {sum(s.inflight.values())}" + (f" [{flights}]" if flights else ""))
            parts.append(f"retries {s.retries}" + (f" ({s.unusable} unusable answers)" if s.unusable else ""))
            parts.append(f"failed {len(s.nodes_failed)}")
            eta = s.eta()
            if eta is not None:
                parts.append(eta_words(eta))
        return "  ".join(parts)

    # -- rich live display ----------------------------------------------------------------------------------------

    def _render(self) -> Group:
        s = self.state
        with s.lock:
            head = Text()
            head.append("handbook ", style="bold")
            head.append(s.title or s.prompt or "starting", style="bold cyan")
            head.append(f"   {duration(s.elapsed)}", style="dim")
            grid = _figures_grid(s)
            fleet = _fleet_table(s)
            notes = Text("\n".join(self._notes), style="dim")
        return Group(head, grid, fleet, notes)


# -- the live display's parts (called under the state's lock) ----------------------------------------------------

def _figures_grid(s: JobState) -> Table:
    """The figures, one row each: planning, sections, tokens, the forecast, the PDF, the rate, the trouble."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("planning", _planning_text(s))
    grid.add_row("sections", _sections_bar(s))
    eta = s.eta()
    tok = Text(f"{s.tokens_written:,} written")
    if eta is not None:
        tok.append(f" · {eta.tokens:,} forecast", style="dim")
    grid.add_row("tokens", tok)
    if eta is not None:
        grid.add_row("forecast", _forecast_row(eta))
    pdf = pdf_words(s.stats) if s.finished else None
    if pdf is not None:
        grid.add_row("pdf", Text(pdf, style="bold green"))
    grid.add_row("rate", _rate_text(s))
    grid.add_row("trouble", _trouble_text(s))
    return grid


def _levels(probe: ProbeStarted) -> str:
    """A probe's levels as read aloud: "9 then 36"."""
    return " then ".join(f"{n:,}" for n in probe.levels)


def _planning_text(s: JobState) -> Text:
    plan = Text()
    if s.probe is not None and not s.levels:
        plan.append(f"… measuring step times for the forecast ({_levels(s.probe)} streams)  ", style="yellow")
    for level in (1, 2, 3):
        if level in s.levels:
            plan.append(f"✓ {s.levels[level]:,} {LEVEL_NAMES[level]}  ", style="green")
        elif not s.finished:
            plan.append(f"… level {level}", style="yellow")
            break
    plan.append(f"  ({s.plan_done:,} planning requests done)", style="dim")
    return plan


def _sections_bar(s: JobState) -> Table:
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
    return sec


def _rate_text(s: JobState) -> Text:
    rate = Text()
    if s.samples == 0:
        rate.append("waiting for the first /metrics sample", style="dim")
    elif s.rate is None and s.first_sample is None:
        rate.append("servers expose no token counter", style="dim")
    else:
        rate.append(f"{rate_num(s.rate)} tok/s", style="bold magenta")
        rate.append(" last second · ")
        rate.append(f"{num(s.rate_so_far)} tok/s", style="magenta")
        rate.append(f" so far ({s.rate_label})")
        each = s.per_reader
        if each is not None:  # the reference's "thirteen for each reader": the rate over the streams it is shared by
            rate.append(" · each reader ")
            rate.append(f"{rate_num(each)} tok/s", style="magenta")
    return rate


def _trouble_text(s: JobState) -> Text:
    trouble = Text(f"{s.retries:,} retries · ")
    if s.unusable:  # answers a check of ours refused (a planning list, a section in a loop): no backend's error
        trouble.append(f"{s.unusable:,} unusable answers · ", style="dim")
    trouble.append(f"{len(s.nodes_failed):,} failed", style="red" if s.nodes_failed else "")
    if s.last_failure:
        trouble.append(f"  last: {s.last_failure}", style="dim red")
    return trouble


def _forecast_row(eta: Eta) -> Text:
    row = Text()
    row.append(secs(eta.forecast_s), style="bold")
    row.append(f" whole job · {eta.pages:,} A5 pages · {eta.sections:,} sections", style="dim")
    if eta.took_s is not None:
        row.append(f"   took {secs(eta.took_s)}", style="bold")
        if eta.error_pct is not None:
            row.append(f" ({eta.error_pct:+.0f}%)", style="green" if abs(eta.error_pct) <= 10 else "yellow")
        if eta.pdf_pages is not None:
            row.append(f" · {eta.pdf_pages:,} A5 pages typeset")
        return row
    if eta.over_s > 0:
        row.append(f"   {secs(eta.over_s)} over", style="bold yellow")
    if eta.left_s is not None:
        row.append("   ETA ")
        row.append(secs(eta.left_s), style="bold cyan")
        row.append(f" ({eta.basis_text})", style="dim")
    return row


def _fleet_table(s: JobState) -> Table:
    """One row per backend: its streams in flight against the cap, the server's running/waiting, its errors."""
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
            f"{num(run)}/{num(wait)}",
            Text(str(s.errors.get(url, 0)), style="red" if s.errors.get(url) else "dim"),
        )
    return fleet
