"""Prompt -> Outline, one request per outline node.

Strict mode (``pipeline=False``, the reference run's order): the book node, then every part at once, then every
chapter at once, each level waiting for the previous one. Pipeline mode (default): a node's children are
requested the moment the node's own list is known, and a chapter's sections are handed to ``on_sections`` as
soon as its list arrives, so writing overlaps planning. Either way each reply must hold exactly N distinct titles:
too many are trimmed, too few or duplicates are asked again (as a retry).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import orjson

from .client import BackendClient, Reply
from .dispatch import Dispatcher
from .errors import PlanError
from .events import LevelPlanned
from .outline import Chapter, Outline, Part
from .prompts import list_schema, render


@dataclass(frozen=True)
class Titles:
    title: str | None
    items: tuple[str, ...]


_NUMBERED = re.compile(r"^\s*(?:\d+[.)]|[-*•+]|\(\d+\))\s+(.*\S)\s*$")
_TITLE_LINE = re.compile(r"^\s*(?:\*\*)?(?:book\s+)?title(?:\*\*)?\s*[:\-–]\s*(.+?)\s*$", re.I)
_PREFIX = re.compile(r"^(?:part|chapter|section)\s+[\dIVXLC]+\s*[:.\-–]\s*", re.I)


def clean_title(t: str) -> str:
    t = t.strip()
    t = re.sub(r"^#+\s*", "", t)
    t = t.strip("*_` ").strip()
    t = t.strip("\"'“”‘’").strip()
    t = _PREFIX.sub("", t).strip()
    t = t.rstrip(":").strip()
    return " ".join(t.split())


def norm(t: str) -> str:
    return re.sub(r"[^\w]+", " ", t.lower()).strip()


def parse_titles(text: str, n: int, want_title: bool) -> Titles:
    """Parse a planning reply (JSON, numbered, bulleted or plain lines). Raises ValueError when unusable."""
    title: str | None = None
    items: list[str] = []
    stripped = text.strip()
    data = None
    m = re.search(r"[\[{]", stripped)
    if m:
        candidate = stripped[m.start():]
        candidate = re.sub(r"```\s*$", "", candidate).strip()
        try:
            data = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            data = None
    if isinstance(data, dict):
        raw = data.get("items") or next((v for v in data.values() if isinstance(v, list)), [])
        items = [clean_title(str(x)) for x in raw if isinstance(x, str | int | float)]
        if isinstance(data.get("title"), str):
            title = clean_title(data["title"])
    elif isinstance(data, list):
        items = [clean_title(str(x)) for x in data if isinstance(x, str)]
    else:
        lines = [ln for ln in stripped.splitlines() if ln.strip() and not ln.strip().startswith("```")]
        numbered = [m.group(1) for ln in lines if (m := _NUMBERED.match(ln))]
        for ln in lines:
            tm = _TITLE_LINE.match(ln)
            if tm and title is None:
                title = clean_title(tm.group(1))
        if numbered:
            items = [clean_title(x) for x in numbered]
        else:
            items = [clean_title(ln) for ln in lines if not _TITLE_LINE.match(ln)]
    items = [x for x in items if x]
    if len(items) < n:
        raise ValueError(f"expected {n} titles, got {len(items)}")
    items = items[:n]
    seen: set[str] = set()
    for x in items:
        k = norm(x)
        if k in seen:
            raise ValueError(f"duplicate title {x!r}")
        seen.add(k)
    if want_title and not title:
        raise ValueError("no book title")
    return Titles(title, tuple(items))


class Planner:
    def __init__(self, dispatcher: Dispatcher, prompt: str, settings, emit, templates: str | None = None):
        self.d = dispatcher
        self.prompt = prompt
        self.s = settings
        self.emit = emit
        self.templates = templates
        self.level_requests = [0, 0, 0]
        self.t_titles_known: float | None = None

    def _request(self, name: str, n: int, want_title: bool, **values):
        def build(client: BackendClient, attempt: int) -> dict:
            use_json = client.json_schema_ok is not False
            note = ""
            if attempt > 1:
                note = f"Give exactly {n} distinct titles."
            text = render(name, self.templates, json=use_json, n=n, retry_note=note, **values)
            return client.body(
                [{"role": "user", "content": text}],
                max_tokens=self.s.plan_max_tokens,
                temperature=self.s.temperature,
                schema=list_schema(n, want_title) if use_json else None,
            )

        def validate(reply: Reply) -> Titles:
            return parse_titles(reply.text, n, want_title)

        return build, validate

    async def _node(self, path: str, kind: str, label: str, name: str, n: int, want_title: bool, **values) -> Titles:
        build, validate = self._request(name, n, want_title, **values)
        self.level_requests[len(path.split(".")) if path else 0] += 1
        out = await self.d.run(path, kind, label, build, validate, priority=(0, 0))
        if out.value is None:
            where = f"node {path!r} ({kind} {label!r})" if path else "the book node"
            raise PlanError(f"the outline could not be made: {where} failed {out.attempts} attempts: {out.reply.error}")
        return out.value

    async def plan(
        self, on_sections: Callable[[Outline | None, str, Part, Chapter, str], Awaitable[None] | None] | None = None
    ) -> Outline:
        """Make the outline. In pipeline mode ``on_sections(book, part_title, chapter_path, chapter)`` is called as
        soon as each chapter's section titles are known."""
        s = self.s
        root = await self._node("", "book", self.prompt, "book", s.parts, True, request=self.prompt)
        book = root.title or self.prompt
        parts = list(root.items)
        self.emit(LevelPlanned(1, len(parts), time.monotonic()))
        chapters: dict[int, tuple[str, ...]] = {}
        sections: dict[tuple[int, int], tuple[str, ...]] = {}

        async def plan_chapter(pi: int, ci: int) -> None:
            ch = chapters[pi]
            got = await self._node(
                f"{pi + 1}.{ci + 1}", "chapter", ch[ci], "chapter", s.sections, False,
                request=self.prompt, book=book, part=parts[pi], chapter=ch[ci], index=ci + 1, count=len(ch),
                siblings=[c for j, c in enumerate(ch) if j != ci],
            )
            sections[(pi, ci)] = got.items
            if on_sections is not None and s.pipeline:
                r = on_sections(book, parts[pi], f"{pi + 1}.{ci + 1}", ch[ci], got.items)
                if r is not None:
                    await r

        async def plan_part(pi: int, tg: anyio.abc.TaskGroup | None) -> None:
            got = await self._node(
                f"{pi + 1}", "part", parts[pi], "part", s.chapters, False,
                request=self.prompt, book=book, part=parts[pi], index=pi + 1, count=len(parts),
                siblings=[p for j, p in enumerate(parts) if j != pi],
            )
            chapters[pi] = got.items
            if tg is not None:  # pipeline: this part's chapters start now
                for ci in range(len(got.items)):
                    tg.start_soon(plan_chapter, pi, ci)

        if s.pipeline:
            async with anyio.create_task_group() as tg:
                for pi in range(len(parts)):
                    tg.start_soon(plan_part, pi, tg)
            self.emit(LevelPlanned(2, sum(len(c) for c in chapters.values()), time.monotonic()))
        else:
            async with anyio.create_task_group() as tg:
                for pi in range(len(parts)):
                    tg.start_soon(plan_part, pi, None)
            self.emit(LevelPlanned(2, sum(len(c) for c in chapters.values()), time.monotonic()))
            async with anyio.create_task_group() as tg:
                for pi in range(len(parts)):
                    for ci in range(len(chapters[pi])):
                        tg.start_soon(plan_chapter, pi, ci)
        self.t_titles_known = time.monotonic()
        self.emit(LevelPlanned(3, sum(len(v) for v in sections.values()), self.t_titles_known))
        return Outline(
            title=book,
            parts=tuple(
                Part(parts[pi], tuple(Chapter(chapters[pi][ci], sections[(pi, ci)]) for ci in range(len(chapters[pi]))))
                for pi in range(len(parts))
            ),
        )
