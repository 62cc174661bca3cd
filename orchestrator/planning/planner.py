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
from ..core.outline import Chapter, Outline, Part, level_of
from ..core.profiles import PROFILES, Profile
from ..core.prompts import book_phrase, few_shot_messages, list_schema, render
from ..core.reply import Reply
from ..core.states import NodeKind
from ..dispatch.dispatcher import Dispatcher
from ..dispatch.journal import StoredNode
from ..wire.client import BackendClient
from .stream import Expansion
from .titles import Titles, book_title_from_prompt, extract_titles, parse_titles

RETRY_TEMPERATURE = 0.7  # planning re-asks after an unusable reply (see _NodeRequest.temperature)

# (book, part, chapter path, chapter, 1-based index, title): a section title is known
SectionCallback = Callable[[str, str, str, str, int, str], None]
# (0-based index, title, book title): start the child planned from a committed title
ChildStart = Callable[[int, str, str | None], None]


class _NodeRequest:
    """One planning node's request to the Dispatcher: the body of each attempt, the check of each reply, and the
    value of a journaled answer. Its :class:`Expansion` follows every attempt's reply as it streams."""

    def __init__(self, planner: Planner, name: str, n: int, want_title: bool, exp: Expansion,
                 values: dict[str, Any]):
        self.planner = planner
        self.name = name  # the prompt template: book, part or chapter
        self.n = n
        self.want_title = want_title
        self.exp = exp
        self.values = values

    def temperature(self) -> float:
        """The job's temperature, raised to RETRY_TEMPERATURE once a reply was unusable: at temperature 0 a
        model answers a re-ask with the same reply (a small model repeating a title would fail every attempt),
        so a re-ask must be allowed to differ. Transient errors (connection, 5xx) keep the job's temperature."""
        p = self.planner.profile
        base = p.temperature if p.plan_temperature is None else p.plan_temperature
        if self.exp.unusable:
            return max(base, min(1.0, RETRY_TEMPERATURE + 0.1 * (self.exp.unusable - 1)))
        return base

    def build(self, client: BackendClient, attempt: int) -> dict[str, Any]:
        self.exp.new_attempt()  # called at the start of every attempt: the stream parser starts afresh
        p, s = self.planner.profile, self.planner.settings
        if p.planning == "list":
            return self._few_shot(client)
        note = f"Give exactly {self.n} distinct titles." if attempt > 1 else ""
        keep = self.exp.retry_note()
        if keep:  # a re-ask, or a rerun resuming a node whose first titles were committed before a kill
            note = f"{note} {keep}".strip()
        # The prompt asks for JSON only where the client will send the schema (it stops once a server refused it).
        text = render(self.name, self.planner.templates, json=client.structured, n=self.n, retry_note=note,
                      **self.values)
        return client.body(
            p.messages(text),
            max_tokens=s.plan_max_tokens,
            temperature=self.temperature(),
            schema=list_schema(self.n, self.want_title),
            sampling=p.sampling(),
        )

    def _few_shot(self, client: BackendClient) -> dict[str, Any]:
        """A few-shot plain-list request (profile planning "list"): one worked example, then this node's request.
        The list's length bounds max_tokens, so a model looping on one line stops early."""
        p, s = self.planner.profile, self.planner.settings
        kind = self.name
        book = book_phrase(self.values.get("book") or self.planner.fallback_title)
        title = self.values.get(kind, "") if kind != NodeKind.BOOK else ""
        ask = self.n + p.plan_extra
        return client.body(
            few_shot_messages(kind, ask, book, title, self.planner.templates, p.system),
            max_tokens=min(s.plan_max_tokens, 16 * ask + 48),
            temperature=self.temperature(),
            sampling=p.sampling(),
        )

    def validate(self, reply: Reply) -> Titles:
        # The last attempt (or, with the profile's bounded re-asks, the reply after them) takes the reply as well
        # as it can — weak titles, fewer titles — rather than lose the book or spend more requests.
        exp, p = self.exp, self.planner.profile
        strict = exp.attempts < self.planner.settings.attempts and (
            p.plan_reasks is None or exp.unusable < p.plan_reasks
        )
        offered_title, offered = extract_titles(reply.text)
        try:
            return parse_titles(
                reply.text, self.n, self.want_title, tuple(exp.committed), exp.title, exp.avoid, strict=strict,
                taken=frozenset(exp.taken - exp.norms),
                pool=tuple(exp.pool), pool_title=exp.pool_title,
            )
        except ValueError:
            exp.unusable += 1
            exp.pool.extend(offered)
            exp.pool_title = exp.pool_title or offered_title
            raise

    def restore(self, stored: StoredNode) -> Titles | None:
        value = stored.value
        if isinstance(value, dict) and isinstance(value.get("items"), list) and 1 <= len(value["items"]) <= self.n:
            # as accepted, fewer titles included (a node's last attempt may keep fewer than asked)
            return Titles(value.get("title"), tuple(str(x) for x in value["items"]))
        if value is None:  # a schema-1 journal: parse the stored reply, without touching this run's re-asks
            try:
                return parse_titles(stored.text, self.n, self.want_title, avoid=self.exp.avoid)
            except ValueError:
                return None
        return None


