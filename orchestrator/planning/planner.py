"""Prompt -> Outline, one request per outline node.

Strict mode (``pipeline=False``, the reference run's order): the book node, then every part at once, then every
chapter at once, each level waiting for the previous one, and no section before the whole outline is known.

Pipeline mode (default): *streaming outline expansion*. A planning reply is parsed while it streams
(:class:`~.stream.TitleStream`, fed by the Dispatcher's per-call ``on_delta``); the moment one child title is
complete, that child starts: a part's chapter list is requested while the book's reply is still naming later parts,
and a section is handed to the runner (``on_section``) while its chapter's list is still streaming. Planning
overlaps writing from the first seconds; ``plan_time_s`` is still the time until the last section title is known.

Both modes send the same prompts, so against a deterministic server they make the same outline: a child's prompt
names only the siblings *before* it (the ones a streamed reply has already produced), never the later ones.

Every reply must hold exactly N distinct titles: too many are trimmed, too few or duplicates are asked again
(as a retry). How that stays consistent with children already started is :class:`~.stream.Expansion`'s rule: a
title that started a child is *committed* and is in the final outline whatever happens to the reply it came from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
import anyio.abc

from ..book.checks import norm_title as norm
from ..core.config import Settings
from ..core.errors import PlanError
from ..core.events import LevelPlanned, NodeFinished
from ..core.outline import Chapter, Outline, Part, SectionRef, level_of
from ..core.profiles import PROFILES, Profile
from ..core.states import NodeKind
from ..dispatch.dispatcher import Dispatcher
from .brief import ask_brief
from .made import book_title_from_prompt
from .node import NodeRequest, keep_titles
from .stream import Expansion
from .titles import Titles, spare_count

# (book, part, chapter path, chapter, 1-based index, title): a section title is known
SectionCallback = Callable[[str, str, str, str, int, str], None]
# (0-based index, title, book title): start the child planned from a committed title
ChildStart = Callable[[int, str, str | None], None]


class Planner:
    """Makes the outline through ``dispatcher``. Its journal, if it has one, is also where titles committed while a
    reply streams are recorded, and where a rerun finds them, so a node re-planned after a kill keeps the titles
    whose children (sections) already exist.

    **The book brief** (``settings.context == "outline"``; :mod:`.brief`): asked by :meth:`plan` in its own request
    the moment planning starts, beside the book node. ``brief_ready`` (an ``anyio.Event``) is set exactly once (a
    planner plans one book), when ``brief`` (a str) is final: the brief, or "" when it failed or came back empty
    (logged; the book goes on without one) or with ``context`` "none" (set at once, nothing asked). The returned
    outline carries it (``Outline.brief``). A section request that carries the brief awaits ``brief_ready``.

    **Distinct titles** (``settings.distinct_titles``, or a profile's ``distinct_outline``): no title occurs twice
    in the book (parts, chapters and sections share one set of normalised titles). With ``distinct_titles`` each
    part and chapter node asks for :func:`~.titles.spare_count` titles more than it keeps (the schema allows n to
    n + spares) and keeps the first n, in the reply's order, that pass the title gate and that no other node had
    taken when they arrived: titles are taken in the order they become known (committed from a stream, or accepted
    with a node's list), so the outline is deterministic given the order in which replies arrive. A node left
    short by taken titles is asked again (once, :data:`~.node.TAKEN_REASKS`, within the attempts bound of any
    unusable reply), told which of its titles are used elsewhere; its next attempt fills its places with taken
    titles qualified by its own title ("Testing" in chapter "Web Services": "Testing in Web Services",
    :func:`~.made.qualified`) rather than fail. The book node asks for no spare: nothing is taken before it.
    With ``distinct_titles`` False (the published take) every prompt, schema and title is what it always was (a
    reply followed as it streams, in pipeline mode, also asks for continuous usage stats: it may be stopped once its
    list is complete, :meth:`~.stream.Expansion.watch`).
    """

    def __init__(self, dispatcher: Dispatcher, prompt: str, settings: Settings, emit: Callable[[Any], None],
                 templates: str | None = None, profile: Profile | None = None):
        self.d = dispatcher
        # How the model is asked (sampling, system message, JSON or few-shot lists); without one, the reference
        # profile at the job's temperature.
        self.profile = profile or replace(PROFILES["reference"], temperature=settings.temperature or 0.0)
        self.prompt = prompt
        self.fallback_title = book_title_from_prompt(prompt)
        self.taken: set[str] = {norm(self.fallback_title)}  # see Expansion.taken
        self.distinct = settings.distinct_titles or self.profile.distinct_outline
        self.brief = ""
        self.brief_ready = anyio.Event()
        self._run: _PlanRun | None = None
        self.settings = settings
        self.emit = emit
        self.templates = templates
        self.level_requests = [0, 0, 0]
        self.t_titles_known: float | None = None
        self.t_first_section: float | None = None  # when the first section was handed to the runner

    async def plan(self, on_section: SectionCallback | None = None) -> Outline:
        """Make the outline.

        In pipeline mode ``on_section(book, part, chapter_path, chapter, index, title)`` (``index`` 1-based) is
        called, synchronously, the moment each section title is known, possibly while its chapter's list is still
        streaming. With ``context`` "outline" a section's request names every title of its chapter and of its
        part's chapters, so it is called for a chapter's sections once both lists are final and the brief is
        known; :meth:`section_ref` then gives the section's complete :class:`SectionRef`. Strict mode never calls
        it: the caller writes from the returned outline.
        """
        self._run = _PlanRun(self, on_section)
        return await self._run.run()

    def section_ref(self, book: str, part: str, chapter_path: str, chapter: str, index: int,
                    title: str) -> SectionRef:
        """The section ``on_section`` announced, with what its request carries: the brief as known now, its part's
        chapter titles and its chapter's section titles (final from the call of ``on_section`` with ``context``
        "outline"; what is known so far otherwise)."""
        run = self._run
        pi, ci = (int(x) - 1 for x in chapter_path.split("."))
        chapters = run.chapter_lists.get(pi, ()) if run is not None else ()
        siblings = run.sections.get((pi, ci), ()) if run is not None else ()
        return SectionRef(f"{chapter_path}.{index}", book, part, chapter, title, None, brief=self.brief,
                          part_chapters=tuple(chapters), siblings=tuple(siblings))

    async def node(
        self, path: str, kind: NodeKind, label: str, n: int, want_title: bool, start_child: ChildStart | None = None,
        watch_only: bool = False, **values: Any,
    ) -> tuple[Titles, int]:
        """Plan one node (``kind`` is also its prompt template). Returns its titles and how many children were
        already started from its stream (or from the titles an earlier run had committed). ``watch_only`` (no
        ``start_child``): each reply is followed only to stop it once its list is complete (Expansion.watch)."""
        journal = self.d.journal
        ancestors = [values.get(k) for k in ("book", "part", "chapter")]
        spare = spare_count(n) if self.settings.distinct_titles and kind != NodeKind.BOOK else 0
        exp = Expansion(
            n, want_title, start_child, frozenset(norm(a) for a in ancestors if a),
            on_commit=partial(journal.commit_titles, path, label) if journal is not None else None,
            taken=self.taken if self.distinct else None, spares=spare > 0, watch_only=watch_only,
        )
        request = NodeRequest(self, kind, n, want_title, exp, values, spare)
        self.level_requests[level_of(path)] += 1
        restored = None
        if journal is not None and journal.get(path, kind, label) is None:
            restored = journal.committed(path, label)
        if restored is not None and restored.items:
            # An earlier run committed these titles and started their children before it stopped: keep them
            # (the sections written for them are in the journal under these very titles) and start them now.
            exp.restore(restored.title, restored.items)
            if start_child is not None:
                for i, t in enumerate(exp.committed):
                    start_child(i, t, exp.title)
        out = await self.d.run(
            path, kind, label, request.build, request.validate, priority=(0, 0),
            on_delta=exp.on_delta if start_child is not None or watch_only else None, restore=request.restore,
            keep=keep_titles,
            watch=exp.watch,
        )
        if out.value is not None and self.distinct:
            self.taken.update(norm(t) for t in out.value.items)
        if out.value is None:
            short = label if len(label) <= 80 else label[:77] + "..."
            where = f"node {path!r} ({kind} {short!r})" if path else "the book node"
            raise PlanError(f"the outline could not be made: {where} failed {out.attempts} attempts: {out.reply.error}")
        self.emit(NodeFinished(path, kind, label, out.reply, time.monotonic()))
        return out.value, len(exp.committed)


class _PlanRun:
    """One call of :meth:`Planner.plan`: the outline as it grows, node by node, and the starts of children.

    In pipeline mode ``tg`` is the task group every node runs in (a child starts the moment its title is
    committed); in strict mode it is None and each level starts once the previous one is complete."""

    def __init__(self, planner: Planner, on_section: SectionCallback | None):
        self.planner = planner
        self.s = planner.settings
        self.on_section = on_section
        self.tg: anyio.abc.TaskGroup | None = None
        self.book: str | None = None
        self.parts: dict[int, str] = {}
        self.chapters: dict[tuple[int, int], str] = {}
        self.sections: dict[tuple[int, int], tuple[str, ...]] = {}
        self.chapter_lists: dict[int, tuple[str, ...]] = {}
        self.parts_total: int | None = None  # pipeline mode: how many parts, once the book node has returned
        self.parts_done = 0
        # context "outline": a section's request names its whole chapter and its part's chapters (see Planner.plan)
        self.whole_lists = self.s.context == "outline"
        self.part_listed: dict[int, anyio.Event] = {}  # set when part pi's chapter list is final
        self.outer: anyio.abc.TaskGroup | None = None  # the brief, and sections waiting for their lists

    async def run(self) -> Outline:
        async with anyio.create_task_group() as outer:
            self.outer = outer
            outer.start_soon(self._brief)
            if self.s.pipeline:
                await self._pipelined()
            else:
                await self._strict()
            # the titles are known: the level is announced now, though the brief may still be on its way
            t = self.planner.t_titles_known = time.monotonic()
            self.planner.emit(LevelPlanned(3, sum(len(v) for v in self.sections.values()), t))
        assert self.book is not None
        return Outline(
            title=self.book,
            parts=tuple(
                Part(
                    self.parts[pi],
                    tuple(Chapter(self.chapters[(pi, ci)], self.sections[(pi, ci)])
                          for ci in range(len(self.chapter_lists[pi]))),
                )
                for pi in range(len(self.parts))
            ),
            brief=self.planner.brief,
        )

    async def _brief(self) -> None:
        """Ask for the brief beside the outline (``context`` "outline"); ``brief_ready`` is set whatever happens,
        so nothing waits on a brief that is not coming."""
        pl = self.planner
        try:
            if self.whole_lists and pl.profile.brief_template is not None:
                pl.brief = await ask_brief(pl.d, pl.profile, pl.prompt, pl.templates)
        finally:
            pl.brief_ready.set()

    def _listed(self, pi: int) -> anyio.Event:
        return self.part_listed.setdefault(pi, anyio.Event())

    async def _book(self, start_part: ChildStart | None) -> Titles:
        pl = self.planner
        want_title = pl.profile.planning != "list"
        root, started = await pl.node("", NodeKind.BOOK, pl.prompt, self.s.parts, want_title, start_part,
                                      request=pl.prompt)
        if self.book is None:
            self.book = root.title or pl.fallback_title
        if start_part is not None:
            for pi in range(started, len(root.items)):
                start_part(pi, root.items[pi], root.title)
        return root

    async def _pipelined(self) -> None:
        async with anyio.create_task_group() as tg:
            self.tg = tg
            root = await self._book(self._start_part)
            self.planner.emit(LevelPlanned(1, len(root.items), time.monotonic()))
            self.parts_total = len(root.items)
            self._parts_returned()

    async def _strict(self) -> None:
        emit = self.planner.emit
        root = await self._book(None)
        self.parts = dict(enumerate(root.items))
        emit(LevelPlanned(1, len(self.parts), time.monotonic()))
        async with anyio.create_task_group() as tg:
            for pi in range(len(self.parts)):
                tg.start_soon(self._part, pi)
        emit(LevelPlanned(2, len(self.chapters), time.monotonic()))
        async with anyio.create_task_group() as tg:
            for pi in range(len(self.parts)):
                for ci in range(len(self.chapter_lists[pi])):
                    tg.start_soon(self._chapter, pi, ci)

    def _start_part(self, pi: int, title: str, book: str | None) -> None:
        self.parts[pi] = title
        if self.book is None:  # the book title is committed with the first part (its prompt carries it)
            self.book = book or self.planner.fallback_title
        assert self.tg is not None
        self.tg.start_soon(self._part, pi)

    def _start_chapter(self, pi: int, ci: int, title: str, _book: str | None) -> None:
        self.chapters[(pi, ci)] = title
        assert self.tg is not None
        self.tg.start_soon(self._chapter, pi, ci)

    def _start_section(self, book: str, part: str, cpath: str, chapter: str, si: int, title: str,
                       _book: str | None) -> None:
        if self.planner.t_first_section is None:
            self.planner.t_first_section = time.monotonic()
        assert self.on_section is not None
        self.on_section(book, part, cpath, chapter, si + 1, title)

    async def _part(self, pi: int) -> None:
        assert self.book is not None
        book, part, s = self.book, self.parts[pi], self.s
        before = [self.parts[j] for j in range(pi)]
        # strict mode starts no child while a reply streams, even for titles restored from the journal
        start = partial(self._start_chapter, pi) if self.tg is not None else None
        got, started = await self.planner.node(
            f"{pi + 1}", NodeKind.PART, part, s.chapters, False, start,
            request=self.planner.prompt, book=book, part=part, index=pi + 1, count=s.parts, siblings=before,
        )
        self.chapter_lists[pi] = got.items
        for ci in range(started if start is not None else 0, len(got.items)):
            if start is not None:
                start(ci, got.items[ci], None)
            else:
                self.chapters[(pi, ci)] = got.items[ci]
        self._listed(pi).set()
        self.parts_done += 1
        if start is not None:
            self._parts_returned()

    def _parts_returned(self) -> None:
        """Pipeline mode: announce level 2 once, when the book node and every one of its parts have returned.
        Parts start (and, restored from the journal, may finish) while the book's reply still streams, so "every
        part started so far has returned" is not enough; the count is the chapters the parts really kept."""
        if self.parts_total is not None and self.parts_done == self.parts_total:
            chapters = sum(len(v) for v in self.chapter_lists.values())
            self.planner.emit(LevelPlanned(2, chapters, time.monotonic()))

    async def _chapter(self, pi: int, ci: int) -> None:
        assert self.book is not None
        book, part, chapter, s = self.book, self.parts[pi], self.chapters[(pi, ci)], self.s
        cpath = f"{pi + 1}.{ci + 1}"
        before = [self.chapters[(pi, j)] for j in range(ci)]
        stream = None
        if s.pipeline and self.on_section is not None and not self.whole_lists:
            stream = partial(self._start_section, book, part, cpath, chapter)
        # Pipeline mode follows every chapter's reply as it streams, also where no section starts from it (context
        # "outline", or no writer): there only to stop it once its list is complete (Expansion.watch).
        got, started = await self.planner.node(
            cpath, NodeKind.CHAPTER, chapter, s.sections, False, stream, watch_only=s.pipeline and stream is None,
            request=self.planner.prompt, book=book, part=part, chapter=chapter, index=ci + 1, count=s.chapters,
            siblings=before,
        )
        self.sections[(pi, ci)] = got.items
        if stream is not None:
            for si in range(started, len(got.items)):
                stream(si, got.items[si], None)
        elif s.pipeline and self.on_section is not None:
            assert self.outer is not None  # not in this node's task group: the titles are known, planning is done
            self.outer.start_soon(self._sections_when_listed, book, part, pi, cpath, chapter, got.items)

    async def _sections_when_listed(self, book: str, part: str, pi: int, cpath: str, chapter: str,
                                    titles: tuple[str, ...]) -> None:
        """Context "outline": hand a chapter's sections to the runner once its part's chapter list is final and
        the brief is known (the requests carry both)."""
        await self._listed(pi).wait()
        await self.planner.brief_ready.wait()
        for si, title in enumerate(titles):
            self._start_section(book, part, cpath, chapter, si, title, None)
