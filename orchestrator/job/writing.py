"""Writing the book: every section as its own request, sent the moment its title is known; Ctrl-C and a fleet
that stops answering end it early, keeping what exists.

:meth:`Writer.run` drives the planner and the section requests over one fleet and returns a :class:`Written`
value, however the writing ended. With ``handle_sigint``, a first Ctrl-C stops dispatching and lets requests in
flight finish for ``settings.interrupt_grace_s``; a second raises Interrupted at once. Every backend out of
rotation for ``settings.all_down_timeout_s`` stops the writing too (``Written.stop`` says so: the runner raises
BackendError once what exists is on disk).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ..book.assemble import SectionText
from ..book.crossdup import CrossIndex
from ..book.loopcut import kept_before_loop
from ..core.config import Settings
from ..core.errors import Interrupted
from ..core.events import Event, LevelPlanned, NodeFinished, OutlineReady
from ..core.outline import Outline, SectionRef
from ..core.profiles import Profile
from ..core.reply import STOPPED, Reply
from ..core.states import NodeKind, Stop
from ..dispatch.dispatcher import Dispatcher
from ..dispatch.fleet import Fleet
from ..dispatch.journal import Journal
from ..metrics.readers import readers
from ..planning import Planner
from ..wire.client import BackendClient
from .repairs import Accepted, partners_across, partners_within, repair_code, repair_duplicates, repair_notes
from .report import BackendFigures
from .section_check import SectionCheck, accepted_value, order_base
from .section_prompt import affinity_key, section_context, section_text

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..metrics import MetricsSampler

log = logging.getLogger("handbook")

CONTINUATION_TOKENS = 96  # --finish-truncated: enough for the end of a sentence and one more


@dataclass(frozen=True)
class Written:
    """What the writing produced, however it ended.

    ``stop`` says why it ended early: "interrupt" (Ctrl-C; requests in flight were let finish), "all-down" (every
    backend stopped answering; ``all_down_error`` says how) or "output" (the journal could not be written: the
    runner raises ``journal.failure``); None when every section was asked for."""

    outline: Outline | None  # None: stopped while planning
    sections: dict[str, SectionText]  # path -> the section as written (or failed); absent: never finished
    replies: tuple[tuple[str, Reply], ...]  # (kind, reply) of every attempt this run made
    requests: int
    resumed_sections: int  # answered from the journal
    t_titles: float | None  # when the last title was known (None: planning never finished)
    t_write_start: float | None  # the first section request sent ...
    t_write_end: float | None  # ... and the last section request answered (None: none was)
    server_counted: dict[str, Any] | None  # the servers' counters over the writing (None: nothing was written)
    fleet: tuple[BackendFigures, ...]  # one per backend, in fleet order
    stop: Stop | None = None
    all_down_error: str | None = None
    power: dict[str, Any] | None = None  # the GPUs' power over the writing (metrics.power_figures; None: not written)
    readers: dict[str, Any] | None = None  # what each reader got over the writing (metrics.readers; None: not written)
    loop_cut_stopped: int = 0  # answers stopped as they streamed for a loop and kept cut before it (not signed off)


# a library book's server-counted figures: the fleet's counters count every book of the library at once
SHARED: dict[str, Any] = {"available": False, "reason": "the fleet was shared by the library's books: the library's "
                          "stats.json counts them"}


def readers_of(sampler: MetricsSampler, counted: dict[str, Any], replies: Sequence[tuple[str, Reply]], t0: float,
               t1: float) -> dict[str, Any]:
    """stats.json ``readers`` over the writing: the server-counted rate and latencies of the counted backends (the
    whole fleet's latency only when every backend has the histograms), else the client's."""
    covered = counted.get("covered_backends") if counted.get("available", True) else None
    urls = covered or []
    return readers(
        [r for _, r in replies], t0, t1,
        sustained_tok_s=counted.get("sustained_tok_s") if covered else None,
        series={u: sampler.series[u] for u in urls}, histograms=sampler.histograms_of(),
        sections=[r for k, r in replies if k == "section"],
    )


def stopped_message(journal: Journal, why: str) -> str:
    return f"{why}; {journal.safe_sections} finished section(s) are in {journal.path}: rerun the same command to resume"


class Writer:
    """One run's writing. ``stop`` is set while it runs: "interrupt", "cancel" (a second Ctrl-C), "all-down" or
    "output" (the journal cannot be written)."""

    def __init__(self, settings: Settings, profile: Profile, bus: Callable[[Event], None], journal: Journal, *,
                 handle_sigint: bool, shared: bool = False):
        self.settings = settings
        # one book of a library (job/library.py): the fleet and the sampler are the library's, already running, and
        # their counters count every book's tokens, so this book's stats name no server-counted figure of its own
        self.shared = shared
        self.profile = profile
        self.bus = bus
        self.journal = journal
        self.handle_sigint = handle_sigint
        self.stop: Stop | None = None
        self.sections: dict[str, SectionText] = {}
        self.accepted: dict[str, Accepted] = {}  # sections as accepted, for the repairs' re-asks (job/repairs.py)
        self.rewritten = 0  # near-duplicate sections asked again
        self.library_index: CrossIndex | None = None  # a library's finished books, with --dedupe reask
        self.resumed_sections = 0
        self.loop_cut_stopped = 0
        self.t_write_start: float | None = None
        self.t_write_end: float | None = None
        # told of every section stored (written, failed or resumed): typesetting while writing
        self.on_section: Callable[[SectionText], None] | None = None
        self._journal_failed = anyio.Event()  # the journal could not keep a node: set by journal.on_failure
        journal.on_failure = lambda _error: self._journal_failed.set()

    async def run(self, fleet: Fleet, dispatcher: Dispatcher, planner: Planner, sampler: MetricsSampler, *,
                  outline: Outline | None = None, plan_only: bool = False) -> Written:
        """Plan (unless ``outline`` is given, as `handbook write` gives outline.md, or the journal holds one) and
        write every section (none with ``plan_only``: `handbook plan`); return what exists."""
        settings, bus, journal = self.settings, self.bus, self.journal
        if outline is not None:
            journal.store_outline(outline)  # the outline the book is made from, as a person edited it
        else:
            outline = journal.outline
        t_titles: float | None = None
        power = {load.client.backend.url: load.client.backend.power for load in fleet.loads}
        if any(power.values()) and not self.shared:  # the backends' --power pages, scraped in the sampler's rounds
            sampler.set_power(power)
        async with anyio.create_task_group() as bg:
            if not self.shared:
                await bg.start(fleet.run)
                bg.start_soon(sampler.run)
            with anyio.CancelScope() as writing:
                bg.start_soon(self._watch_all_down, fleet, writing)
                bg.start_soon(self._watch_journal, fleet, writing)
                if self.handle_sigint:
                    bg.start_soon(self._watch_sigint, fleet, writing, bg)
                async with anyio.create_task_group() as work:

                    def section_ready(book: str, part: str, chapter_path: str, chapter: str, si: int,
                                      title: str) -> None:
                        # pipeline: called the moment the title is known (with --context outline, once its
                        # chapter's and part's lists are final and the brief is known: Planner.plan)
                        ref = planner.section_ref(book, part, chapter_path, chapter, si, title)
                        work.start_soon(self._section, dispatcher, ref, order_base(chapter_path, settings) + si)

                    if outline is None:
                        starts = None if plan_only else section_ready
                        outline = await planner.plan(on_section=starts)
                        journal.store_outline(outline)
                        pipelined = settings.pipeline and starts is not None
                    else:
                        pipelined = False  # the journal's outline: every section can go at once
                        now = time.monotonic()
                        for level, nodes in enumerate(outline.shape, 1):  # each level is known, once
                            bus(LevelPlanned(level, nodes, now))
                    t_titles = planner.t_titles_known or time.monotonic()
                    bus(OutlineReady(outline, time.monotonic()))
                    if not pipelined and not plan_only:
                        for order, ref in enumerate(outline.sections()):
                            work.start_soon(self._section, dispatcher, ref, order)
                await self._repair_duplicates(dispatcher, plan_only)
            if self.stop == Stop.CANCEL:
                raise Interrupted(stopped_message(journal, "stopped at once (second Ctrl-C)"))
            if not self.shared:
                await sampler.sample_once()
            bg.cancel_scope.cancel()
        counted, energy, each = self._figures(sampler, dispatcher)
        return Written(
            outline=outline,
            sections=self.sections,
            replies=tuple(dispatcher.replies),
            requests=dispatcher.requests,
            resumed_sections=self.resumed_sections,
            loop_cut_stopped=self.loop_cut_stopped,
            t_titles=t_titles,
            t_write_start=self.t_write_start,
            t_write_end=self.t_write_end,
            server_counted=counted,
            fleet=() if self.shared else tuple(  # a library's fleet: its figures are the library's, not a book's
                BackendFigures(
                    max_in_flight=load.max_in_flight, cap=load.cap, left_rotation=load.trips,
                    probe_completions=load.client.probe_completions, probe_failures=load.client.probe_failures,
                    probe_tokens=load.client.probe_tokens,
                )
                for load in fleet.loads
            ),
            stop=self.stop,
            all_down_error=None if fleet.all_down_error is None else str(fleet.all_down_error),
            power=energy,
            readers=each,
        )

    def _figures(self, sampler: MetricsSampler, dispatcher: Dispatcher) -> tuple[Any, Any, Any]:
        """(server_counted, power, readers) over the writing; None each when nothing was written."""
        if self.shared:
            return SHARED, SHARED, None
        if self.t_write_start is None:
            return None, None, None
        # Names the backends it covers (and why others are not), or says why nothing could be counted. The sampler
        # has stopped: no later sample could fall in the window, whenever it is closed.
        t0, t1 = self.t_write_start, self.t_write_end or time.monotonic()
        counted = sampler.counted(t0, t1)
        return counted, sampler.power_over(t0, t1), readers_of(sampler, counted, dispatcher.replies, t0, t1)

    async def _section(self, dispatcher: Dispatcher, ref: SectionRef, order: int) -> None:
        settings, profile = self.settings, self.profile
        words = ref.words or settings.words
        max_tokens = settings.max_tokens_for(words)
        context = section_context(ref, settings, words, profile)
        messages = profile.messages(section_text(ref, settings, profile, words))
        check = SectionCheck(ref.title, words // 3 if settings.stop_at_sign_off else None,
                             keep_words=max(1, words // 2))
        stream = settings.streams_sections(dispatcher.wants_deltas)

        def build(client: BackendClient, attempt: int) -> dict:
            if self.t_write_start is None:  # the first section request actually sent
                self.t_write_start = time.monotonic()
            if check.loop is not None:  # the one re-ask of a looping section: stronger settings
                return client.body(messages, max_tokens=max_tokens,
                                   temperature=max(profile.temperature, profile.loop_temperature),
                                   sampling=profile.loop_sampling(), stream=stream)
            return client.body(messages, max_tokens=max_tokens, temperature=profile.temperature,
                               sampling=profile.sampling(), stream=stream)

        # One lookup decides resuming: the journal answers this section only if it was written for this very
        # title and context (book, part, chapter, words: Dispatcher.run), wherever an edited outline moved it;
        # anything else is asked again. A stored section is taken as it was accepted (its repair note comes back).
        outcome = await dispatcher.run(
            ref.path, NodeKind.SECTION, ref.title, build, check, priority=(1, order),
            restore=lambda stored: accepted_value(stored.value), keep=lambda value: {**value, "context": context},
            context=context, affinity=affinity_key(ref, settings), watch=check.watcher if stream else None,
        )
        r = outcome.reply
        value = {**(outcome.value or {}), "context": context}
        r, value = self._cut_at_loop(ref, outcome.attempts, r, value)
        if outcome.attempts == 0:
            self.resumed_sections += 1
        elif r.ok and r.finish_reason == "length" and settings.finish_truncated and "loop_cut" not in value:
            r = await self._finish(dispatcher, ref, messages, r, value)
        if r.ok and (settings.repairs or self.library_index is not None):  # kept for the re-asks of job/repairs.py
            done = Accepted(ref.title, r, value, tuple(messages), max_tokens)
            if settings.repairs:
                r, value = await repair_code(dispatcher, self.journal, ref.path, done, self._body(stream))
            self.accepted[ref.path] = replace(done, reply=r, value=value)
        self.sections[ref.path] = SectionText(
            ref.path, ref.part, ref.chapter, ref.title,
            r.text if r.ok else "", r.finish_reason, r.completion_tokens, r.backend or None,
            None if r.ok else f"failed after {outcome.attempts} attempts: {r.error}",
            **(repair_notes(value) if r.ok else {}),
        )
        if r.ok:
            self.bus(NodeFinished(ref.path, NodeKind.SECTION, ref.title, r, time.monotonic()))
            # The text as book.md prints it and its shingles, made now while other sections are still being
            # written: assembling the book and counting its defects after the last one (which the PDF waits for)
            # then only join texts and compare shingles (~1 ms a section off the critical path).
            _ = self.sections[ref.path].body, self.sections[ref.path].shingles
            if r is outcome.reply and "loop" in value:  # the check looked at this very text
                self.sections[ref.path].__dict__["loop"] = value["loop"]
        if self.on_section is not None:
            self.on_section(self.sections[ref.path])
        if outcome.attempts:
            self.t_write_end = time.monotonic()

    def _cut_at_loop(self, ref: SectionRef, attempts: int, r: Reply, value: dict[str, Any]
                     ) -> tuple[Reply, dict[str, Any]]:
        """A section SectionCheck kept as what it said before its loop (value ``loop_cut``: the offset in the
        answer as generated) as it is kept: cut there, and journaled cut (``loop_cut`` True), so that a resumed run,
        a repair and the book all see the cut text. As it was otherwise."""
        cut = value.get("loop_cut") if r.ok else None
        if type(cut) is not int:
            return r, value
        self.loop_cut_stopped += attempts > 0 and r.finish_reason == STOPPED
        r = replace(r, text=kept_before_loop(r.text, cut))
        value = {**value, "loop_cut": True}
        self.journal.record(ref.path, NodeKind.SECTION, ref.title, r, r.attempt, value)
        return r, value

    async def _repair_duplicates(self, dispatcher: Dispatcher, plan_only: bool) -> None:
        """Once every section is in: the later section of each near-duplicate pair is asked again (job/repairs.py)."""
        if plan_only or self.stop is not None or not (self.settings.repairs or self.library_index is not None):
            return
        stream = self.settings.streams_sections(dispatcher.wants_deltas)
        partner = partners_within(self.sections, self.accepted) if self.settings.repairs else {}
        if self.library_index is not None:  # a library's --dedupe reask: against the books finished before
            partner.update(partners_across(self.library_index, self.sections, self.accepted, partner))
        self.rewritten = len(partner)
        paths = await repair_duplicates(dispatcher, self.journal, self.sections, self.accepted, self._body(stream),
                                        partner)
        for path in paths:  # the typesetter lays the new text out (its items are keyed by content)
            if self.on_section is not None:
                self.on_section(self.sections[path])

    def _body(self, stream: bool) -> Callable[[BackendClient, list[dict[str, str]], int], dict]:
        """A re-ask's request body (job/repairs.py): the section's own sampling, other messages."""
        profile = self.profile
        return lambda client, messages, max_tokens: client.body(
            messages, max_tokens=max_tokens, temperature=profile.temperature, sampling=profile.sampling(),
            stream=stream)

    async def _finish(self, dispatcher: Dispatcher, ref: SectionRef, messages: list[dict[str, str]], first: Reply,
                      value: Any = None) -> Reply:
        """``--finish-truncated``: one short continuation request for a section stopped by the token cap. The
        section keeps finish_reason "length" (defects count it as truncated, as generated); book.md gets the
        finished text. A failed continuation leaves the section as it was (cut back in book.md)."""
        profile = self.profile
        follow = [*messages, {"role": "assistant", "content": first.text},
                  {"role": "user", "content": "Finish the last sentence and end the section in one or two more "
                                              "sentences. Do not repeat anything."}]
        out = await dispatcher.run(
            ref.path, NodeKind.SECTION, ref.title,
            lambda client, attempt: client.body(follow, max_tokens=CONTINUATION_TOKENS,
                                                temperature=profile.temperature, sampling=profile.sampling(),
                                                stream=self.settings.streams_sections(dispatcher.wants_deltas)),
            priority=(1, 0), journaled=False,  # the section is journaled already; the finished text replaces it
        )
        if not out.reply.ok:
            return first
        joiner = "" if first.text.endswith((" ", "\n")) or out.reply.text.startswith((" ", "\n")) else " "
        done = replace(first, text=first.text + joiner + out.reply.text.strip(),
                       completion_tokens=first.completion_tokens + out.reply.completion_tokens)
        value = {k: v for k, v in value.items() if k != "loop"}  # the check saw the first text, not this one
        self.journal.record(ref.path, NodeKind.SECTION, ref.title, done, out.attempts + first.attempt, value)
        return done

    async def _watch_all_down(self, fleet: Fleet, writing: anyio.CancelScope) -> None:
        """Every backend out of rotation for settings.all_down_timeout_s: stop writing (the journal is intact)."""
        await fleet.all_down.wait()
        if self.stop is None:
            self.stop = Stop.ALL_DOWN
        fleet.stop()
        writing.cancel()

    async def _watch_journal(self, fleet: Fleet, writing: anyio.CancelScope) -> None:
        """The journal could not keep a node (a full disk): ask for nothing more, since text that cannot be kept is
        GPU time lost. Requests in flight may finish only while the journal still keeps what they bring (each later
        write is tried: one that fails too ends the wait) and for settings.interrupt_grace_s at most."""
        if self.journal.failure is None:
            await self._journal_failed.wait()
        if self.stop is None:
            self.stop = Stop.OUTPUT
        fleet.stop()
        seen = self.journal.failures
        with anyio.move_on_after(self.settings.interrupt_grace_s):
            # The fleet keeps counts, not events (as in _drain): polling for a few seconds once costs nothing.
            while fleet.in_flight and self.journal.failures == seen:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        writing.cancel()

    async def _watch_sigint(self, fleet: Fleet, writing: anyio.CancelScope, bg: anyio.abc.TaskGroup) -> None:
        """First Ctrl-C: dispatch nothing new, let requests in flight finish (a few seconds at most), then stop
        writing. Second Ctrl-C: stop at once."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            receiver = anyio.open_signal_receiver(signal.SIGINT)
            signals = receiver.__enter__()
        except (NotImplementedError, ValueError, RuntimeError):
            return
        try:
            async for _ in signals:
                if self.stop is None:
                    self.stop = Stop.INTERRUPT
                    log.warning(
                        "interrupted: no new requests; waiting up to %g s for %d in flight, then writing what "
                        "exists (Ctrl-C again to stop at once)", self.settings.interrupt_grace_s, fleet.in_flight,
                    )
                    fleet.stop()
                    bg.start_soon(self._drain, fleet, writing)
                else:
                    self.stop = Stop.CANCEL
                    writing.cancel()
                    return
        finally:
            receiver.__exit__(None, None, None)

    async def _drain(self, fleet: Fleet, writing: anyio.CancelScope) -> None:
        with anyio.move_on_after(self.settings.interrupt_grace_s):
            # The fleet keeps counts, not events; a few seconds of polling once per interrupt cost nothing.
            while fleet.in_flight:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        writing.cancel()
