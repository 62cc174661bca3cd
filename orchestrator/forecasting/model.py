"""The forecast: an outline (or a shape) and the backends' step times -> tokens, words, A5 pages and seconds.

Seconds come from simulating the fleet request by request (:mod:`.simulate`), not from a formula: the book's
time is set by how the requests share the backends (planning first, sections as titles stream, a tail where the
last, longest sections run nearly alone), and only a simulation of the job's own scheduling gets that right.
Tokens and words come from :mod:`.lengths`, pages from :mod:`.pages`.

``whole_job_s`` spans what stats.json's does: from JobStarted (after discovering the backends) to the book on
disk before typesetting, i.e. the requests plus the job's own work around them: the clients and the first
request (``STARTUP_S``) and, after the last answer, the final metrics sample, assembling book.md and writing it
(``ASSEMBLE_S`` + ``ASSEMBLE_S_PER_SECTION`` x sections: a fraction of a second).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.config import Settings
from ..core.outline import Outline
from ..planning.brief import BRIEF_WORDS
from ..planning.titles import spare_count
from .lengths import LENGTHS, PLANNING, golden
from .pages import PAGES
from .simulate import SECTION, Node, simulate

__all__ = ["Forecast", "StepFit", "forecast"]

# The job's own work around the requests, measured by benchmarks/forecast_accuracy.py on this project's 2-core
# machine: JobStarted -> the first request 0.001-0.004 s (clients opened, fleet and sampler started); the last
# section answered -> book.md written: the final metrics sample, then joining the sections' texts (each is parsed
# and cut back as it lands: SectionText.body) and writing book.md and outline.json, 0.06 s for 1,536 sections
# (benchmarks/published_take.py "after last s", 0.02 model s at time-scale 3; it was 1.07 s before the bodies were
# made as sections landed).
STARTUP_S = 0.005
ASSEMBLE_S = 0.02
ASSEMBLE_S_PER_SECTION = 0.00003


@dataclass(frozen=True)
class StepFit:
    """One backend's decoding step: ``a_ms + b_ms x running streams`` wall milliseconds; ``cap`` is the job's
    in-flight cap for it; ``source`` says where the fit comes from ("ladder FILE", "probe", ...); ``streams``: the
    most streams it was measured at, where that is below the cap (a probe stopped at a small book's sections), so
    that a later job running more is not forecast on a line extrapolated past its points; None: up to the cap."""

    url: str
    a_ms: float
    b_ms: float
    cap: int
    source: str
    streams: int | None = None


@dataclass(frozen=True)
class Forecast:
    """What a job will make and how long it will take. Times in wall seconds; ``pages`` are A5 pages as our
    typesetter lays the book out; ``inputs`` is everything the figures rest on."""

    sections: int
    tokens: int
    words: int
    pages: int
    whole_job_s: float
    plan_s: float
    write_s: float
    per_backend: tuple[dict[str, Any], ...]  # {"url", "sections", "tokens", "busy_s"}
    inputs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """forecast.json (DESIGN: sections, tokens, pages, whole_job_s, per_backend, inputs; and more)."""
        return {
            "sections": self.sections,
            "tokens": self.tokens,
            "words": self.words,
            "pages": self.pages,
            "whole_job_s": round(self.whole_job_s, 2),
            "plan_s": round(self.plan_s, 2),
            "write_s": round(self.write_s, 2),
            "per_backend": [dict(b) for b in self.per_backend],
            "inputs": self.inputs,
        }


@dataclass(frozen=True)
class _Book:
    """The tree to forecast: chapters per part, each chapter's sections' words asked (None: settings.words)."""

    parts: tuple[tuple[tuple[int | None, ...], ...], ...]

    @classmethod
    def of(cls, outline: Outline | None, settings: Settings) -> _Book:
        if outline is None:
            chapter = (None,) * settings.sections
            return cls(((chapter,) * settings.chapters,) * settings.parts)
        return cls(tuple(
            tuple(tuple(c.words_of(i) for i in range(len(c.sections))) for c in p.chapters) for p in outline.parts
        ))

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.parts), sum(len(p) for p in self.parts), sum(len(c) for p in self.parts for c in p))


def forecast(outline: Outline | None, settings: Settings, fits: Sequence[StepFit], *, planned: bool = False,
             done: Collection[str] = ()) -> Forecast:
    """Forecast a job over the backends ``fits`` describe.

    ``outline`` None: the shape ``settings.parts x chapters x sections``, planning included. An outline: its
    sections (each at its own ``words``, else ``settings.words``); its planning is forecast too unless
    ``planned`` (``handbook write``: the outline exists). ``done``: paths of sections already written (the
    journal answers them): they cost no time and no tokens, but they are in the book, so they count in its pages.
    """
    if not fits:
        raise ValueError("a forecast needs the step time of at least one backend")
    book = _Book.of(outline, settings)
    req = _Requests.of(book, settings, done)
    nodes = req.nodes
    planning = not planned and req.todo > 0
    if planning:
        roots, pipeline = [req.root, *req.extra_roots], settings.pipeline
    else:  # the outline exists: every section can go at once (the Writer's order), no planning request
        nodes = tuple(n if n.level == SECTION else Node(n.level, 0, n.order) for n in nodes)
        roots, pipeline = [k for k, n in enumerate(nodes) if n.level == SECTION], False
    run = simulate(nodes, roots, [(f.a_ms, f.b_ms, f.cap) for f in fits], pipeline=pipeline)
    tail = ASSEMBLE_S + ASSEMBLE_S_PER_SECTION * req.sections
    plan_requests = sum(1 for n in nodes if n.level != SECTION) if planning else 0
    plan_tokens = sum(n.tokens for n in nodes if n.level != SECTION) if planning else 0
    parts, chapters, sections = book.shape
    write_s = (run.last_section_s - run.first_section_s
               if run.first_section_s is not None and run.last_section_s is not None else 0.0)
    inputs = {
        "model": "event simulation of the fleet (forecasting/simulate.py): each backend a continuous batch, a step "
                 "a_ms + b_ms x running, least-loaded placement, planning first, children as titles stream",
        "fits": [asdict(f) for f in fits],
        "shape": {"parts": parts, "chapters": chapters, "sections": sections, "to_write": req.todo,
                  "planned": not planning, "pipeline": pipeline},
        "words_per_section_asked": settings.words,
        "sections_with_own_words": sum(1 for p in book.parts for c in p for w in c if w is not None),
        "max_tokens": settings.max_tokens,
        "plan_max_tokens": settings.plan_max_tokens,
        "lengths": {**LENGTHS.describe(), "sections_at_max_tokens": req.cut, "section_tokens": req.section_tokens},
        "planning": {**PLANNING.describe(), "requests": plan_requests, "tokens": plan_tokens},
        "pages_model": PAGES.describe(),
        "overheads_s": {"startup": STARTUP_S, "after_writing": round(tail, 3),
                        "assemble_per_section": ASSEMBLE_S_PER_SECTION},
    }
    return Forecast(
        sections=sections,
        tokens=req.section_tokens + plan_tokens,
        words=round(req.words),
        pages=round(PAGES.pages(parts, chapters, sections, req.words)),
        whole_job_s=STARTUP_S + run.end_s + tail,
        plan_s=(STARTUP_S + run.titles_s) if planning else 0.0,
        write_s=write_s,
        per_backend=tuple(
            {"url": f.url, "sections": b.sections, "tokens": b.tokens, "busy_s": round(b.busy_s, 2)}
            for f, b in zip(fits, run.backends, strict=True)
        ),
        inputs=inputs,
    )


@dataclass(frozen=True)
class _Requests:
    """Every request of the job (planning nodes and the sections still to write) and the book's length."""

    nodes: tuple[Node, ...]
    root: int  # the book node
    extra_roots: tuple[int, ...]  # planning requests that start with it: the book's brief (--context outline)
    sections: int  # in the book
    todo: int  # to write (not done)
    section_tokens: int  # of those to write
    words: float  # of the whole book
    cut: int  # sections to write that reach max_tokens

    @classmethod
    def of(cls, book: _Book, settings: Settings, done: Collection[str]) -> _Requests:
        nodes: list[Node] = []
        words = 0.0
        cut = todo = tokens_todo = 0
        index = 0  # sections in outline order: the length quantile and the queue order
        chapter_nodes: list[int] = []
        part_nodes: list[int] = []
        for pi, part in enumerate(book.parts, 1):
            first_chapter = len(chapter_nodes)
            for ci, chapter in enumerate(part, 1):
                children: list[tuple[int, int]] = []  # (node, index of its title in the chapter's reply)
                for si, asked in enumerate(chapter, 1):
                    asked = asked or settings.words
                    tokens, written, capped = LENGTHS.section(asked, settings.max_tokens_for(asked), golden(index))
                    words += written
                    if f"{pi}.{ci}.{si}" not in done:
                        children.append((len(nodes), si - 1))
                        nodes.append(Node(SECTION, tokens, index))
                        todo += 1
                        tokens_todo += tokens
                        cut += capped
                    index += 1
                chapter_nodes.append(_plan_node(nodes, 2, len(chapter_nodes), children, len(chapter), settings))
            part_nodes.append(_plan_node(nodes, 1, pi - 1, _titled(chapter_nodes[first_chapter:]), len(part),
                                         settings))
        root = _plan_node(nodes, 0, 0, _titled(part_nodes), len(book.parts), settings)
        extra: tuple[int, ...] = ()
        if settings.context == "outline":
            # The brief: a planning request from t=0 with no children. At level 2 it is served as planning is and,
            # in strict mode, sections wait for it as for the chapters; in pipeline mode its wait is not modelled
            # (it ends long before the chapter lists: ~140 tokens against book, part and chapter replies in a row).
            nodes.append(Node(2, round(LENGTHS.tokens_per_word * BRIEF_WORDS), 0))
            extra = (len(nodes) - 1,)
        return cls(tuple(nodes), root, extra, index, todo, tokens_todo, words, cut)


def _titled(children: list[int]) -> list[tuple[int, int]]:
    return [(k, i) for i, k in enumerate(children)]


def _plan_node(nodes: list[Node], level: int, order: int, children: list[tuple[int, int]], titles: int,
               settings: Settings) -> int:
    """Add a planning node with ``titles`` titles; ``children`` are (node, index of its title), fewer than
    ``titles`` when some sections are done."""
    limit = settings.plan_max_tokens
    asked = titles + (spare_count(titles) if settings.distinct_titles and level > 0 else 0)  # the planner's spares
    tokens = PLANNING.reply_tokens(level, asked, limit)
    if settings.context == "outline" and level == 2:  # a section's request names its whole chapter: the list's end
        offsets = tuple(tokens for _ in children)
    else:
        offsets = tuple(PLANNING.title_done(level, i, limit) for _, i in children)
    nodes.append(Node(level, tokens, order, tuple(k for k, _ in children), offsets))
    return len(nodes) - 1