def _keep(titles: Titles) -> dict[str, Any]:
    return {"title": titles.title, "items": list(titles.items)}


class Planner:
    """Makes the outline through ``dispatcher``. Its journal, if it has one, is also where titles committed while a
    reply streams are recorded, and where a rerun finds them, so a node re-planned after a kill keeps the titles
    whose children (sections) already exist."""

    def __init__(self, dispatcher: Dispatcher, prompt: str, settings: Settings, emit: Callable[[Any], None],
                 templates: str | None = None, profile: Profile | None = None):
        self.d = dispatcher
        # How the model is asked (sampling, system message, JSON or few-shot lists); without one, the reference
        # profile at the job's temperature.
        self.profile = profile or replace(PROFILES["reference"], temperature=settings.temperature or 0.0)
        self.prompt = prompt
        self.fallback_title = book_title_from_prompt(prompt)
        self.taken: set[str] = {norm(self.fallback_title)}  # see Expansion.taken
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
        streaming. Strict mode never calls it: the caller writes from the returned outline.
        """
        return await _PlanRun(self, on_section).run()

    async def node(
        self, path: str, kind: NodeKind, label: str, n: int, want_title: bool, start_child: ChildStart | None = None,
        **values: Any,
    ) -> tuple[Titles, int]:
        """Plan one node (``kind`` is also its prompt template). Returns its titles and how many children were
        already started from its stream (or from the titles an earlier run had committed)."""
        journal = self.d.journal
        ancestors = [values.get(k) for k in ("book", "part", "chapter")]
        exp = Expansion(
            n, want_title, start_child, frozenset(norm(a) for a in ancestors if a),
            on_commit=partial(journal.commit_titles, path, label) if journal is not None else None,
            taken=self.taken if self.profile.distinct_outline else None,
        )
        request = _NodeRequest(self, kind, n, want_title, exp, values)
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
            on_delta=exp.on_delta if start_child is not None else None, restore=request.restore, keep=_keep,
        )
        if out.value is not None and self.profile.distinct_outline:
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

    async def run(self) -> Outline:
        if self.s.pipeline:
            await self._pipelined()
        else:
            await self._strict()
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
        )

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
        if s.pipeline and self.on_section is not None:
            stream = partial(self._start_section, book, part, cpath, chapter)
        got, started = await self.planner.node(
            cpath, NodeKind.CHAPTER, chapter, s.sections, False, stream,
            request=self.planner.prompt, book=book, part=part, chapter=chapter, index=ci + 1, count=s.chapters,
            siblings=before,
        )
        self.sections[(pi, ci)] = got.items
        if stream is not None:
            for si in range(started, len(got.items)):
                stream(si, got.items[si], None)
